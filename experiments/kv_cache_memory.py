"""KV-cache memory per token of zoo's GPT with grouped-query attention: kv_heads = 1 (multi-query), 2 and
num_heads (plain multi-head), read off the caches themselves after a prefill.

    python experiments/kv_cache_memory.py                 # the tiny-shakespeare GPT: 4 layers, 4 heads, 128 dims
    python experiments/kv_cache_memory.py --n-layer 12 --n-head 12 --n-embd 768 --kv-heads 1 2 4 12

Bytes per token = the bytes of every layer's cached keys and values up to the cache offset (fp32), divided by
the tokens cached. Expected: 2 (keys and values) x n_layer x kv_heads x head_dim x 4 bytes; the script checks
that the measured figure equals it and that the logits do not depend on whether the cache is used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from zoo.models.gpt import GPT, GPTConfig

RESULTS = Path(__file__).resolve().parent / "results" / "kv_cache_memory.md"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=65)
    parser.add_argument("--kv-heads", type=int, nargs="+", default=None, help="default: 1, 2 and n_head")
    parser.add_argument("--context", type=int, default=256, help="tokens prefilled into the caches")
    parser.add_argument("--output", type=Path, default=RESULTS, help="markdown table ('-': print only)")
    return parser.parse_args()


def cache_bytes(caches: list[dict]) -> int:
    """Bytes of the filled part of every layer's self-attention keys and values."""
    total = 0
    for cache in caches:
        state = cache["self"]
        for tensor in (state.keys, state.values):
            total += tensor[:, :, : state.offset].numel() * tensor.element_size()
    return total


def main() -> None:
    args = parse_args()
    torch.manual_seed(0)
    kv_choices = args.kv_heads or sorted({1, 2, args.n_head})
    head_dim = args.n_embd // args.n_head
    idx = torch.randint(0, args.vocab_size, (1, args.context))
    rows = []
    for kv_heads in kv_choices:
        config = GPTConfig(
            vocab_size=args.vocab_size, block_size=args.context, n_layer=args.n_layer, n_head=args.n_head,
            n_embd=args.n_embd, attention={"rope": True, "kv_heads": kv_heads},
        )  # fmt: skip
        model = GPT(config).eval()
        caches = model.new_caches()
        with torch.inference_mode():
            cached = model(idx, caches)
            torch.testing.assert_close(cached, model(idx), atol=1e-5, rtol=1e-5)
        per_token = cache_bytes(caches) / args.context
        expected = 2 * args.n_layer * kv_heads * head_dim * 4
        assert per_token == expected, (per_token, expected)
        rows.append((kv_heads, per_token, model.num_parameters()))
    baseline = {kv_heads: per_token for kv_heads, per_token, _ in rows}.get(args.n_head)  # multi-head
    command = " ".join(["python experiments/kv_cache_memory.py", *sys.argv[1:]])
    lines = [
        f"GPT n_layer={args.n_layer} n_head={args.n_head} n_embd={args.n_embd} (head_dim {head_dim}), RoPE, fp32, "
        f"context {args.context}: `{command}`",
        "",
        "| kv_heads | KV cache bytes per token | vs multi-head | parameters |",
        "|---|---|---|---|",
    ]
    for kv_heads, per_token, params in rows:
        ratio = f"{per_token / baseline:.3f}x" if baseline else "-"
        lines.append(f"| {kv_heads} | {per_token:,.0f} | {ratio} | {params:,} |")
    text = "\n".join(lines)
    print(text)
    if str(args.output) != "-":
        args.output.write_text(f"# KV-cache memory per token (grouped-query attention)\n\n{text}\n")
        print(f"\nwritten to {args.output}")


if __name__ == "__main__":
    main()
