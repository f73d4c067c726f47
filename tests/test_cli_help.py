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
