"""model=llama (the GPT family with RMSNorm, SwiGLU, no biases, RoPE, untied head) trains from the command line
on the embedded default corpus and on tiny-shakespeare, with any attention variant."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from tests.helpers import run_in_process, tiny_text

TINY_LLAMA = ["model=llama", "model.net.n_layer=1", "model.net.n_head=2", "model.net.n_embd=16",
              "data.block_size=16", "model.sample.max_new_tokens=4", "data.eval_batches=1", "data.batch_size=4",
              "print_config=false"]  # fmt: skip


@pytest.mark.parametrize(
    "extra",
    [[], ["data=shakespeare", "attention=local", "attention.window=8", "attention.kv_heads=1"]],
    ids=["default-data", "shakespeare-local-gqa"],
)
def test_llama_preset_trains_one_batch(extra, tmp_path, capsys) -> None:
    text = tiny_text(tmp_path / "input.txt")
    data = [f"data.path={text}"] if "data=shakespeare" in extra else []
    args = [*TINY_LLAMA, *extra, *data, "debug=fdr", f"hydra.run.dir={tmp_path / 'run'}",
            f"paths.data_dir={tmp_path / 'data'}"]  # fmt: skip
    code, out, err = run_in_process(args, capsys)
    assert code == 0, (out + err)[-4000:]
    cfg = OmegaConf.load(tmp_path / "run" / ".hydra" / "config.yaml")
    net = cfg.model.net
    assert (net.norm, net.mlp, net.bias, net.tie_weights, cfg.attention.rope) == (
        "rmsnorm",
        "swiglu",
        False,
        False,
        True,
    )
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics and all(value == value for value in metrics.values()), metrics
