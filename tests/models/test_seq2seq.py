"""The shared search on a model whose next-token distributions are written down: the length penalty decides
which finished hypothesis wins, as fairseq's log p / length ** length_penalty says."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from zoo.models.seq2seq import Seq2SeqModel, beam_search, greedy_decode

PAD, BOS, EOS, A, B = range(5)
# next-token probabilities after each prefix (BOS first); missing tokens have probability 0
TABLE = {
    (BOS,): {EOS: 0.4, A: 0.5, B: 0.1},
    (BOS, A): {EOS: 0.6, A: 0.3, B: 0.1},
    (BOS, B): {EOS: 0.9, A: 0.05, B: 0.05},
}
UNIFORM = {EOS: 0.5, A: 0.25, B: 0.25}


class TableModel:
    """A Seq2SeqModel without parameters: p(next | prefix) from TABLE; its state is the number of steps."""

    config = SimpleNamespace(pad_id=PAD, bos_id=BOS, eos_id=EOS, max_length=32)

    def padding_mask(self, src: torch.Tensor) -> torch.Tensor:
        return src == PAD

    def __call__(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.decode_step(tgt[:, : t + 1], None) for t in range(tgt.shape[1])], dim=1)

    def start_decoding(self, src: torch.Tensor, repeats: int = 1, use_cache: bool = True):
        return SimpleNamespace(reorder=lambda indices: None)

    def decode_step(self, tokens: torch.Tensor, state) -> torch.Tensor:
        rows = []
        for prefix in tokens.tolist():
            probs = torch.full((5,), 1e-30, dtype=torch.float64)
            for token, p in TABLE.get(tuple(prefix), UNIFORM).items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows)

    def cross_attention_weights(self, src: torch.Tensor, tgt: torch.Tensor) -> list[torch.Tensor]:
        return []


def test_the_length_penalty_changes_which_hypothesis_wins() -> None:
    model, src = TableModel(), torch.tensor([[3, 4, 3]])
    assert isinstance(model, Seq2SeqModel)
    # "" ends at once: log 0.4 = -0.92 over 1 token; "a" then EOS: log 0.5 + log 0.6 = -1.20 over 2 tokens.
    options = dict(beam_size=2, max_len_a=0.0, max_len_b=5, return_scores=True)
    (short, short_logp), = beam_search(model, src, length_penalty=0.0, **options)  # fmt: skip
    (long, long_logp), = beam_search(model, src, length_penalty=1.0, **options)  # fmt: skip
    assert short == [] and math.isclose(short_logp, math.log(0.4), rel_tol=1e-6)
    assert long == [A] and math.isclose(long_logp, math.log(0.5) + math.log(0.6), rel_tol=1e-6)
    assert greedy_decode(model, src, max_len_a=0.0, max_len_b=5) == [[A]]  # greedy takes a (0.5), then EOS (0.6)
