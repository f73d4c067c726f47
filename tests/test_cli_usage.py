"""Usage errors of the command-line parser, as a user meets them: ONE line `error: <what>, <where>, <how to fix>`
on stderr and exit 2, for every command (issue 34, item 5), through `main` in-process, typer's CliRunner
and a `python -m packtool` process. They were a multi-line box (`Usage: packtool
tokenize [OPTIONS] {inputs}...`, a framed message, "Value error, 'bogus' is not one of ...")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli

ROOT = Path(__file__).resolve().parents[1]

#: command -> (its required arguments, its required options, a choice option, an integer option, an option
#: taking a value); every call below fails in the parser, before any work
COMMANDS: dict[str, tuple[list[str], list[str], str | None, str | None, str | None]] = {
    "tokenize": (["in.jsonl"], ["--tokenizer", "tok", "--output", "out"], "--format", "--workers", "--field"),
    "pack": (["store"], ["--size", "64", "--output", "out"], "--algorithm", "--size", "--seed"),
    "stats": (["store"], [], "--split", "--size", "--batch-size"),
    "verify": (["store"], [], None, None, "--source"),
    "merge": (["a", "b"], ["--output", "out"], None, None, "--output"),
    "export": (["packs"], ["--to", "trl", "--output", "out"], "--to", "--size", "--eos-id"),
    "run": (["run.yaml"], [], None, None, None),
    "audit": (["model"], [], None, "--seed", "--attn-implementation"),
}


def _cases() -> list[tuple[str, str, list[str], list[str]]]:
    """(command, error kind, argv, words the line must hold)."""
    cases = []
    for name, (args, required, choice, integer, valued) in COMMANDS.items():
        cases.append((name, "missing argument", [name, *required], ["missing argument", f"packtool {name}"]))
        cases.append((name, "unknown option", [name, *args, *required, "--no-such-flag"],
                      ["no such option --no-such-flag", f"packtool {name}", "--help"]))  # fmt: skip
        if choice:
            argv = [name, *args, *[a for a in required if a != choice], choice, "bogus"]
            if choice == "--to":
                argv = [name, *args, "--output", "out", "--to", "bogus"]
            cases.append((name, "bad choice", argv, [f"{choice} 'bogus' is not one of", "pass one of:"]))
        if integer:
            argv = [name, *args, *required, integer, "abc"]
            cases.append((name, "not an integer", argv, [f"{integer} must be an integer, got 'abc'", f"pass {integer} "]))
        if valued:
            cases.append((name, "missing value", [name, *args, *required, valued], [f"{valued} needs a value"]))
    return cases


CASES = _cases()


def _check(code: int, out: str, err: str, words: list[str]) -> str:
    lines = err.splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert out == "" and "Usage:" not in err and "Value error" not in err and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert lines[0].count(", ") >= 2  # what, where, how to fix
    return lines[0]


@pytest.mark.parametrize(("command", "kind", "argv", "words"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_usage_error_is_one_line_exit_2(command: str, kind: str, argv: list[str], words: list[str]) -> None:
    _check(*cli(*argv), words)


@pytest.mark.parametrize(("command", "kind", "argv", "words"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_usage_error_through_typers_cli_runner(command: str, kind: str, argv: list[str], words: list[str]) -> None:
    """The app itself formats them, so any caller of it (typer's CliRunner here) gets the same one line."""
    from typer.testing import CliRunner

    from packtool.cli.commands import app

    result = CliRunner().invoke(app, argv)
    _check(result.exit_code, result.stdout, result.stderr, words)


def test_every_command_meets_every_error_it_can_have() -> None:
    """The table covers every command; each meets an unknown option and a missing argument, and the five kinds
    all occur (a bad choice, a missing argument, a non-integer, an unknown option, a missing value)."""
    import typer

    from packtool.cli.commands import app

    assert set(COMMANDS) == set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    assert {c[1] for c in CASES} == {"missing argument", "unknown option", "bad choice", "not an integer",
                                     "missing value"}  # fmt: skip


def test_the_fix_names_the_closest_choice_option_and_command() -> None:
    base = ["tokenize", "in.jsonl", "--tokenizer", "tok", "--output", "out"]
    line = _check(*cli(*base, "--format", "chta"), ["did you mean 'chat'?", "'prompt-completion'"])
    assert "Value error" not in line
    _check(*cli(*base, "--completion-fiel", "c"), ["did you mean --completion-field?"])
    _check(*cli("stat", "x"), ["no such command 'stat'", "did you mean stats?"])
    _check(*cli("tokenize", "in.jsonl", "--output", "out"), ["missing option --tokenizer TOKENIZER"])
    _check(*cli(*base, "--workers", "0"), ["--workers must be >= 1, got '0'"])
    _check(*cli("verify", "a", "b"), ["unexpected extra argument b", "packtool verify [OPTIONS] PATH"])


def test_help_still_exits_0_on_stdout() -> None:
    for argv in (["--help"], ["stats", "--help"], []):
        code, out, err = cli(*argv)
        assert code == 0 and err == "" and out.startswith("Usage: packtool"), (argv, code, err)


@pytest.mark.parametrize(
    "argv",
    [
        ["tokenize", "in.jsonl", "--tokenizer", "t", "--output", "o", "--format", "bogus"],
        ["tokenize", "--tokenizer", "t", "--output", "o"],
        ["pack", "s", "--size", "abc", "--output", "o"],
        ["pack", "s", "--size", "64", "--output", "o", "--sise", "5"],
        ["stats", "s", "--size"],
    ],
    ids=["bad-choice", "missing-argument", "not-an-integer", "unknown-option", "missing-value"],
)
def test_usage_error_through_python_m_packtool(argv: list[str]) -> None:
    """The console entry (`python -m packtool`, as the `packtool` script runs it), a real process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "packtool", *argv], capture_output=True, text=True,
                          env=env, timeout=60)  # fmt: skip
    _check(proc.returncode, proc.stdout, proc.stderr, [f"packtool {argv[0]}"])
