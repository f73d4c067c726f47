"""The varlen rows one attention call attends: what `layout.read` (and the shared-prompt layout) hand the kernels.

Data (and `cu_seqlens`, the varlen offsets of lengths), imported by every reader (`layout.py`, `cached.py`,
`shared_prompt.py`), so a reader never imports another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Layout:
    """Flattened `(tokens, heads, head_dim)` q/k/v, their segments, and where the queries go back."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    shape: tuple[int, int]  # (B, T_q) of the model's batch
    index_q: torch.Tensor | None = None  # flat positions of the kept queries (None: all, in order)

    def repad(self, out: torch.Tensor) -> torch.Tensor:
        """`(tokens, heads, dim)` -> `[B, T_q, heads, dim]`; dropped (padding) queries get 0, as flash-attn gives."""
        b, t = self.shape
        if self.index_q is not None:
            full = out.new_zeros(b * t, *out.shape[1:])
            out = full.index_copy(0, self.index_q, out)
        return out.view(b, t, *out.shape[1:])


@dataclass(frozen=True)
class Blocks:
    """Bidirectional blocks of a causal layer (Gemma 3's image tokens): their queries see their whole block.

    A second varlen call, non-causal: the queries of each block (`index_q` into the layout's flattened
    tokens) against the keys from their segment's start to the block's end (`index_k`); its output
    replaces the first call's for those queries.
    """

    index_q: torch.Tensor
    index_k: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


@dataclass(frozen=True)
class Reading:
    """What one attention call attends: its varlen rows (None: the batch holds no real token), its
    bidirectional blocks, and flash-attn's left window (`W - 1`, or None where the window never bites)."""

    rows: Layout | None
    blocks: Blocks | None
    window: int | None


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """int32 `cu_seqlens` of segment `lengths`: 0, then their running sum."""
    return F.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
