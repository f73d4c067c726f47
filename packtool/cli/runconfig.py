"""`packtool run CONFIG.yaml`: the YAML parsed and checked into `stages.run.Step`s (`run_pipeline` runs them).

A config is the CLI flags written down: each section is one command and each key is one of its
flags (dashes or underscores), so `--pad-multiple 8` is `pad_multiple: 8` under `pack:`.

    tokenize: {inputs: [data/chat.jsonl], tokenizer: data/tokenizer, output: out/tokens, format: chat}
    pack:     {size: 4096, output: out}          # tokens_dir defaults to tokenize.output
    stats:    {plot: out/waste.png}              # path/size default to the pack store just written
    verify:   {}                                 # path defaults to the pack store, source to the tokens
    export:   {to: trl, output: out/trl}         # path/size/split default to the pack store just written

Several pipelines (e.g. a chat and a text corpus) go in a list: `steps: [{name: chat, tokenize:
..., pack: ...}, ...]`, run in order. Relative paths resolve against the YAML file's directory, so
a config runs the same from any working directory (a `tokenizer` that is not an existing path
there is kept as given: a hub name in the local cache). Everything is checked before any work
starts. Every error of the config itself is a UsageError (exit 2, as SPEC has it for a bad flag or
config value), one line located at its file:line: an unknown key, a missing required key, a wrong type
or a YAML syntax error names the section and the valid keys; a value of the right type outside its
domain (a range, a choice, a weight, contradictory keys) says what its flag says. A config file that
does not exist or cannot be read is exit 1, as a missing input is.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from packtool.choices import InputFormat
from packtool.cli.runstores import at as _at
from packtool.cli.runstores import blend_list, mixture_list
from packtool.cli.runstores import show as _show
from packtool.core.encoding.shapes.registry import family
from packtool.core.mixture import read_number
from packtool.errors import ConfigError, UsageError
from packtool.stages.export import ExportConfig, refuse_layout
from packtool.stages.export.registry import exporter
from packtool.stages.pack import PackConfig
from packtool.stages.run import Step
from packtool.stages.stats import StatsConfig
from packtool.stages.tokenize import TokenizeConfig
from packtool.stages.verify import VerifyConfig

SECTIONS: dict[str, type] = {
    "tokenize": TokenizeConfig,
    "pack": PackConfig,
    "stats": StatsConfig,
    "verify": VerifyConfig,
    "export": ExportConfig,
}
#: flags of a command that are not fields of its config (output options of the CLI)
EXTRA_KEYS: dict[str, dict[str, Any]] = {"stats": {"plot": Path | None, "json": bool}}
#: keys filled from the earlier sections of the same step when left out
LINKED: dict[str, set[str]] = {"pack": {"tokens_dir"}, "stats": {"path"}, "verify": {"path"}, "export": {"path"}}
PATH_KEYS = {"inputs", "output", "chat_template", "media_dir", "tokens_dir", "path", "source", "plot", "model"}
STEP_KEYS = ("name", *SECTIONS)
_INLINE = "\0inline weights"  # weights parsed out of pack.tokens_dir, until the section's keys are all read


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings remember the line of each key, for file:line in errors."""


class _Mapping(dict):  # type: ignore[type-arg]
    lines: dict[Any, int]


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Mapping:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) and key is not None:  # `? [a, b]`: no flag is named so
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a key must be a plain name, got a {'mapping' if isinstance(key, dict) else type(key).__name__}",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {_show(key)} is given twice (first on line {seen[key]})", key_node.start_mark
            )
        seen[key] = line
    out = _Mapping(loader.construct_mapping(node, deep=True))
    out.lines = {loader.construct_object(k, deep=True): k.start_mark.line + 1 for k, _ in node.value}
    out.lines[None] = node.start_mark.line + 1
    return out


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_run_config(path: str | Path) -> list[Step]:
    """Parse and check a run config into steps; nothing runs and nothing is written."""
    file = Path(path)
    try:
        if file.is_dir():
            raise ConfigError(f"config file {file} is a directory, pass the path of a YAML file (see configs/)")
        if not file.is_file():
            raise ConfigError(f"config file {file} does not exist, pass the path of a YAML file (see configs/)")
        data = yaml.load(file.read_text("utf-8"), Loader=_LineLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(file)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(
            f"invalid YAML ({problem}), {where}, fix the YAML (duplicate keys, indentation, quotes, colons)"
        ) from exc
    except RecursionError:
        raise UsageError(
            f"invalid YAML (nested too deep to read), {file}, a config holds flat sections of flags: remove the nesting"
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"config is not UTF-8 text ({exc.reason}), {file}, save it as UTF-8") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read the config ({exc.strerror or exc}), {file}, check its permissions") from exc
    if not isinstance(data, dict):
        raise UsageError(
            f"config must be a mapping with sections {', '.join(SECTIONS)} or a `steps` list, got "
            f"{type(data).__name__}, {file}, see configs/demo.yaml"
        )
    base = file.resolve().parent
    if "steps" in data:
        others = sorted(str(k) for k in data if k != "steps")
        if others:
            raise UsageError(
                f"config has both `steps` and top-level {', '.join(others)}, {_at(file, data, others[0])}, "
                "put every section inside a step"
            )
        steps = data["steps"]
        if not isinstance(steps, list) or not steps:
            raise UsageError(
                f"`steps` must be a non-empty list of steps, {_at(file, data, 'steps')}, "
                f"each a mapping with keys {', '.join(STEP_KEYS)}"
            )
        parsed = [_step(file, base, s, f"steps[{i}]", f"step{i + 1}") for i, s in enumerate(steps)]
    else:
        parsed = [_step(file, base, data, "config", "run")]
    names = [s.name for s in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise UsageError(f"step name {dupes[0]!r} is used twice, {file}, give every step its own `name`")
    return parsed


def _step(file: Path, base: Path, raw: Any, where: str, default_name: str) -> Step:
    if not isinstance(raw, dict):
        raise UsageError(
            f"{where} must be a mapping with keys {', '.join(STEP_KEYS)}, got {type(raw).__name__}, {file}"
        )
    unknown = [k for k in raw if k not in STEP_KEYS]
    if unknown:
        raise UsageError(
            f"unknown section {_show(unknown[0])} in {where}, {_at(file, raw, unknown[0])}, "
            f"{_near(unknown[0], STEP_KEYS)}valid sections: {', '.join(STEP_KEYS)}"
            + (" (or a top-level `steps` list)" if where == "config" else "")
        )
    if not any(k in raw for k in SECTIONS):
        raise UsageError(f"{where} has none of the sections {', '.join(SECTIONS)}, {_at(file, raw)}, add at least one")
    name = raw.get("name", default_name)
    if not isinstance(name, (str, int)) or isinstance(name, bool) or name == "":
        raise UsageError(
            f"the name of {where} must be a string, got {_show(name)}, {_at(file, raw, 'name')}, write `name: chat`"
        )
    name = str(name)
    sections: dict[str, dict[str, Any]] = {}
    for section in SECTIONS:
        if section in raw:
            body = raw[section] if raw[section] is not None else _Mapping()
            if not isinstance(body, dict):
                raise UsageError(
                    f"section {section!r} of {where} must be a mapping of flags, got {type(body).__name__}, "
                    f"{_at(file, raw, section)}, e.g. `{section}: {{key: value}}`"
                )
            sections[section] = _section(file, base, section, body, linked=_has_link(section, raw))

    def check(section: str, build: Callable[[], Any]) -> Any:
        """`build()` (a config's validate()), its ConfigError located at the YAML key it names."""
        try:
            return build()
        except ConfigError as exc:
            flag = re.search(r"--([a-z][a-z-]*)", str(exc))
            body = raw[section]
            key = flag[1].replace("-", "_") if flag else "weights" if "mixture weight" in str(exc) else None
            at = next((k for k in getattr(body, "lines", {}) if str(k).replace("-", "_") == key), None)
            where = (
                f"{section}.{at}, {_at(file, body, at)}" if at is not None else f"{section}, {_at(file, raw, section)}"
            )
            raise type(exc)(f"{where}: {exc}") from None

    tokenize = (
        check("tokenize", lambda: TokenizeConfig(**sections["tokenize"]).validate()) if "tokenize" in sections else None
    )
    pack_keys = sections.get("pack")
    if pack_keys is not None and "tokens_dir" not in pack_keys:
        pack_keys["tokens_dir"] = Path(tokenize.output) if tokenize is not None else None
    pack = check("pack", lambda: PackConfig(**pack_keys).validate()) if pack_keys is not None else None
    if "stats" in sections:  # path and size may come from the pack step: check the ranges with stand-ins
        keys = {k: v for k, v in sections["stats"].items() if k not in EXTRA_KEYS["stats"]}
        check("stats", lambda: StatsConfig(**{"path": Path("."), **keys}).validate())
        plot = sections["stats"].get("plot")
        if plot is not None and sections["stats"].get("blend") is not None:
            raise UsageError(f"stats.plot draws one store, not a blend, {_at(file, raw, 'stats')}, drop plot or blend")
        if plot is not None and Path(plot).suffix.lower() != ".png":
            raise UsageError(f"stats.plot writes a PNG, got {plot}, {_at(file, raw, 'stats')}, end the name in .png")
    if "export" in sections:  # path may come from the pack step: check the choices with a stand-in
        export = check("export", lambda: ExportConfig(**{"path": ".", **sections["export"]}).validate())
        _check_pair_export(tokenize, pack, export, "path" in raw["export"], name, lambda f: check("export", f))
    return Step(name, tokenize, pack, sections.get("stats"), sections.get("verify"), sections.get("export"))


def _check_pair_export(
    tokenize: TokenizeConfig | None,
    pack: PackConfig | None,
    export: ExportConfig,
    own_path: bool,
    name: str,
    check: Callable[[Callable[[], Any]], Any],
) -> None:
    """An export of the preference packs this step writes, to a target that cannot hold them, is refused now,
    not after tokenize and pack ran (`export_store` refuses it again from the pack metadata)."""
    if tokenize is None or pack is None or own_path or tokenize.format == InputFormat.AUTO:
        return  # auto: the shape is known once records are read (`export_store` refuses it then)
    if not any(spec.pairs for spec in family(str(tokenize.format))):
        return
    if Path(tokenize.output) in [p for p, _ in pack.stores()]:
        layout = "shared-prompt" if pack.share_prompt else "pairs"
        check(lambda: refuse_layout(layout, exporter(export.target), f"the pack output of step {name!r}"))


def _has_link(section: str, raw: dict[str, Any]) -> bool:
    """Whether an earlier section of the step can supply this section's linked keys."""
    earlier = list(SECTIONS)[: list(SECTIONS).index(section)]
    return any(s in raw for s in earlier if s in ("tokenize", "pack"))


#: the integer an "expected an integer" error shows for a key (8 for the others: workers, seed, pad_multiple...)
_INT_EXAMPLE = {"size": 4096, "max_record_bytes": 16777216, "chunk_bytes": 67108864, "hidden_size": 4096}


def _near(key: Any, names: typing.Iterable[str]) -> str:
    """`did you mean 'format'? ` for a mistyped key or section, else nothing."""
    close = difflib.get_close_matches(str(key), list(names), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}? " if close else ""


def _section(file: Path, base: Path, section: str, body: dict[str, Any], linked: bool) -> dict[str, Any]:
    """Check the keys of one section and convert their values to the config field types."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types_ = {**{n: hints[n] for n in fields}, **EXTRA_KEYS.get(section, {})}
    valid = ", ".join(types_)
    out: dict[str, Any] = {}
    for key, value in body.items():
        norm = str(key).replace("-", "_")
        if norm not in types_:
            raise UsageError(
                f"unknown key {_show(key)} in section {section!r}, {_at(file, body, key)}, "
                f"{_near(norm, types_)}valid keys: {valid}"
            )
        if norm in out:
            raise UsageError(
                f"key {norm!r} given twice in section {section!r} (dashes and underscores are the same key), "
                f"{_at(file, body, key)}, keep one"
            )
        if section == "pack" and norm == "tokens_dir":  # a store, or a mixture: [a:2, {path: b, weight: 0.5}]
            where = f"{section}.{key}, {_at(file, body, key)}"
            out[norm], inline = mixture_list(value, lambda v, k: _resolve(v, base, k), where, file)
            if inline is not None:
                out[_INLINE] = (key, inline)
            continue
        if section == "stats" and norm == "blend":  # pack stores blended at load time: [a:1, {path: b, weight: 2}]
            out[norm] = blend_list(value, lambda v, k: _resolve(v, base, k), f"{section}.{key}, {_at(file, body, key)}")
            out.setdefault("path", Path(out[norm][0].rpartition(":")[0]))  # a stand-in: a blend reads no `path`
            continue
        out[norm] = _coerce(value, types_[norm], norm, base, f"{section}.{key}, {_at(file, body, key)}")
    if _INLINE in out:  # weights written inside tokens_dir (STORE:W, {path, weight}) and maybe as `weights:` too
        key, inline = out.pop(_INLINE)
        if "weights" in out:
            given = next(k for k in body if str(k).replace("-", "_") == "weights")
            raise UsageError(
                f"pack.{key} gives weights inline (STORE:WEIGHT or {{path, weight}}), {_at(file, body, key)}, "
                f"and pack.weights gives them again, {_at(file, body, given)}, give each weight once: "
                "inline or in `weights:`"
            )
        out["weights"] = inline
    required = [
        n
        for n, f in fields.items()
        if f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        and n not in out
        and not (linked and n in LINKED.get(section, set()))
    ]
    if required:
        raise UsageError(
            f"section {section!r} lacks the required key {required[0]!r}, {_at(file, body)}, "
            f"add `{required[0]}: ...` (required: {', '.join(n for n, f in fields.items() if f.default is dataclasses.MISSING)})"
        )
    return out


def _coerce(value: Any, tp: Any, key: str, base: Path, where: str) -> Any:
    """`value` as type `tp` (Path, int, str, bool, StrEnum, tuple[str, ...], X | None) or ConfigError."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        listed = [a for a in inner if typing.get_origin(a) is tuple]  # verify.source: one store or a list
        return _coerce(value, listed[0] if listed and isinstance(value, list) else inner[0], key, base, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise UsageError(f"{where}: expected true or false, got {_show(value)}, write `{key}: true` or `{key}: false`")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise UsageError(
            f"{where}: expected an integer, got {_show(value)}, write e.g. `{key}: {_INT_EXAMPLE.get(key, 8)}`"
        )
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and read_number(value) is not None:  # `1e6`: YAML 1.1 reads it as text
            return read_number(value)
        raise UsageError(f"{where}: expected a number, got {_show(value)}, write e.g. `{key}: 0.01`")
    if typing.get_origin(tp) is tuple and typing.get_args(tp)[0] is float:  # weights
        items = value if isinstance(value, list) else [value]
        return tuple(_coerce(v, float, key, base, where) for v in items)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:  # a value outside the choices: a usage error, as for the flag
            raise UsageError(
                f"{where}: {_show(value)} is not one of {', '.join(str(m.value) for m in tp)}, pick one"
            ) from None
    if typing.get_origin(tp) is tuple:  # inputs: one path/glob or a list of them
        items = value if isinstance(value, list) else [value]
        if not items or not all(isinstance(v, str) for v in items):
            raise UsageError(
                f"{where}: expected a path or a list of paths, got {_show(value)}, write `{key}: [a.jsonl, dir/]`"
            )
        return tuple(_resolve(v, base, key) for v in items)
    if tp is Path or tp is str:
        if not isinstance(value, str) or (not value and key in PATH_KEYS):
            raise UsageError(
                f"{where}: expected a string, got {_show(value)}, quote it if YAML read it as something else"
            )
        resolved = _resolve(value, base, key)
        return Path(resolved) if tp is Path else resolved
    raise ConfigError(f"{where}: unsupported key type {tp!r}, this is a bug in packtool")


def _resolve(value: str, base: Path, key: str) -> str:
    """Relative paths are relative to the YAML file; a tokenizer that is no path there stays a hub name."""
    if key == "tokenizer":
        candidate = os.path.normpath(base / Path(value).expanduser())
        return candidate if os.path.exists(candidate) else value
    if key not in PATH_KEYS or value.startswith("hf://"):  # a hub dataset is no path
        return value
    return os.path.normpath(base / Path(value).expanduser())  # an absolute value replaces base
