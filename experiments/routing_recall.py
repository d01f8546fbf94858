"""Why routing attention learns nothing on MQAR: which keys its k-means clusters let each position see.

Associative recall needs two hops (Zoology, Olsson et al.'s induction heads): in one layer a value token reads
the key just before it, in the next the query reads the value whose key matches its own token. Routing attention
lets a position see only the keys of its own cluster (zoo/attention/routing.py). For a trained GPT with routing
attention on MQAR, this script counts, over the scored queries of freshly generated examples, how often each
hop is allowed by the clusters at all:

    value -> its key      in layer 1: is the answer value's key (one position earlier) visible from the value?
    query -> its value    in the last layer: is the answer value's position visible from the query?

and how many keys a position sees on average. Prints a markdown table, one row per checkpoint.

    python experiments/routing_recall.py outputs/.../routing-seed0/checkpoints/last.ckpt [more.ckpt ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zoo.attention.routing import RoutingAttention  # noqa: E402
from zoo.data.mqar import IGNORE, generate_mqar  # noqa: E402
from zoo.export import load  # noqa: E402


def visibility(model: torch.nn.Module, inputs: torch.Tensor) -> list[torch.Tensor]:
    """Per routing layer, in order, which keys each query may see: bool (B, H, n, n), from the kernel's own
    weights (need_weights: the dense form of the same mask) under the model's forward."""
    kernels = [module for module in model.modules() if isinstance(module, RoutingAttention)]
    if not kernels:
        raise ValueError("this model has no routing attention (attention=routing); valid: a model trained with it")
    seen: list[torch.Tensor] = []

    def keep(kernel, args, kwargs, _output):  # the kernel's call (q, k, v, AttentionCall), again with weights
        q, k, v, call = args
        _, weights = kernel.forward(q, k, v, call.replace(need_weights=True, dropout_p=0.0))
        seen.append(weights > 0)

    hooks = [kernel.register_forward_hook(keep, with_kwargs=True) for kernel in kernels]
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def answer_positions(inputs: torch.Tensor, targets: torch.Tensor, pairs: int) -> tuple[torch.Tensor, ...]:
    """(example, query position, answer value position) of every scored query: the value sits right after the
    context's copy of the query's key (keys are distinct within a sequence)."""
    example, query = (targets != IGNORE).nonzero(as_tuple=True)
    context_keys = inputs[example, : 2 * pairs : 2]  # (queries, pairs)
    slot = (context_keys == inputs[example, query][:, None]).float().argmax(dim=1)
    return example, query, 2 * slot + 1


def measure(checkpoint: Path, pairs: int, examples: int, seed: int) -> dict:
    """The counts for one checkpoint, on MQAR sequences of its block size and vocabulary (its data settings are
    not in the checkpoint; the number of pairs is given)."""
    model = load(checkpoint)
    config = model.config
    if config.family != "gpt":
        raise ValueError(f"{str(checkpoint)!r} holds a model={config.family}; valid: a checkpoint of model=gpt on MQAR")
    inputs, targets = generate_mqar(examples, config.block_size, pairs, config.vocab_size, seed=seed)
    seen = visibility(model, inputs)
    first, last = seen[0], seen[-1]  # one layer: both hops in it
    example, query, value = answer_positions(inputs, targets, pairs)
    return {
        "checkpoint": str(checkpoint),
        "queries": len(query),
        "value sees its key (layer 1)": first[example, :, value, value - 1].float().mean().item(),
        "query sees its value (last layer)": last[example, :, query, value].float().mean().item(),
        "keys seen per position": torch.stack([mask.float().sum(-1).mean() for mask in (first, last)]).mean().item(),
        "positions": inputs.shape[1],
    }


def positive(text: str) -> int:
    """An argparse type: a positive int, else argparse's one-line usage error."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoints of model=gpt attention=routing on MQAR")
    parser.add_argument("--pairs", type=positive, default=4, help="key-value pairs per sequence (data.num_kv_pairs)")
    parser.add_argument("--examples", type=positive, default=200, help="MQAR examples generated for the count")
    parser.add_argument("--seed", type=int, default=12345, help="the generator's seed (not a training split's)")
    args = parser.parse_args(argv)
    rows = [measure(path, args.pairs, args.examples, args.seed) for path in args.checkpoints]
    lines = [
        "| checkpoint | queries | value sees its key (layer 1) | query sees its value (last layer) "
        "| keys seen / position |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['checkpoint']} | {row['queries']} | {row['value sees its key (layer 1)']:.3f} | "
            f"{row['query sees its value (last layer)']:.3f} | {row['keys seen per position']:.1f} |"
        )
    lengths = sorted({row["positions"] for row in rows})
    lines.append("")
    lines.append(
        "Keys seen / position: the mean over positions and layers; full causal attention sees (n + 1) / 2 = "
        + ", ".join(f"{(n + 1) / 2:.1f} (n={n})" for n in lengths)
        + "."
    )
    table = "\n".join(lines)
    print(table)
    return table


def cli(argv: list[str] | None = None) -> None:
    """main() from the command line: bad input (a missing checkpoint, one without routing, too many pairs for its
    block) ends in its one-line error instead of a traceback."""
    try:
        main(argv)
    except ValueError as error:  # zoo's CheckpointError and DataError are ValueErrors
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    cli()
