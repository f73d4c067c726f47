"""`packtool stats --plot`: one PNG a person reads without a ruler.

Left: the length histogram with N marked. Right (token store): waste per strategy as bars, each
labelled with its value, and the lower bound drawn as a line across them; (pack store): the share
of real tokens and of padding, labelled, with the lower bound's padding share as a line; with
`--world-size`, a third panel: the per-step efficiency of the plain and the balanced order, sorted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from packtool.errors import ConfigError, UsageError
from packtool.stages.stats.compute import PackStoreStats, TokenStoreStats

LOWER_BOUND = "lower bound"


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

    steps = getattr(stats, "step_efficiency", None)
    fig, axes = plt.subplots(1, 3 if steps else 2, figsize=(19.5 if steps else 13, 4.8))
    left, right = axes[0], axes[1]
    lengths = stats._doc_lengths if isinstance(stats, TokenStoreStats) else stats._seg_lens
    left.hist(lengths, bins=60, color="#4878d0")
    left.axvline(stats.size, color="#d65f5f", linestyle="--", label=f"N = {stats.size}")
    left.set(
        yscale="log",
        xlabel="document length (tokens)" if stats.kind == "tokens" else "segment length (tokens)",
        ylabel="count",
        title="length histogram",
    )
    left.legend()
    if isinstance(stats, TokenStoreStats):
        names = [n for n in stats.waste if n != LOWER_BOUND]
        values = [100 * stats.waste[n] for n in names]
        bound = 100 * stats.waste[LOWER_BOUND]
        bars = right.barh(names, values, color="#6acc64")
        right.bar_label(bars, labels=[f"{v:.2f}%" for v in values], padding=3, fontsize=8)
        right.axvline(bound, color="#d65f5f", linestyle="--", label=f"lower bound {bound:.2f}%")
        right.invert_yaxis()
        right.set_xlim(0, max(values + [bound, 1.0]) * 1.18)
        right.set(
            xlabel="waste (% of computed positions that are padding)",
            title=f"waste per strategy (N={stats.size}, B={stats.batch_size})",
        )
    else:
        values = [100 * stats.efficiency, 100 * stats.pad_share]
        bars = right.bar(["real tokens", "padding"], values, color=["#6acc64", "#d65f5f"])
        right.bar_label(bars, labels=[f"{v:.2f}%" for v in values], padding=3)
        positions = stats.lower_bound_packs * stats.size
        bound = 100 * (1 - stats.n_tokens / positions) if positions else 0.0
        right.axhline(bound, color="#4878d0", linestyle="--", label=f"lower-bound padding {bound:.2f}%")
        right.set_ylim(0, 112)
        right.set(ylabel="% of positions", title=f"{stats.split} {stats.size}: {stats.n_packs} packs")
    right.legend(loc="lower right")
    if steps and isinstance(stats, PackStoreStats):
        _plot_steps(axes[2], stats)
    fig.tight_layout()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except OSError as exc:
        raise ConfigError(f"cannot write the plot ({exc.strerror}), {out}, choose a writable --plot path") from exc
    finally:
        plt.close(fig)
    return out


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
