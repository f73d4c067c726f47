"""`--help` of every command, as a user first meets the CLI: exit 0, the text as written (brackets included)."""

from __future__ import annotations

import pytest
from support import cli

COMMANDS = ["tokenize", "pack", "stats", "verify", "merge", "export", "run", "audit"]


def test_top_level_help_lists_every_command() -> None:
    code, out, err = cli("--help")
    assert code == 0, err
    for command in COMMANDS:
        assert command in out
    assert "tokens.boundaries [+ tokens.loss]" in " ".join(out.split())


@pytest.mark.parametrize("command", COMMANDS)
def test_command_help(command: str) -> None:
    code, out, err = cli(command, "--help")
    assert code == 0, err
    assert "Traceback" not in err and f"packtool {command}" in out


def test_bracketed_help_text_is_shown_literally() -> None:
    """Square brackets are plain text, not Rich markup: `[/PATH]` was read as a closing tag and crashed
    `packtool tokenize --help` with a traceback."""
    code, out, err = cli("tokenize", "--help")
    assert code == 0, err
    assert "hf://datasets/ORG/NAME[@REVISION][/PATH]" in out


def test_no_help_text_holds_an_unescaped_rich_tag() -> None:
    """Rich reads `[a...]`, `[/...]`, `[@...]`, `[#...]` as markup: such text would vanish from --help or crash it."""
    import re

    import typer

    from packtool.cli.commands import app

    tag = re.compile(r"(?<!\\)\[[a-z#/@]")
    group = typer.main.get_command(app)
    texts = [group.help or ""]
    for command in group.commands.values():  # type: ignore[attr-defined]
        texts += [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    found = [t for t in texts if tag.search(t)]
    assert not found, found
    assert len(texts) > 50  # every command and option was seen


def test_every_shape_flag_help_names_the_formats_that_read_it() -> None:
    """`--messages-field` said "chat: messages; sharegpt: conversations" and left out openai, which reads it too:
    each field flag's help must name every --format the shape registry says reads it."""
    import typer

    from packtool.cli.commands import app
    from packtool.core.encoding.shapes.registry import formats_reading

    command = typer.main.get_command(app).commands["tokenize"]  # type: ignore[attr-defined]
    helps = {p.name: p.help or "" for p in command.params}
    for flag in ("messages_field", "prompt_field", "completion_field", "instruction_field", "input_field",
                 "output_field", "history_field", "system_field", "field"):
        readers = [f for f in formats_reading(flag) if f != "auto"]
        assert readers, flag
        for fmt in readers:
            assert fmt in helps[flag], (flag, fmt, helps[flag])
