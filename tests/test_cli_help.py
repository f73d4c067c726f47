"""`--help` of every command, as a user first meets the CLI: exit 0, the text as written (brackets included)."""

from __future__ import annotations

from pathlib import Path

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


def test_no_help_text_holds_a_rich_escape() -> None:
    """Help is plain text (no Rich markup since issue 34): a `\\[` written for Rich would show its backslash."""
    import typer

    from packtool.cli.commands import app

    group = typer.main.get_command(app)
    texts = [group.help or ""]
    for command in group.commands.values():  # type: ignore[attr-defined]
        texts += [command.help or "", *(getattr(p, "help", None) or "" for p in command.params)]
    found = [t for t in texts if "\\[" in t]
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


# ---- 80 columns (issue 34, item 6) ---------------------------------------------------------------


def _params(command: str) -> list:
    import typer

    from packtool.cli.commands import app

    return list(typer.main.get_command(app).commands[command].params)  # type: ignore[attr-defined]


@pytest.mark.parametrize("columns", ["80", "60"])
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_reads_at_80_columns(command: str, columns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No line over 80 characters; no type placeholder (`<bool>`, `<list[str]>`, `<str>`, `{inputs}`); every
    option name and every choice whole on one line: rich's table cut `--completion-fie…` and broke the format
    list as `prompt-comp|letion`."""
    import re

    from packtool.cli.help import choice_values

    monkeypatch.setenv("COLUMNS", columns)
    code, out, err = cli(*([command] if command else []), "--help")
    assert code == 0, err
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    assert not re.search(r"<[^>\s]*>|\{[^}\s]*\}|…", out), re.findall(r"<[^>\s]*>|\{[^}\s]*\}|…", out)
    words = {w.strip(".,;:()[]") for line in lines for w in line.split()}
    for param in _params(command) if command else []:
        if getattr(param, "hidden", False):
            continue
        for opt in (*param.opts, *param.secondary_opts):
            assert opt in words or param.param_type_name == "argument", (command, opt)
        for value in choice_values(param):
            assert value in words, (command, value)


def test_help_is_the_same_without_rich(tmp_path: Path) -> None:
    """The plain layout does not depend on rich being installed (`TYPER_USE_RICH=0` is typer without it)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    outs = []
    for rich in ("1", "0"):
        env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "80", "TYPER_USE_RICH": rich}
        proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "packtool", "tokenize", "--help"],
                              capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and "--completion-field FIELD" in outs[0] and "│" not in outs[0]


def test_stats_seed_says_what_it_seeds_and_run_help_names_every_section() -> None:
    """`stats --seed` said "identical bytes" (copied from pack); `run --help` left out the export section."""
    from packtool.cli.runconfig import SECTIONS

    seed = next(p.help for p in _params("stats") if p.name == "seed")
    assert "identical bytes" not in seed and "random batches" in seed
    code, out, _ = cli("run", "--help")
    text = " ".join(out.split())
    assert code == 0 and all(section in text for section in SECTIONS), text
    assert "-> export" in text


@pytest.mark.skipif(not hasattr(__import__("os"), "openpty"), reason="needs a pseudo-terminal")
def test_help_fits_a_real_80_column_terminal() -> None:
    """Without COLUMNS, the width comes from the terminal itself (a pseudo-terminal of 80 columns here)."""
    import fcntl
    import os
    import struct
    import subprocess
    import sys
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-W", "ignore", "-m", "packtool", "tokenize", "--help"], stdout=slave,
                            stderr=slave, env=env)  # fmt: skip
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    lines = b"".join(chunks).decode().replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 80 and any("--completion-field FIELD" in line for line in lines)


def test_every_metavar_entry_names_a_parameter() -> None:
    """The metavar table in cli/help.py has no stale entry (a renamed flag would silently fall back)."""
    import typer

    from packtool.cli.commands import app
    from packtool.cli.help import METAVARS

    keys: set[str] = set()
    for name, command in typer.main.get_command(app).commands.items():  # type: ignore[attr-defined]
        for p in command.params:
            own = [p.name] if p.param_type_name == "argument" else list(p.opts)
            keys |= {*own, *(f"{name} {k}" for k in own)}
    assert set(METAVARS) <= keys, set(METAVARS) - keys
