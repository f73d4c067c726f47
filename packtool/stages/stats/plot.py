"""`packtool stats --plot`: one PNG a person reads at a glance, without a ruler.

Token store, three panels: the length histogram with N marked; the waste of every strategy on a log
axis (padding strategies and packers in two colours, the lower bound a line, each bar labelled), so a
packer's 0.12% is as visible as naive padding's 96%; and the packers against the lower bound: the packs
each one needs above `ceil(tokens / N)`, where "at the bound" is a marked point, not an invisible bar.
On a linear axis the four packing bars vanished beside padding's 96.6% and the bound sat on the axis.

Pack store: the segment-length histogram; the fill of every pack, sorted, against the capacity N (the
partly filled packs stand out, and mean fill and the lower bound are named); and how many documents
share a pack. With `--world-size`, a fourth panel: the per-step efficiency of the plain and the
balanced order, sorted. A single "99.88% real tokens" bar next to an invisible padding bar said nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, UsageError
from packtool.stages.stats.compute import PackStoreStats, TokenStoreStats

LOWER_BOUND = "lower bound"
_PAD, _PACK, _BOUND, _HIST = "#ee854a", "#6acc64", "#d65f5f", "#4878d0"
_PADDED_NOTES = {"sorted batches of B": "global sort: no randomness"}


def check_plot_path(out: Path) -> Path:
    """Refuse a `--plot` path that cannot take a PNG before any work is done (the CLI calls this first)."""
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise UsageError(f"--plot writes a PNG, got {out.name}, pass a file name ending in .png")
    if out.is_dir():
        raise ConfigError(f"--plot {out} is a directory, pass a file name ending in .png")
    return out


def plot_stats(stats: TokenStoreStats | PackStoreStats, out: Path) -> Path:
    """Write the PNG to `out` (parent directories created) and return its path."""
    out = check_plot_path(out)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if isinstance(stats, TokenStoreStats):
        fig, axes = plt.subplots(1, 3, figsize=(20, 5.2), gridspec_kw={"width_ratios": [1, 1.25, 1]})
        _histogram(axes[0], stats._doc_lengths, stats.size, "document length (tokens)")
        _waste(axes[1], stats)
        _packers(axes[2], stats)
    else:
        steps = bool(stats.step_efficiency)
        fig, grid = plt.subplots(2 if steps else 1, 2 if steps else 3, figsize=(14, 10) if steps else (20, 5.2))
        axes = list(np.ravel(grid))
        _histogram(axes[0], stats._seg_lens, stats.size, "segment length (tokens)")
        _fill(axes[1], stats)
        _docs_per_pack(axes[2], stats)
        if steps:
            _plot_steps(axes[3], stats)
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot ({exc.strerror}), {out}, choose a writable --plot path") from exc
    finally:
        plt.close(fig)
    return out


def _histogram(ax: Any, lengths: np.ndarray, size: int, xlabel: str) -> None:
    ax.hist(lengths, bins=60, color=_HIST)
    ax.axvline(size, color=_BOUND, linestyle="--", label=f"N = {size}")
    ax.set(yscale="log", xlabel=xlabel, ylabel="count (log scale)", title="length histogram")
    ax.legend(loc="upper right")


def _waste(ax: Any, stats: TokenStoreStats) -> None:
    """Every strategy's waste on a log axis: 0.1% and 96% both readable; the bound a labelled line."""
    names = [n for n in stats.waste if n != LOWER_BOUND]
    values = np.array([100 * stats.waste[n] for n in names])
    bound = 100 * stats.waste[LOWER_BOUND]
    positive = values[values > 0]
    floor = max(min(float(positive.min()) if positive.size else 0.01, bound or 100) / 3, 1e-3)
    shown = np.maximum(values, floor)
    colors = [_PACK if n.startswith("pack ") else _PAD for n in names]
    bars = ax.barh(names, shown, color=colors, left=floor / 10)
    labels = [
        f"{v:.2f}%" + (f"  ({_PADDED_NOTES[n]})" if n in _PADDED_NOTES else "")
        for n, v in zip(names, values, strict=True)
    ]
    ax.bar_label(bars, labels=labels, padding=3, fontsize=8.5)
    if bound > 0:
        ax.axvline(
            bound, color=_BOUND, linestyle="--", linewidth=1.6, label=f"lower bound of packing {bound:.2f}% (rows of N)"
        )
    ax.set_xscale("log")
    ax.set_xlim(floor / 10, 100 * 12)  # room on the right for the labels
    from matplotlib.ticker import FuncFormatter

    ax.set_xticks([10.0**k for k in range(int(np.ceil(np.log10(floor / 10))), 3)])  # up to 100%, not 1000%
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.invert_yaxis()
    ax.set(
        xlabel="waste: % of computed positions that are padding (log scale; lower is better)",
        title=f"waste per strategy (N={stats.size}, B={stats.batch_size})",
    )
    from matplotlib.patches import Patch

    handles = [Patch(color=_PAD, label="padded batches (no cu_seqlens)"), Patch(color=_PACK, label="packs")]
    ax.legend(handles=[*handles, *ax.get_legend_handles_labels()[0]], loc="upper center", fontsize=8.5, ncol=3,
              bbox_to_anchor=(0.5, -0.16), frameon=False)  # fmt: skip


def _packers(ax: Any, stats: TokenStoreStats) -> None:
    """How many packs each packer needs above the lower bound: `at the bound` is a marked point at 0."""
    names = [n for n in stats.waste if n.startswith("pack ")]
    bound_rows = stats.rows[LOWER_BOUND]
    extra = np.array([stats.rows[n] - bound_rows for n in names])
    bars = ax.barh([n.removeprefix("pack ") for n in names], extra, color=_PACK)
    ax.scatter(np.zeros(int((extra == 0).sum())), [i for i, e in enumerate(extra) if e == 0], color=_PACK,
               edgecolor="black", zorder=3, s=60)  # fmt: skip
    labels = [
        "at the bound"
        if e == 0
        else f"+{e} pack{'s' if e > 1 else ''} (+{100 * (stats.waste[n] - stats.waste[LOWER_BOUND]):.2f} pp)"
        for n, e in zip(names, extra, strict=True)
    ]
    ax.bar_label(bars, labels=labels, padding=8, fontsize=9)
    ax.axvline(0, color=_BOUND, linestyle="--", linewidth=1.6,
               label=f"lower bound: {bound_rows} packs ({100 * stats.waste[LOWER_BOUND]:.2f}% waste)")  # fmt: skip
    top = max(int(extra.max(initial=0)), 1)
    ax.set_xlim(-top * 0.06, top * 1.6)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.invert_yaxis()
    ax.set(xlabel=f"packs above the lower bound (rows of N={stats.size}; lower is better)",
           title="packers vs the lower bound")  # fmt: skip
    ax.legend(loc="upper center", fontsize=8.5, bbox_to_anchor=(0.5, -0.16), frameon=False)


def _pack_fill(stats: PackStoreStats) -> np.ndarray:
    """Tokens in each pack (segment lengths, --pad-multiple padding included) as % of N."""
    offsets = np.asarray(stats._pack_offsets, np.int64)
    if offsets.size < 2:
        return np.zeros(0)
    sums = np.add.reduceat(np.asarray(stats._seg_lens, np.int64), offsets[:-1]) if stats._seg_lens.size else 0
    sums = np.where(np.diff(offsets) > 0, sums, 0)
    return 100 * np.asarray(sums, np.float64) / stats.size


def _fill(ax: Any, stats: PackStoreStats) -> None:
    """How full the packs are: a histogram of each pack's fill against the capacity N, the x axis zoomed on
    the range the packs span, so "67 packs full, one at 93%" reads at a glance."""
    fill = _pack_fill(stats)
    lo = float(np.floor(min(fill.min(initial=100.0), 99.0))) - 0.5
    # 99% is a bin edge: no bar straddles it, so the bars right of 99 count the packs the title calls full
    width = (100.0 - lo) / 40
    below, above = max(1, round((99.0 - lo) / width)), max(1, round(1.0 / width))
    edges = np.append(np.linspace(lo, 99.0, below + 1), np.linspace(99.0, 100.0, above + 1)[1:])
    counts, edges, bars = ax.hist(fill, bins=edges, color=_PACK, edgecolor="white")
    ax.yaxis.set_major_locator(_integer_ticks())
    ax.bar_label(bars, labels=[str(int(c)) if c else "" for c in counts], padding=2, fontsize=8.5)
    ax.axvline(100, color="black", linestyle=":", linewidth=1.4, label=f"capacity N = {stats.size}")
    ax.axvline(100 * stats.efficiency, color=_BOUND, linestyle="--", linewidth=1.4,
               label=f"real tokens over all packs {100 * stats.efficiency:.2f}%")  # fmt: skip
    ax.set_xlim(lo, 100.0 + (100.0 - lo) * 0.04)
    ax.set_ylim(0, max(counts.max(initial=0), 1) * 1.18)
    full = int((fill >= 99).sum())
    ax.set(
        xlabel="fill of a pack (% of N; segments incl. --pad-multiple padding; axis zoomed)",
        ylabel="packs",
        title=f"pack fill: {full} of {stats.n_packs} packs at least 99% full (lower bound {stats.lower_bound_packs} packs)",
    )
    ax.legend(loc="upper left", fontsize=8.5)
    ax.text(0.02, 0.80, _breakdown(stats), transform=ax.transAxes, va="top", fontsize=8.5, family="monospace",
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#bbbbbb"})  # fmt: skip


def _integer_ticks() -> Any:
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def _breakdown(stats: PackStoreStats) -> str:
    """Where the positions go: real tokens, --pad-multiple padding, empty pack tails; and the bound's padding."""
    positions = stats.n_packs * stats.size
    if not positions:
        return "no packs"
    segments = int(np.asarray(stats._seg_lens, np.int64).sum())
    bound = stats.lower_bound_packs * stats.size - stats.n_tokens
    share = lambda n: f"{100 * n / positions:6.2f}%"  # noqa: E731
    return "\n".join([
        f"{positions:,} positions ({stats.n_packs} packs x {stats.size})",
        f"  real tokens        {share(stats.n_tokens)}",
        f"  --pad-multiple pad {share(segments - stats.n_tokens)}",
        f"  empty pack tails   {share(positions - segments)}",
        f"lower bound ({stats.lower_bound_packs} packs): {100 * bound / max(stats.lower_bound_packs * stats.size, 1):.2f}% padding",
    ])  # fmt: skip


def _docs_per_pack(ax: Any, stats: PackStoreStats) -> None:
    per_pack = np.diff(np.asarray(stats._pack_offsets, np.int64))
    if stats._docs_per_pack.size == per_pack.size:  # a shared-prompt store: prompt segments are not documents
        per_pack = stats._docs_per_pack
    if per_pack.size:
        counts = np.bincount(per_pack)
        ks = np.flatnonzero(counts)
        width = max(1.0, (ks.max() - ks.min()) / 80) if ks.size else 1.0
        ax.bar(ks, counts[ks], width=width, color=_HIST)
        ax.axvline(stats.docs_per_pack_mean, color=_BOUND, linestyle="--", label=f"mean {stats.docs_per_pack_mean:.1f}")
        ax.legend(loc="upper right")
    ax.yaxis.set_major_locator(_integer_ticks())  # a count of packs: no 0.25 ticks
    ax.set(xlabel="segments (documents or their fragments) in a pack", ylabel="packs",
           title=f"documents per pack: mean {stats.docs_per_pack_mean:.1f}, max {stats.docs_per_pack_max}")  # fmt: skip


def _plot_steps(ax: Any, stats: PackStoreStats) -> None:
    """Per-step efficiency (mean rank cost / max rank cost), each order sorted from worst to best."""
    s = stats.step_efficiency or {}
    for name, color in (("plain", "#d65f5f"), ("balanced", "#6acc64")):
        eff = sorted(100 * stats._step_eff[name])
        ax.plot(
            range(len(eff)), eff, color=color,
            label=f"{name}: mean {100 * s[name]['mean']:.2f}%, p5 {100 * s[name]['p5']:.2f}%",
        )  # fmt: skip
    ax.set(
        xlabel="steps, sorted by efficiency",
        ylabel="mean rank cost / max rank cost (%)",
        title=f"step efficiency, W={s['world_size']} B={s['micro_batches']}: "
        f"{100 * s['time_saved']:.2f}% step time saved",
    )
    ax.legend(loc="lower right")
