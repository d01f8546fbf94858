"""Per-token generation time of zoo's GPT at a long context vs a short one, with the decoding caches
(KV cache for full/RoPE, rolling window for local, recurrent state for linear) and without any cache.

    python experiments/kv_cache_benchmark.py                      # GPT-2 small shape, contexts 128 and 1024
    python experiments/kv_cache_benchmark.py --n-layer 4 --n-head 4 --n-embd 128 --vocab-size 65

Per-token time = (time of generate(prompt, n + 1) - time of generate(prompt, 1)) / n: the prefill of the
prompt and the first token cancel, what is left is n decoding steps at contexts from C to C + n - 1.
Weights are random (speed does not depend on them); decoding is greedy; medians of `--repeats`.
Target: per-token time at context 1024 <= 1.5x that at 128.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import datetime, timezone

import torch

from zoo.models.gpt import GPT, GPTConfig

VARIANTS = {
    "full": {"variant": "full"},
    "rope": {"variant": "full", "rope": True},
    "local": {"variant": "local", "window": 256},
    "linear": {"variant": "linear"},
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--new-tokens", type=int, default=32, help="timed decoding steps per measurement")
    parser.add_argument("--uncached-tokens", type=int, default=4, help="timed steps without cache (slow)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=str, default=None)
    return parser.parse_args()


def seconds_per_token(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    def run(n: int) -> float:
        start = time.perf_counter()
        model.generate(prompt, n, temperature=0.0, use_cache=use_cache)
        return time.perf_counter() - start

    return (run(new_tokens + 1) - run(1)) / new_tokens


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    block_size = max(args.contexts) + args.new_tokens + 1
    results: dict[str, dict[str, float]] = {}
    for name in args.variants:
        config = GPTConfig(
            vocab_size=args.vocab_size, block_size=block_size, n_layer=args.n_layer, n_head=args.n_head,
            n_embd=args.n_embd, attention=VARIANTS[name],
        )  # fmt: skip
        model = GPT(config).eval()
        results[name] = {}
        for context in args.contexts:
            prompt = torch.randint(0, args.vocab_size, (1, context))
            model.generate(prompt, 2, temperature=0.0)  # warm-up
            cached = [seconds_per_token(model, prompt, args.new_tokens, True) for _ in range(args.repeats)]
            results[name][f"cached@{context}"] = statistics.median(cached)
            if name == "full" and args.uncached_tokens > 0:
                uncached = seconds_per_token(model, prompt, args.uncached_tokens, False)
                results[name][f"uncached@{context}"] = uncached
            print(
                f"{name:<7} context {context:>5}: {1000 * results[name][f'cached@{context}']:7.2f} ms/token", flush=True
            )

    short, long = min(args.contexts), max(args.contexts)
    params = GPT(GPTConfig(vocab_size=args.vocab_size, block_size=block_size, n_layer=args.n_layer,
                           n_head=args.n_head, n_embd=args.n_embd)).num_parameters()  # fmt: skip
    print(
        f"\nGPT n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} vocab={args.vocab_size} "
        f"({params / 1e6:.1f}M parameters), batch 1, fp32, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    header = "".join(f"{f'ms@{c}':>10}" for c in args.contexts)
    print(f"{'variant':<8}{header}{f'{long}/{short}':>10}")
    for name, row in results.items():
        times = "".join(f"{1000 * row[f'cached@{c}']:>10.2f}" for c in args.contexts)
        print(f"{name:<8}{times}{row[f'cached@{long}'] / row[f'cached@{short}']:>9.2f}x")
    if "full" in results and f"uncached@{long}" in results["full"]:
        full = results["full"]
        print(
            f"\nwithout cache (full attention): {1000 * full[f'uncached@{short}']:.1f} ms/token at {short}, "
            f"{1000 * full[f'uncached@{long}']:.1f} at {long}: the cache is "
            f"{full[f'uncached@{long}'] / full[f'cached@{long}']:.0f}x faster at {long}"
        )
    if args.json:
        record = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "args": vars(args),
            "seconds_per_token": results,
        }
        with open(args.json, "w") as handle:
            json.dump(record, handle, indent=1)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
