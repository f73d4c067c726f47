"""`run_pipeline`: the steps of a run config, each tokenize -> pack -> stats (+ plot) -> verify -> export.

The library side of `packtool run`: `cli/runconfig.py` parses and checks the YAML into `Step`s
(every section validated before the first step runs), this module runs them in order and returns
what each stage returned; the CLI prints the stages' own summary lines. A step's later sections
take their paths from the earlier ones when left out: pack reads the store tokenize wrote, stats,
verify and export read the pack store (or the token store when the step has no pack section).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError
from packtool.stages.export import ExportConfig
from packtool.stages.pack import PackConfig
from packtool.stages.stats import StatsConfig
from packtool.stages.tokenize import TokenizeConfig
from packtool.stages.verify import VerifyConfig

RunProgress = Callable[[str, int, int], None]
"""`progress(stage, done, total)`, stage like "chat: tokenize"; the CLI draws one bar per stage."""


@dataclass(frozen=True)
class Step:
    """One pipeline: the configs of the sections it has, in run order; stats/verify/export may be partial."""

    name: str
    tokenize: TokenizeConfig | None = None
    pack: PackConfig | None = None
    stats: dict[str, Any] | None = None  # StatsConfig keys + plot/json; path/size filled at run time
    verify: dict[str, Any] | None = None  # VerifyConfig keys; path/source filled at run time
    export: dict[str, Any] | None = None  # ExportConfig keys; path/size/split filled at run time


@dataclass
class StepResult:
    """What each stage of one step returned (None for a stage the step does not have)."""

    name: str
    tokenize: Any = None
    pack: Any = None
    stats: Any = None
    plot: Path | None = None
    stats_json: bool = False
    verify: Any = None
    export: Any = None


@dataclass
class RunResult:
    """Every step's results, in run order."""

    steps: list[StepResult] = field(default_factory=list)


def run_pipeline(steps: Sequence[Step], progress: RunProgress | None = None) -> RunResult:
    """Run every step in order: tokenize -> pack -> stats (+ plot) -> verify -> export.

    Raises the stage's own PacktoolError when a stage fails, and FormatError when verify finds a
    violated invariant; the steps before it keep what they wrote.
    """
    result = RunResult()
    for step in steps:
        result.steps.append(_run_step(step, progress))
    return result


def _stage(progress: RunProgress | None, label: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(label, done, total)


def _run_step(step: Step, progress: RunProgress | None) -> StepResult:
    from packtool.stages.export import export_store
    from packtool.stages.pack import pack_store
    from packtool.stages.stats import compute_stats, plot_stats
    from packtool.stages.tokenize import tokenize_corpus
    from packtool.stages.verify import verify_path

    out = StepResult(step.name)
    tokens_dir: Path | None = Path(step.tokenize.output) if step.tokenize else None
    packed: Path | None = None
    if step.tokenize is not None:
        out.tokenize = tokenize_corpus(step.tokenize, _stage(progress, f"{step.name}: tokenize"))
    if step.pack is not None:
        out.pack = pack_store(step.pack, _stage(progress, f"{step.name}: pack"))
        packed, tokens_dir = out.pack.directory, step.pack.tokens_dir  # type: ignore[assignment]  # a mixture: a tuple
    if step.stats is not None:
        keys = dict(step.stats)
        out.plot, out.stats_json = keys.pop("plot", None), bool(keys.pop("json", False))
        keys.setdefault("path", packed or tokens_dir)
        if step.pack is not None and "path" not in step.stats:
            keys.setdefault("size", step.pack.size)
            keys.setdefault("split", step.pack.split)
        out.stats = compute_stats(StatsConfig(**keys))
        if out.plot is not None:
            plot_stats(out.stats, out.plot)
    if step.verify is not None:
        keys = dict(step.verify)
        if "path" not in keys:
            keys["path"] = packed or tokens_dir
            if packed is not None:
                keys.setdefault("source", tokens_dir)
        out.verify = verify_path(VerifyConfig(**keys))  # raises FormatError at the first violated invariant
    if step.export is not None:
        keys = dict(step.export)
        if "path" not in keys:
            keys["path"] = packed
            if step.pack is not None:
                keys.setdefault("size", step.pack.size)
                keys.setdefault("split", str(step.pack.split))
        if keys["path"] is None:
            raise ConfigError(
                f"section 'export' of step {step.name!r} has no path and no pack section, add `path: ...`"
            )
        out.export = export_store(ExportConfig(**keys).validate(), _stage(progress, f"{step.name}: export"))
    return out
