"""`packtool stats STORE:W ...`: what a load-time blend of pack stores gives each store.

Per store: its packs, weight, samples per epoch (`k·n + floor(f·n + 1/2)`, exactly what
`packtool.loader.BlendedDataset` yields), its share of the blend's samples and of its real (target and
context, not padding) tokens, and the epochs over its packs that one epoch of the blend makes. The
tokens are counted from each store's segment table over the packs the blend actually draws in epoch 0
(the fractional part's seeded subset included), never estimated.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from packtool.core.blend import BlendPlan
from packtool.core.mixture import split_weight
from packtool.formats.pack_store import open_pack_split


@dataclass
class BlendStats:
    """One row per store (`stores`), totals beside; `to_dict()` is what `--json` prints."""

    seed: int
    split: str
    size: int
    n_stores: int
    n_samples: int  # per epoch of the blend
    n_tokens: int  # real tokens of one epoch
    stores: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "blend", **asdict(self)}


def pack_real_tokens(pack_offsets: np.ndarray, seg_lens: np.ndarray, seg_pad: np.ndarray) -> np.ndarray:
    """Real tokens of every pack (segment lengths less their `--pad-multiple` padding), exact int64."""
    real = np.asarray(seg_lens, np.int64) - np.asarray(seg_pad, np.int64)
    csum = np.concatenate(([0], np.cumsum(real)))
    po = np.asarray(pack_offsets, np.int64)
    return csum[po[1:]] - csum[po[:-1]]


def blend_stats(
    sources: list[str] | tuple[str, ...], seed: int = 0, split: str = "training", size: int | None = None
) -> BlendStats:
    """The blend report of `sources` (`STORE:W` strings or `(store, weight)` pairs)."""
    plan = BlendPlan(list(sources), seed, split, size)
    rows: list[dict[str, Any]] = []
    for s, directory in enumerate(plan.directories):
        n, k, m = int(plan.n_packs[s]), int(plan.full_passes[s]), int(plan.partial[s])
        tokens = 0
        if n:
            store = open_pack_split(directory, plan.split, plan.size)
            per_pack = pack_real_tokens(store.pack_offsets, store.seg_lens, store.seg_pad)
            tokens = k * int(per_pack.sum())
            if m:  # the seeded distinct packs of the partial pass, as the loader draws them in epoch 0
                tokens += int(per_pack[plan.packs_of(s, np.arange(k * n, k * n + m, dtype=np.int64), 0)].sum())
        rows.append(
            {
                "path": plan.paths[s],
                "weight": plan.weights[s],
                "n_packs": n,
                "samples": int(plan.counts[s]),
                "tokens": tokens,
                "epochs": int(plan.counts[s]) / n if n else 0.0,
            }
        )
    total_tokens = sum(r["tokens"] for r in rows)
    for r in rows:
        r["sample_share"] = r["samples"] / plan.total
        r["token_share"] = r["tokens"] / total_tokens if total_tokens else 0.0
    return BlendStats(plan.seed, plan.split, plan.size, len(rows), plan.total, total_tokens, rows)


def check_blend(config: Any) -> None:
    """A `StatsConfig` with `blend`: at least one source, weights that parse, no per-store-only flag."""
    from packtool.core.blend import parse_source
    from packtool.errors import UsageError

    if not config.blend:
        raise UsageError("a blend needs pack stores, stats, pass STORE:W STORE:W ...")
    for spec in config.blend:
        parse_source(spec)  # a bad weight is a UsageError naming it
    if config.world_size is not None:
        raise UsageError(
            "--world-size measures the steps of one pack store, not a blend, drop --world-size or pass one store"
        )


def blend_sources(args: list[Any]) -> tuple[str, ...] | None:
    """The CLI's positional stores as a blend (`STORE:W ...`), or None for one plain store path.

    Several arguments are always a blend; one is a blend when it splits as `pack` splits `STORE:W`
    (`core.mixture.split_weight`): `A:1,5` with A existing is a blend whose weight is then refused by name.
    """
    texts = [str(a) for a in args]
    if len(texts) > 1:
        return tuple(texts)
    return tuple(texts) if split_weight(texts[0])[1] is not None else None


__all__ = ["BlendStats", "blend_sources", "blend_stats", "check_blend", "pack_real_tokens"]
