"""Per-token generation time of zoo's GPT at a long context vs a short one, with the decoding caches
(KV cache for full/RoPE, rolling window for local, recurrent state for linear) and without any cache.

    python experiments/kv_cache_benchmark.py                      # GPT-2 small shape, contexts 128, 1024, 8192
    python experiments/kv_cache_benchmark.py --n-layer 4 --n-head 4 --n-embd 128 --vocab-size 65

Per-token time: the prompt of C tokens fills the decoding caches (untimed), then n greedy decoding steps at contexts
C .. C + n - 1 are timed one by one; a round's figure is their median, the cell's the median of `--repeats` rounds,
every (variant, context) once per round (interleaved). Without cache: (time of generate(prompt, n + 1) - time of
generate(prompt, 1)) / n. Weights are random (speed does not depend on them).
Targets: per-token time at context 1024 <= 1.5x that at 128 (every variant); for the variants whose decoding state
does not grow with the context (local's rolling window, linear's recurrent state), 8192 <= 1.1x 128 as well.
The cache-less reference (full attention, every step a forward over the whole context) is timed up to
--uncached-max-context only: at 8192 one step is a prefill.
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=12)
    parser.add_argument("--n-head", type=int, default=12)
    parser.add_argument("--n-embd", type=int, default=768)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024, 8192])
    parser.add_argument("--new-tokens", type=int, default=32, help="timed decoding steps per measurement")
    parser.add_argument("--uncached-tokens", type=int, default=4, help="timed steps without cache (slow)")
    parser.add_argument("--uncached-max-context", type=int, default=1024, help="longest context timed without cache")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    if len(set(args.contexts)) < 2 or min(args.contexts) < 1:
        parser.error(f"--contexts needs at least two different positive lengths to compare, got {args.contexts}")
    return args


def seconds_per_token(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool) -> float:
    """generate's time per token beyond the first (its prompt's prefill cancels): the cache-less reference."""

    def run(n: int) -> float:
        start = time.perf_counter()
        model.generate(prompt, n, temperature=0.0, use_cache=use_cache)
        return time.perf_counter() - start

    # The fastest of three of each: a difference of two single timings can go negative on a loaded machine when
    # the steps are short (a pause in the shorter run outweighs the extra tokens of the longer one).
    return (min(run(new_tokens + 1) for _ in range(3)) - min(run(1) for _ in range(3))) / new_tokens


def decoding_step_seconds(model: GPT, prompt: torch.Tensor, new_tokens: int) -> float:
    """Median time of one cached greedy decoding step, at contexts len(prompt) .. len(prompt) + new_tokens - 1: the
    prompt goes through the caches untimed (at 8192 tokens its prefill's own noise would swamp a difference of
    two generate() calls), then each step is timed alone: the step generate() takes inside the block."""
    caches = model.new_caches()
    token = model.forward_head(model.forward_features(prompt, caches)[:, -1]).argmax(-1, keepdim=True)
    steps = []
    for _ in range(new_tokens):
        start = time.perf_counter()
        token = model.forward_head(model.forward_features(token, caches)[:, -1]).argmax(-1, keepdim=True)
        steps.append(time.perf_counter() - start)
    return statistics.median(steps)


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    block_size = max(args.contexts) + args.new_tokens + 1
    models, prompts = {}, {c: torch.randint(0, args.vocab_size, (1, c)) for c in args.contexts}
    for name in args.variants:
        config = GPTConfig(
            vocab_size=args.vocab_size, block_size=block_size, n_layer=args.n_layer, n_head=args.n_head,
            n_embd=args.n_embd, attention=VARIANTS[name],
        )  # fmt: skip
        models[name] = GPT(config).eval()
        decoding_step_seconds(models[name], prompts[min(args.contexts)], 2)  # warm-up
    # Every (variant, context) once per round, rounds repeated: this machine's speed drifts over minutes, and
    # interleaving spreads that drift over every cell instead of putting it between the contexts of one variant.
    samples: dict[tuple[str, int], list[float]] = {(n, c): [] for n in args.variants for c in args.contexts}
    for _ in range(args.repeats):
        for name, context in samples:
            samples[name, context].append(decoding_step_seconds(models[name], prompts[context], args.new_tokens))
    results: dict[str, dict[str, float]] = {name: {} for name in args.variants}
    for (name, context), times in samples.items():
        results[name][f"cached@{context}"] = statistics.median(times)
        if name == "full" and args.uncached_tokens > 0 and context <= args.uncached_max_context:
            results[name][f"uncached@{context}"] = seconds_per_token(models[name], prompts[context],
                                                                     args.uncached_tokens, False)  # fmt: skip
        print(f"{name:<7} context {context:>5}: {1000 * results[name][f'cached@{context}']:7.2f} ms/token", flush=True)

    short = min(args.contexts)
    params = GPT(GPTConfig(vocab_size=args.vocab_size, block_size=block_size, n_layer=args.n_layer,
                           n_head=args.n_head, n_embd=args.n_embd)).num_parameters()  # fmt: skip
    print(
        f"\nGPT n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} vocab={args.vocab_size} "
        f"({params / 1e6:.1f}M parameters), batch 1, fp32, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    longer = [c for c in args.contexts if c != short]
    header = "".join(f"{f'ms@{c}':>10}" for c in args.contexts) + "".join(f"{f'{c}/{short}':>10}" for c in longer)
    print(f"{'variant':<8}{header}")
    for name, row in results.items():
        times = "".join(f"{1000 * row[f'cached@{c}']:>10.2f}" for c in args.contexts)
        ratios = "".join(f"{row[f'cached@{c}'] / row[f'cached@{short}']:>9.2f}x" for c in longer)
        print(f"{name:<8}{times}{ratios}")
    uncached = sorted(c for c in args.contexts if f"uncached@{c}" in results.get("full", {}))
    if len(uncached) > 1:
        full, first, last = results["full"], uncached[0], uncached[-1]
        print(
            f"\nwithout cache (full attention): {1000 * full[f'uncached@{first}']:.1f} ms/token at {first}, "
            f"{1000 * full[f'uncached@{last}']:.1f} at {last}: the cache is "
            f"{full[f'uncached@{last}'] / full[f'cached@{last}']:.0f}x faster at {last}"
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
