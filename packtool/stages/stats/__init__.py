"""The stats stage (read-only): padding waste of every strategy, or what a pack store holds."""

from __future__ import annotations

from packtool.stages.stats.compute import PackStoreStats, StatsConfig, TokenStoreStats, compute_stats
from packtool.stages.stats.plot import check_plot_path, plot_stats

__all__ = ["PackStoreStats", "check_plot_path", "StatsConfig", "TokenStoreStats", "compute_stats", "plot_stats"]
