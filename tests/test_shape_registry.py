"""The record-shape registry (`packtool.choices.InputFormat` + one module per shape) against everything that
must follow it: the modules of core/encoding/shapes, the `--format` choices, the flags each shape reads
(config, CLI, flag checks), `--format auto`'s error text, lazy imports, and no name check elsewhere.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli, write_jsonl

import packtool
from packtool.choices import InputFormat
from packtool.core.encoding.shapes import registry
from packtool.core.encoding.shapes.base import (
    FIELD_NAMES,
    Conversation,
    Sample,
    ShapeFields,
    ShapeOptions,
    ShapeSpec,
    flag_of,
)
from packtool.core.encoding.shapes.detect import choose
from packtool.errors import ConfigError, UsageError

ROOT = Path(__file__).resolve().parents[1] / "packtool"
SHAPES_DIR = ROOT / "core" / "encoding" / "shapes"
#: modules of the shapes package that are the room's machinery, not shapes
MACHINERY = {"__init__", "base", "fields", "roles", "registry", "detect", "images"}


def test_every_format_but_auto_is_a_shape_module_and_every_shape_module_is_registered() -> None:
    names = {f.value for f in InputFormat} - {"auto"}
    assert set(registry.formats()) == names and registry.AUTO == "auto"
    reachable = {}
    for fmt in registry.formats():
        for spec in registry.family(fmt):
            assert isinstance(spec, ShapeSpec)
            reachable[spec.name.replace("-", "_")] = fmt
    assert set(registry.formats()) <= {s.name for _, s in registry.every_shape()}
    modules = {p.stem for p in SHAPES_DIR.glob("*.py")} - MACHINERY
    assert modules == set(reachable), "a shape module that no --format reads, or a registered shape without module"


def test_specs_are_complete_and_their_fields_are_flags_of_the_config_and_the_cli() -> None:
    import typer

    from packtool.cli.commands import app

    config_fields = {f.name: f for f in dataclasses.fields(packtool.TokenizeConfig)}
    command = typer.main.get_command(app).commands["tokenize"]  # type: ignore[attr-defined]
    options = {opt for p in command.params for opt in p.opts}
    for _, spec in registry.every_shape():
        assert spec.fields, spec.name
        assert set(spec.fields) <= set(FIELD_NAMES), spec.name
        assert spec.clues and spec.rank > 0, spec.name
        assert spec.chat or not spec.role_map, spec.name  # roles only exist in conversations
        for field in spec.fields:
            flag = flag_of(field)
            assert flag in config_fields and config_fields[flag].default is None, (spec.name, flag)
            assert "--" + flag.replace("_", "-") in options, flag
        for name in spec.recorded:
            assert name in config_fields, (spec.name, name)
        assert spec.default_fields() == ShapeFields(**spec.fields)
    assert set(registry.shape_flags()) <= set(config_fields)
    assert sum(spec.documents for _, spec in registry.every_shape()) == 1  # .txt documents have one shape


def test_the_format_choices_users_type_are_the_registry(tmp_path: Path) -> None:
    import typer

    from packtool.cli.commands import app

    command = typer.main.get_command(app).commands["tokenize"]  # type: ignore[attr-defined]
    option = next(p for p in command.params if p.name == "format")
    assert option.type_descriptor.annotation is InputFormat
    code, _, err = cli("tokenize", "x.jsonl", "--tokenizer", "t", "--output", str(tmp_path / "o"), "--format", "nope")
    assert code == 2
    for name in [*registry.formats(), "auto"]:
        assert f"'{name}'" in " ".join(err.split()), name


def test_an_unknown_format_is_an_error_everywhere() -> None:
    """It used to fall through to TRL's prompt-completion when it reached the record converter."""
    with pytest.raises(ConfigError, match="unknown record shape 'nope', pick one of text, prompt-completion"):
        registry.shape_spec("nope")
    with pytest.raises(ConfigError, match="--format 'nope' is not one of"):
        packtool.TokenizeConfig(inputs=("x",), tokenizer="t", output="o", format="nope").validate()  # type: ignore[arg-type]
    from packtool.stages.tokenize.records import extract

    settings = _settings(shape="nope")
    with pytest.raises(ConfigError, match="unknown record shape 'nope'"):
        extract({"prompt": "a", "completion": "b"}, settings)


def _settings(**changes: object) -> object:
    from packtool.core.encoding.encode import SpecialPolicy
    from packtool.stages.tokenize.settings import ChunkSettings

    base = ChunkSettings(tokenizer_path="t", tokenizer_sha256="s", format="text", shape="text", fields=ShapeFields(),
                         chat_template=None, bos_token=None, eos_token=None, separator=None, on_error="fail",
                         policy=SpecialPolicy(add_special_tokens=True), dtype="uint16", work_dir="w")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_flag_checks_and_their_texts_come_from_the_specs(tmp_path: Path) -> None:
    for fmt in [*registry.formats(), "auto"]:
        reads = registry.flags_read(fmt)
        for flag in registry.shape_flags():
            config = packtool.TokenizeConfig(inputs=("x",), tokenizer="t", output="o", format=fmt,  # type: ignore[arg-type]
                                             **{flag: "human=user" if flag == "role_map" else "f"})
            if flag in reads:
                config.validate()
            else:
                with pytest.raises(UsageError) as caught:
                    config.validate()
                readers = ", ".join(registry.formats_reading(flag))
                assert f"(it is for {readers})" in str(caught.value), (fmt, flag, str(caught.value))
    assert registry.formats_reading("messages_field")[:2] == ["chat", "sharegpt"]
    assert registry.formats_reading("role_map")[-1] == "auto"


def test_auto_names_every_shape_clue_when_none_fits() -> None:
    with pytest.raises(ConfigError) as caught:
        choose([Sample("a.jsonl:1", {"question": "?"})])
    text = str(caught.value)
    clues = [clue for _, spec in registry.every_shape() for clue in spec.clues]
    assert all(clue in text for clue in clues)
    assert ("expected text, prompt/completion, messages, conversations, conversation, instruction/output, or "
            "chosen/rejected fields"
            in text)
    assert "the first holds fields 'question'" in text


def test_auto_prefers_the_higher_rank_and_lets_compatible_records_agree() -> None:
    chat = {"messages": [{"role": "user", "content": "x"}]}
    both = {"text": "t", "messages": [{"role": "user", "content": "x"}]}
    assert choose([Sample("f:1", both)])[0].name == "chat"  # a record with two shapes: the higher rank
    candidate, first = choose([Sample("f:1", {"question": "?"}), Sample("f:2", chat), Sample("f:3", chat)])
    assert candidate.name == "chat" and first.where == "f:2"  # a record of no shape does not decide
    with pytest.raises(ConfigError, match="two record shapes: text at f:1 and chat at f:2"):
        choose([Sample("f:1", {"text": "t"}), Sample("f:2", chat)])
    assert choose([Sample("f:1", "doc", document=True)])[0].name == "text"


def test_shape_modules_are_imported_only_when_a_run_needs_them() -> None:
    """`packtool --help` imports nothing of the shapes room; a run of one format imports its family only."""
    probe = (
        "import sys, packtool.cli.commands\n"
        "loaded = lambda: sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('packtool.core.encoding.shapes.'))\n"
        "print(loaded())\n"
        "import packtool\n"
        "packtool.TokenizeConfig(inputs=('x',), tokenizer='t', output='o', format='alpaca').validate()\n"
        "print([m for m in loaded() if m not in ('base', 'fields', 'roles', 'registry', 'detect')])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "['alpaca']", out


#: (module, why) allowed to test a shape name outside its own module
NAME_CHECKS_ALLOWED = {
    # decides from argv, before the run's imports, whether the fast engine may be needed (a text run needs no
    # character offsets); importing the registry there would cost the console script's start-up
    "packtool/stages/tokenize/engine/early.py": "InputFormat.TEXT",
}


def test_no_module_tests_a_shape_name_outside_the_shapes_room() -> None:
    """No if-chain or table on format names: a comparison of a format against a shape's name, or a dict keyed
    by shape names, lives in the shapes room only (`"text"` elsewhere is a content part's type, not a shape)."""
    names = set(registry.formats())
    members = {f.name for f in InputFormat if f.value != "auto"}
    about_format = re.compile(r"format|fmt|shape")
    found = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).as_posix()
        if path.parent == SHAPES_DIR or rel in NAME_CHECKS_ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            leaves = list(ast.walk(node))
            if isinstance(node, ast.Compare):
                member = any(isinstance(x, ast.Attribute) and x.attr in members and isinstance(x.value, ast.Name)
                             and x.value.id == "InputFormat" for x in leaves)
                constant = any(isinstance(x, ast.Constant) and x.value in names for x in leaves)
                subject = any(about_format.search(x.id if isinstance(x, ast.Name) else x.attr) for x in leaves
                              if isinstance(x, (ast.Name, ast.Attribute)) and not (isinstance(x, ast.Name)
                                                                                    and x.id == "InputFormat"))
                if member or (constant and subject):
                    found.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if len(keys & names) >= 2:
                    found.append(f"{rel}:{node.lineno}")
    assert not found, found


def test_conversation_targets_per_turn() -> None:
    conv = Conversation([{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "assistant"}],
                        targets=(False, False, False, True))
    assert conv.targets_from == 2 and Conversation([]).targets_from == 0
    assert ShapeOptions(ShapeFields()).role_map == ()


def test_python_api_reads_records_through_the_registry(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Every format's spec converts a record of its shape (the pure API a reader of another kind can reuse)."""
    records = {
        "text": {"text": "hello"},
        "prompt-completion": {"prompt": "Q", "completion": "A"},
        "chat": {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
        "sharegpt": {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]},
        "alpaca": {"instruction": "x", "output": "y"},
    }
    for fmt in registry.formats():
        if fmt not in records:
            continue  # a later shape brings its own test
        spec = registry.shape_spec(fmt)
        got = spec.convert(records[fmt], ShapeOptions(spec.default_fields()))
        assert isinstance(got, Conversation) == spec.chat, fmt
        assert choose([Sample("r:1", records[fmt])])[0].name == fmt
    src = write_jsonl(tmp_path / "in.jsonl", [records["alpaca"]])
    code, stdout, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "o"), "--format", "auto", "-q", "--workers", "1")
    assert code == 0 and "detected format alpaca," in stdout, err
