"""Attention sinks (StreamingLLM, Xiao et al. 2023, Figure 3's shape): perplexity of a character GPT trained at
block B with full causal attention and RoPE, evaluated on tiny-shakespeare's val split at 1x, 4x and 16x B with
full attention, a sliding window of B, and the same window with the first s tokens kept (attention.sink_tokens).

    python experiments/attention_sinks.py                       # 4 layers, 128 dims, block 64, 600 steps
    python experiments/attention_sinks.py --steps 2000 --sinks 4

Positions are the tokens' own (zoo rotates keys before caching): past B the sinks sit farther than any distance
seen in training, unlike StreamingLLM's in-cache positions. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.data.tokenizers import train_tokenizer  # noqa: E402
from zoo.models.gpt import GPT, GPTConfig  # noqa: E402

DATA = Path("/work/shared/data/tinyshakespeare/input.txt")  # --data elsewhere


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--sinks", type=int, default=4)
    parser.add_argument("--eval-tokens", type=int, default=8192, help="val tokens scored per setting")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    text = args.data.read_text()
    tokenizer = train_tokenizer("char", [[text]])
    ids = torch.tensor(tokenizer.encode(text, add_special_tokens=False).ids)
    split = int(0.9 * len(ids))
    train, val = ids[:split], ids[split:]
    block = args.block_size
    config = dict(vocab_size=tokenizer.get_vocab_size(), n_layer=4, n_head=4, n_embd=128, bias=False)
    model = GPT(GPTConfig(block_size=block, attention={"rope": True}, **config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99))
    start = time.perf_counter()
    for step in range(args.steps):
        rows = torch.randint(0, len(train) - block - 1, (12,))
        x = torch.stack([train[r : r + block] for r in rows])
        y = torch.stack([train[r + 1 : r + block + 1] for r in rows])
        lr = 1e-3 * min(1.0, (step + 1) / 100) * (0.55 + 0.45 * math.cos(math.pi * step / args.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trained {args.steps} steps at block {block} in {time.perf_counter() - start:.0f} s, last loss {loss:.3f}")
    settings = {
        "full": {"rope": True},
        f"window {block}": {"rope": True, "variant": "local", "window": block},
        f"window {block} + {args.sinks} sinks": {"rope": True, "variant": "local", "window": block,
                                                 "sink_tokens": args.sinks},
    }  # fmt: skip
    lengths = [block, 4 * block, 16 * block]
    print(f"\n| attention (trained: full, block {block}) | " + " | ".join(f"ppl at {n}" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    state = model.state_dict()
    for name, attention in settings.items():
        cells = []
        for length in lengths:
            evaluator = GPT(GPTConfig(block_size=length, attention=attention, **config)).eval()
            evaluator.load_state_dict(state)
            losses = []
            with torch.no_grad():
                for begin in range(0, min(args.eval_tokens, len(val) - length - 1), length):
                    x, y = val[begin : begin + length][None], val[begin + 1 : begin + length + 1][None]
                    losses.append(F.cross_entropy(evaluator(x)[0], y[0]))
            cells.append(f"{math.exp(torch.stack(losses).mean()):.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
