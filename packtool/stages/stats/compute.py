"""`packtool stats`: how much compute each batching strategy wastes on padding, before you pack.

Waste ratio = share of computed positions that are padding. For a token store the documents are
first cut the way `pack --overlong split` would (fragments of <= N; empty documents carry no
tokens and are left out), then compared under: naive padding of every document to N, random
batches of B padded to their longest, length-sorted batches of B, padded dynamic batching under a
budget of B*N tokens per batch (`packtool.core.batching`, what `DynamicBatchSampler(padded=True)`
yields: a seeded shuffle sorted inside windows of 1024 documents; a preference store's pairs whole in
one batch, as the sampler keeps them, each sequence capped at N), every packing algorithm in the
registry, and the lower bound `1 - total / (ceil(total / N) * N)`. For a pack store it reads what
was packed: efficiency, segments per pack, pad share, over-long counts; with `--world-size W` and a
cost model, the step efficiency of data-parallel ranks in the plain and the balanced order (`balance.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packtool.choices import Overlong, Split
from packtool.core.batching import dynamic_waste
from packtool.core.packing import ALGORITHMS, lower_bound, pack_lengths
from packtool.core.packing.pairs import pair_scan, shared_prompt_lengths
from packtool.core.packing.segments import build_segments
from packtool.errors import ConfigError, UsageError
from packtool.formats.model_config import MAX_SIZE
from packtool.formats.pack_store import (
    ROLE_PROMPT,
    attended_prefix,
    find_pack_dir,
    metadata_sources,
    open_pack_split,
    parse_data_name,
    sizes_in,
)
from packtool.formats.token_store import MANIFEST, open_token_store
from packtool.stages.pack.config import validate_pack_size
from packtool.stages.stats.balance import cost_model, step_balance
from packtool.stages.stats.blend import BlendStats, blend_stats, check_blend
from packtool.stages.stats.explain import PAIRS_NOTE, ROWS_NOTE, SORT_NOTE, WASTE_NOTE, Note, size_note, strategy_notes
from packtool.stages.stats.vision import pack_vision_stats, token_vision_stats

DEFAULT_SIZE = 4096
DYNAMIC = "dynamic (padded)"
"""Waste key of padded dynamic batching: batches of documents with rows x padded length <= B*N."""


def _public(stats: object) -> dict[str, Any]:
    """The fields of a stats dataclass without its private arrays (what --json prints)."""
    return {k: v for k, v in asdict(stats).items() if not k.startswith("_")}  # type: ignore[call-overload]


@dataclass(frozen=True)
class StatsConfig:
    """Everything `packtool stats` needs; `compute_stats(config)` is the library call."""

    path: Path
    """A token store directory or a pack store (ROOT, `packed/{tok}` dir or `.npy` file)."""
    size: int | None = None
    """Pack size N for token-store waste ratios (default 4096); selects the size of a pack store."""
    batch_size: int = 8
    """Batch size B for the padded-batch baselines (random batches and length-sorted batches)."""
    seed: int = 0
    """Seed for the random batches and the shuffling algorithms."""
    split: Split = Split.TRAINING
    """Which split of a pack store to describe."""
    world_size: int | None = None
    """Pack store: data-parallel ranks W; reports the step efficiency of the plain and the balanced order."""
    micro_batches: int = 1
    """Packs per rank per optimizer step B (with `world_size`)."""
    model: Path | None = None
    """A transformers config.json whose shape prices packs (`CostModel.from_config`), with `world_size`."""
    hidden_size: int | None = None
    """Or a hidden size h: 24·h² per token and 2·h·s² per segment (`CostModel.from_shape`)."""
    blend: tuple[str, ...] | None = None
    """Pack stores `STORE:W` blended at load time: report each store's share (`stages.stats.blend`); `path` unused."""

    def validate(self) -> StatsConfig:
        """Check every value before any work; returns self."""
        if self.size is not None:
            validate_pack_size(self.size)
        for flag, value, low in (("--batch-size", self.batch_size, 1), ("--seed", self.seed, 0),
                                 ("--world-size", self.world_size, 1), ("--micro-batches", self.micro_batches, 1),
                                 ("--hidden-size", self.hidden_size, 1)):  # fmt: skip
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise UsageError(f"{flag} must be an integer >= {low}, got {value!r}, pass e.g. {flag} {low or 1}")
        if self.hidden_size is not None and self.hidden_size > MAX_SIZE:  # 10**200 overflowed the float cost
            raise UsageError(
                f"--hidden-size must be at most {MAX_SIZE} (no model is wider), got {str(self.hidden_size)[:40]}, "
                "pass the model's hidden size"
            )
        if self.world_size is None and (self.model is not None or self.hidden_size is not None):
            raise UsageError("--model/--hidden-size price the steps of --world-size W, pass --world-size too")
        if self.world_size is not None:
            cost_model(self.model, self.hidden_size)  # a missing or unreadable config fails before any work
        if self.blend is not None:
            check_blend(self)
        return self


@dataclass
class TokenStoreStats:
    """Length distribution of a token store and the waste of every batching strategy at size N."""

    path: str
    size: int
    batch_size: int
    n_documents: int
    n_tokens: int
    n_empty_documents: int
    n_overlong: int
    n_items: int  # documents after over-long ones are split into fragments of <= N (empty ones left out)
    lengths: dict[str, int]  # p50, p90, p99, max of document lengths (empty ones included)
    waste: dict[str, float]  # strategy -> share of computed positions that are padding
    rows: dict[str, int]  # strategy -> sequences (rows of N or batch rows) it computes
    kind: str = "tokens"
    overlong_note: str = "documents longer than N are counted as their fragments of <= N tokens (pack --overlong split)"
    preference: dict[str, Any] | None = None  # a preference store: pairs, pair-atomic packing, shared-prompt savings
    vision: dict[str, Any] | None = None  # a store with images: image tokens, images and patches (stats/vision.py)
    _doc_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    size_source: str = "given"  # "default": no --size, N is DEFAULT_SIZE (a token store does not know its packs)
    notes: dict[str, str] = field(default_factory=dict)  # what `rows`, `waste` and `size` mean (explain.py)
    strategies: dict[str, Note] = field(default_factory=dict)  # waste row -> what it keeps and gives up

    def to_dict(self) -> dict[str, Any]:
        return _public(self)


@dataclass
class PackStoreStats:
    """What one split at one size of a pack store holds and how full its packs are."""

    path: str
    split: str
    size: int
    algorithm: str
    n_documents: int
    n_segments: int
    n_packs: int
    n_tokens: int
    efficiency: float  # real tokens / (n_packs * N)
    pad_share: float  # 1 - efficiency: tail padding plus --pad-multiple padding
    packing_efficiency: float  # Megatron-Bridge's percentage (segment lengths incl. --pad-multiple padding)
    lower_bound_packs: int
    docs_per_pack_mean: float
    docs_per_pack_max: int
    overlong: dict[str, Any]
    n_empty_documents: int
    kind: str = "packs"
    _seg_lens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    step_efficiency: dict[str, Any] | None = None  # with --world-size: plain vs balanced steps (balance.py)
    _step_eff: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    sources: list[dict[str, Any]] = field(default_factory=list)  # each source: path, weight, documents, tokens, share
    _pack_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64), repr=False)  # for the plot
    preference: dict[str, Any] | None = None  # a preference split: its metadata's pairs, layout, over-long pairs
    _docs_per_pack: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)  # for the plot
    vision: dict[str, Any] | None = None  # a vision split: image tokens, images and patches per pack (stats/vision.py)

    def to_dict(self) -> dict[str, Any]:
        return _public(self)


def _sources(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The split's sources with documents, tokens and share (a single store: all of the split)."""
    keys = ("path", "manifest_sha256", "weight", "documents", "tokens", "share")
    recs = metadata_sources(meta)
    if len(recs) == 1 and "documents" not in recs[0]:
        recs = [
            {**recs[0], "weight": 1, "documents": meta.get("n_documents"), "tokens": meta.get("n_tokens"), "share": 1.0}
        ]
    return [{k: r.get(k) for k in keys} for r in recs]


def _padded_batches(lengths: np.ndarray, batch: int, cap: int) -> tuple[int, int]:
    """(rows, computed positions) when consecutive batches of `batch` are padded to their longest."""
    n = lengths.size
    if n == 0:
        return 0, 0
    starts = np.arange(0, n, min(batch, n), dtype=np.int64)  # memory O(n) whatever B
    longest = np.minimum(np.maximum.reduceat(np.asarray(lengths, np.int64), starts), cap)
    counts = np.diff(np.append(starts, n))
    return n, int((longest * counts).sum())


def _waste(total: int, computed: int) -> float:
    return 0.0 if computed == 0 else 1.0 - total / computed


def token_store_stats(path: Path, size: int, batch_size: int, seed: int) -> TokenStoreStats:
    """Waste ratios of every strategy for the documents of a token store at pack size `size`."""
    store = open_token_store(path)
    doc_lengths = store.lengths
    items = build_segments(store.starts, doc_lengths, size, Overlong.SPLIT).lengths
    total = int(items.sum())
    rng = np.random.default_rng(seed)
    rows: dict[str, int] = {"naive (pad each to N)": int(items.size)}
    computed: dict[str, int] = {"naive (pad each to N)": int(items.size) * size}
    for name, order in (
        ("random batches of B", rng.permutation(items.size)),
        ("sorted batches of B", np.argsort(items, kind="stable")),
    ):
        rows[name], computed[name] = _padded_batches(items[order], batch_size, size)
    pairs = store.preference_pairs is not None
    dynamic_total = total
    if pairs and doc_lengths.size:
        # DynamicBatchSampler keeps a pair's two sequences in one batch: so does its row (sequences capped at N)
        capped = np.minimum(np.asarray(doc_lengths, np.int64), size)
        rows[DYNAMIC], dynamic_total = int(capped.size), int(capped.sum())
        budget = min(batch_size, capped.size) * size
        computed[DYNAMIC] = dynamic_waste(capped, budget, seed=seed, pairs=True)[1]
    elif items.size:
        rows[DYNAMIC] = int(items.size)
        # a budget of n*N holds every item in one batch already: larger ones batch the same (and overflow int64)
        computed[DYNAMIC] = dynamic_waste(items, min(batch_size, items.size) * size, seed=seed)[1]
    else:
        rows[DYNAMIC], computed[DYNAMIC] = 0, 0
    for name in ALGORITHMS:
        offsets, _ = pack_lengths(items, size, algorithm=name, seed=seed)
        rows[f"pack {name}"] = int(offsets.size - 1)
        computed[f"pack {name}"] = rows[f"pack {name}"] * size
    rows["lower bound"] = -(-total // size)
    computed["lower bound"] = rows["lower bound"] * size
    pct = np.percentile(doc_lengths, [50, 90, 99]) if doc_lengths.size else np.zeros(3)
    return TokenStoreStats(
        path=str(path),
        size=size,
        batch_size=batch_size,
        n_documents=store.n_documents,
        n_tokens=store.n_tokens,
        n_empty_documents=int(np.count_nonzero(doc_lengths == 0)),
        n_overlong=int(np.count_nonzero(doc_lengths > size)),
        n_items=int(items.size),
        lengths={"p50": int(pct[0]), "p90": int(pct[1]), "p99": int(pct[2]), "max": int(doc_lengths.max(initial=0))},
        waste={k: _waste(dynamic_total if k == DYNAMIC else total, v) for k, v in computed.items()},
        rows=rows,
        preference=preference_stats(store, size, seed) if store.preference_pairs is not None else None,
        vision=token_vision_stats(store),
        _doc_lengths=np.asarray(doc_lengths),
        notes={
            "rows": ROWS_NOTE,
            "waste": WASTE_NOTE,
            "sorting": SORT_NOTE,
            "size": size_note(size, given=True),
            **({"pairs": PAIRS_NOTE} if pairs else {}),
        },
        strategies=strategy_notes(list(rows)),
    )


def preference_stats(store: Any, size: int, seed: int) -> dict[str, Any]:
    """Pairs of a preference store packed pair-atomically (each pair one item, as `pack` does) at size N, in
    both layouts, and what holding each prompt once saves. Over-long pairs are left out (as `--overlong drop`)."""
    lengths = store.lengths
    lc, lr = lengths[0::2], lengths[1::2]
    scan = pair_scan(store.tokens, store.loss, store.starts, lengths)
    prompt = shared_prompt_lengths(scan, lc, lr)
    empty = (lc == 0) | (lr == 0)
    layouts: dict[str, Any] = {}
    for name, items in (("pairs", lc + lr), ("shared-prompt", lc + lr - prompt)):
        fits = (items <= size) & ~empty
        kept = items[fits]
        packs = int(pack_lengths(kept, size, seed=seed)[0].size - 1) if kept.size else 0
        layouts[name] = {
            "items": int(kept.size),
            "overlong_pairs": int(np.count_nonzero(~fits & ~empty)),
            "tokens": int(kept.sum()),
            "packs": packs,
            "lower_bound": lower_bound(kept, size),
            "waste": _waste(int(kept.sum()), packs * size),
        }
    both = int((lc + lr)[~empty].sum())
    saved = int(prompt[~empty].sum())
    return {
        "pairs": int(lc.size),
        "n_empty_pairs": int(np.count_nonzero(empty)),
        "prompt_tokens_saved": saved,
        "prompt_saved_share": saved / both if both else 0.0,
        "layouts": layouts,
    }


def pack_store_stats(path: Path, size: int | None, split: str) -> PackStoreStats:
    """Efficiency, docs per pack, pad share and over-long counts of one split of a pack store."""
    directory = find_pack_dir(path)
    named = parse_data_name(Path(path).name) if Path(path).is_file() else None
    if named is not None:  # `{split}_{N}.npy` names its split and size
        split, size = named
    if size is None:
        sizes = sizes_in(directory)
        if len(sizes) != 1:
            raise ConfigError(f"{directory} holds sizes {sizes}, pass --size to pick one")
        size = sizes[0]
    ps = open_pack_split(directory, split, size)
    meta = ps.metadata
    per_pack = np.diff(np.asarray(ps.pack_offsets))
    docs_per_pack = per_pack  # a shared-prompt pair is 3 segments but 2 documents: its prompt is not one
    if ps.shared_prompt and ps.seg_role is not None:
        prompt = np.asarray(ps.seg_role) == ROLE_PROMPT
        docs_per_pack = per_pack - np.bincount(
            np.repeat(np.arange(per_pack.size), per_pack)[prompt], minlength=per_pack.size
        )
    n_tokens = int(meta["n_tokens"])
    positions = ps.n_packs * size
    eff = n_tokens / positions if positions else 0.0
    return PackStoreStats(
        path=str(directory),
        split=split,
        size=size,
        algorithm=str(meta.get("algorithm")),
        n_documents=int(meta["n_documents"]),
        n_segments=int(per_pack.sum()),
        n_packs=ps.n_packs,
        n_tokens=n_tokens,
        efficiency=eff,
        pad_share=1.0 - eff if positions else 0.0,
        packing_efficiency=float(meta["packing_efficiency"]),
        lower_bound_packs=int(meta["lower_bound_packs"]),
        docs_per_pack_mean=float(docs_per_pack.mean()) if docs_per_pack.size else 0.0,
        docs_per_pack_max=int(docs_per_pack.max(initial=0)),
        overlong=dict(meta["overlong"]),
        n_empty_documents=int(meta.get("n_empty_documents", 0)),
        _seg_lens=np.asarray(ps.seg_lens),
        sources=_sources(meta),
        _pack_offsets=np.asarray(ps.pack_offsets),
        _docs_per_pack=np.asarray(docs_per_pack, np.int64),
        preference=meta.get("preference") if isinstance(meta.get("preference"), dict) else None,
        vision=pack_vision_stats(ps),
    )


def compute_stats(config: StatsConfig) -> TokenStoreStats | PackStoreStats | BlendStats:
    """Statistics of a token store (detected by its manifest.json) or of a pack store."""
    config.validate()
    if config.blend is not None:
        return blend_stats(config.blend, config.seed, str(config.split), config.size)
    path = Path(config.path)
    if path.is_dir() and (path / MANIFEST).is_file():
        if config.world_size is not None:
            raise UsageError(
                f"--world-size measures the steps of a pack store, {path} is a token store, pack it first and pass the pack store"
            )
        tokens = token_store_stats(path, config.size or DEFAULT_SIZE, config.batch_size, config.seed)
        if config.size is None:  # say so: a store packed at 2048 was silently measured at 4096
            tokens.size_source, tokens.notes["size"] = "default", size_note(tokens.size, given=False)
        return tokens
    stats = pack_store_stats(path, config.size, str(config.split))
    if config.world_size is not None:
        model, name = cost_model(config.model, config.hidden_size)
        ps = open_pack_split(Path(stats.path), stats.split, stats.size)
        stats.step_efficiency, stats._step_eff = step_balance(
            np.asarray(ps.pack_offsets),
            np.asarray(ps.seg_lens),
            prefix=attended_prefix(np.asarray(ps.seg_lens), ps.seg_role),  # shared-prompt completions see the prompt
            world=config.world_size,
            micro_batches=config.micro_batches,
            model=model,
            model_name=name,
            seed=config.seed,
        )
    return stats
