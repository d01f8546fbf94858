"""Packed documents: several documents in one row of tokens, each attended to as a sequence of its own.

A packed batch (torchtune's PackedDataset, attention-gym's document mask) carries per-token document ids
(B, T); a new document starts wherever the id changes along a row (and at every row's start). Attention must
stay inside each document, and positions restart at each document's first token. For every kernel that
declares `supports_packing`, that is *defined* as the kernel run on each document alone: full attention gets
the block-diagonal (document) mask, local attention and the sparse / axial patterns their windows and patterns
inside each document at the document's own positions, linear attention its prefix sums restarted at each
document's start (its state reset), RoPE, ALiBi and T5 the positions and distances inside the document.

So MultiHeadAttention lays the packed tokens out as a batch of documents (N documents, each padded to the
longest, L tokens: the varlen / cu_seqlens layout of FlashAttention), runs the kernel on it with the padding
as key padding, and scatters the outputs back. The cost is each kernel's own on the documents (at most O(N L^2)
for full attention, no (T, T) mask), and a padded key changes no real token's output: causal queries never
see later tokens, bidirectional ones are masked from them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedDocuments:
    """Where the documents of a packed batch lie. Build it with `from_ids`.

    index: (N, L) the flat token index (into B * T) of each document's tokens; past a document's end it repeats
        the document's first token (a placeholder, masked as padding).
    padding: (N, L) bool, True past a document's end.
    positions: (B, T) each token's position inside its document (0 at its first token).
    document_of_token: (B * T,) which of the N documents each token belongs to.
    shape: (B, T).
    """

    index: torch.Tensor
    padding: torch.Tensor
    positions: torch.Tensor
    document_of_token: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def from_ids(cls, document_ids: torch.Tensor) -> PackedDocuments:
        """(B, T) integer document ids -> the layout; a new document starts where the id changes along a row."""
        if document_ids.ndim != 2 or document_ids.is_floating_point() or document_ids.is_complex():
            raise ValueError(
                f"document_ids must be an integer tensor (batch, tokens), got {tuple(document_ids.shape)} "
                f"{document_ids.dtype}"
            )
        batch, length = document_ids.shape
        starts = torch.ones_like(document_ids, dtype=torch.bool)
        starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
        starts = starts.flatten()
        first = starts.nonzero().squeeze(1)  # (N,) flat index of each document's first token
        ends = torch.cat([first[1:], first.new_tensor([batch * length])])
        lengths = ends - first
        longest = int(lengths.max())
        offsets = torch.arange(longest, device=first.device)
        padding = offsets >= lengths[:, None]  # (N, L)
        index = torch.where(padding, first[:, None], first[:, None] + offsets)
        document_of_token = starts.long().cumsum(0) - 1  # (B * T,)
        positions = torch.arange(batch * length, device=first.device) - first[document_of_token]
        return cls(index, padding, positions.view(batch, length), document_of_token, (batch, length))

    @property
    def num_documents(self) -> int:
        return self.index.shape[0]

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """Heads (B, H, T, D) -> the documents as a batch (N, H, L, D)."""
        batch, heads, length, dim = x.shape
        tokens = x.transpose(1, 2).reshape(batch * length, heads, dim)
        return tokens[self.index].transpose(1, 2)  # (N, L, H, D) -> (N, H, L, D)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """The documents (N, H, L, D) -> heads (B, H, T, D). Documents are numbered in token order, so their real
        tokens, read in order, are the packed tokens in order."""
        documents, heads, longest, dim = x.shape
        batch, length = self.shape
        tokens = x.transpose(1, 2).reshape(documents * longest, heads, dim)[~self.padding.flatten()]
        return tokens.view(batch, length, heads, dim).transpose(1, 2)

    def key_padding_mask(self, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor | None:
        """(N, L) bool: past a document's end, or padding of the packed batch ((B, T), True = padding); None
        when no document is padded at all."""
        mask = self.padding
        if key_padding_mask is not None:
            mask = mask | key_padding_mask.bool().flatten()[self.index]
        return mask if bool(mask.any()) else None

    def mean(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Per-document mean of token features (B, T, C) -> (N, C), leaving out padding ((B, T), True = pad)."""
        features = x.reshape(-1, x.shape[-1])
        keep = torch.ones(features.shape[0], 1, dtype=x.dtype, device=x.device)
        if key_padding_mask is not None:
            keep = (~key_padding_mask.bool()).reshape(-1, 1).to(x.dtype)
        sums = features.new_zeros(self.num_documents, x.shape[-1]).index_add(0, self.document_of_token, features * keep)
        counts = keep.new_zeros(self.num_documents, 1).index_add(0, self.document_of_token, keep)
        return sums / counts.clamp(min=1.0)
