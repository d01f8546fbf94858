"""experiments/modern_decoders.py in its smallest form: each subcommand prints its markdown table, the checkpointed
step saves fewer activations than the plain one, LoRA's trainable count is r (in + out) per adapted projection."""

from __future__ import annotations

import sys

from experiments import modern_decoders

SMALL = ["--block-size", "32", "--batch", "1", "--n-layer", "2", "--n-embd", "48"]


def table(out: str) -> list[list[str]]:
    return [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ") and "---" not in line]


def test_checkpointing_rows_save_fewer_activations_with_checkpointing(monkeypatch, capsys) -> None:
    monkeypatch.setattr(modern_decoders, "ALLOCATORS", {"glibc default": {}})  # one allocator: two processes
    monkeypatch.setattr(sys, "argv", ["modern_decoders.py", "checkpointing", *SMALL])
    modern_decoders.main()
    out = capsys.readouterr().out
    header, plain, checkpointed = table(out)
    assert header[0] == "setting (block 32, batch 1)" and header[2] == "activations saved (MiB)"
    assert plain[:2] == ["plain", "glibc default"] and checkpointed[:2] == ["checkpointing=true", "glibc default"]
    assert 0 < float(checkpointed[2]) < float(plain[2]) / 2
    assert "glibc default: activations " in out and "x lower, peak RSS growth" in out


def test_lora_rows_count_rank_times_in_plus_out_per_projection(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["modern_decoders.py", "lora", *SMALL, "--steps", "2"])
    modern_decoders.main()
    header, full, adapted = table(capsys.readouterr().out)
    assert header == ["setting (block 32, batch 1)", "trainable parameters", "of all", "step (s)"]
    total = sum(p.numel() for p in modern_decoders.llama(32, n_layer=2, n_embd=48).parameters())
    per_block = 8 * ((48 + 144) + (48 + 48) + 2 * (48 + 128) + (128 + 48))  # in_proj, out_proj, gate and fc1, fc2
    assert full[:2] == ["full fine-tuning", f"{total:,}"]
    assert adapted[:2] == ["LoRA rank 8 (attention + MLP)", f"{2 * per_block:,}"]
    assert float(full[3]) > 0 and float(adapted[3]) > 0
