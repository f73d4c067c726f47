"""The parser's usage errors as the one line every other error has: `error: <what>, <where>, <how to fix>`.

typer/click printed a usage box (`Usage: packtool tokenize [OPTIONS] {inputs}...`, a framed message, "Value
error, 'bogus' is not one of ..."). `usage_line` turns each of click's usage errors into one line naming
the flag, the value given, the command and the fix: a choice lists the values (and the closest one), a
number says the kind it needs, an unknown option names the closest known one, a missing argument or value
shows how it is typed. Exit 2, as every usage error.
"""

from __future__ import annotations

import difflib
import enum
import re
import sys
from collections.abc import Sequence
from typing import Any

import typer

_exc = sys.modules[typer.BadParameter.__module__]  # click's exceptions (vendored by typer >= 0.23)
UsageFailure: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
"""click's UsageError: the parser's complaints (exit 2)."""
ClickFailure: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
NoArgsIsHelp: type[Exception] | None = getattr(_exc, "NoArgsIsHelpError", None)

_NUMBER = {"int_parsing": "an integer", "int_from_float": "an integer", "int_type": "an integer",
           "float_parsing": "a number", "float_type": "a number", "bool_parsing": "true or false"}  # fmt: skip
_BOUND = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def choice_values(param: Any) -> list[str]:
    """The values a choice parameter accepts, as typed (enum values), or [] when it is not a choice."""
    desc = getattr(param, "type_descriptor", None)
    choices = getattr(desc, "choices", None) if desc is not None and getattr(desc, "is_choice", False) else None
    if choices is None:  # an older typer: a click.Choice type
        choices = getattr(getattr(param, "type", None), "choices", None)
    return [str(c.value) if isinstance(c, enum.Enum) else str(c) for c in choices or ()]


def _command(exc: Any, group: Any, argv: Sequence[str]) -> Any:
    """The command the error belongs to: the exception's context, else the first word of argv naming one."""
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        return ctx.command
    commands = getattr(group, "commands", {})
    return next((commands[a] for a in argv if a in commands), group)


def _where(command: Any, prog: str) -> str:
    return prog if command is None or hasattr(command, "commands") else f"{prog} {command.name}"


def _flag(param: Any) -> str:
    if param is None:
        return "a value"
    if param.param_type_name == "argument":
        return str(param.metavar or (param.name or "").upper())
    return max(param.opts, key=len)


def _usage(command: Any, where: str) -> str:
    """`packtool tokenize --tokenizer TOKENIZER --output DIR [OPTIONS] INPUT...`: the required parts, as typed."""
    params = getattr(command, "params", [])
    required = [_typed(p) for p in params if p.param_type_name == "option" and p.required]
    args = [_typed(p) if p.required else f"[{_typed(p)}]" for p in params if p.param_type_name == "argument"]
    return " ".join([where, *required, "[OPTIONS]", *args])


def _typed(param: Any) -> str:
    """How a parameter is typed: `--size N`, `INPUT...`."""
    if param is None:
        return ""
    if param.param_type_name == "argument" or getattr(param, "is_flag", False):
        return _flag(param)
    return f"{_flag(param)} {param.metavar or 'VALUE'}"


def _pydantic_error(exc: BaseException) -> dict[str, Any]:
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    try:
        found = errors() if callable(errors) else []
    except Exception:  # not pydantic's ValidationError
        found = []
    return dict(found[0]) if found else {}


def _bad_value(exc: Any, where: str) -> str:
    param = getattr(exc, "param", None)
    flag = _flag(param)
    err = _pydantic_error(exc)
    given = err.get("input")
    values = choice_values(param)
    if values:
        got = given if given is not None else _quoted(exc.message)
        folded = {v.lower(): v for v in values}  # 'BFD' is 'bfd' mistyped in case: suggest it
        close = [folded[c] for c in difflib.get_close_matches(str(got).lower(), list(folded), n=1, cutoff=0.5)]
        listed = ", ".join(repr(v) for v in values)
        fix = f"did you mean {close[0]!r}? (choices: {listed})" if close else f"pass one of: {listed}"
        return f"{flag} {got!r} is not one of its choices, {where}, {fix}"
    kind = _NUMBER.get(str(err.get("type")))
    if kind is not None:
        return f"{flag} must be {kind}, got {given!r}, {where}, pass {_typed(param)} with {kind}"
    bound = _BOUND.get(str(err.get("type")))
    if bound is not None:
        limit = next(iter((err.get("ctx") or {}).values()), "?")
        return (
            f"{flag} must be {bound} {limit}, got {given!r}, {where}, pass {_typed(param)} with a value {bound} {limit}"
        )
    text = re.sub(r"^Value error, ", "", str(err.get("msg") or exc.message)).rstrip(".")
    got = f", got {given!r}" if given is not None else ""
    return f"{flag}: {text}{got}, {where}, see `{where} --help`"


def _quoted(message: str) -> str:
    m = re.search(r"'([^']*)'", message)
    return m.group(1) if m else message


def usage_line(exc: Any, group: Any, argv: Sequence[str], prog: str = "packtool") -> str:
    """`<what>, <where>, <how to fix>` for one of click's usage errors (the caller adds `error: `)."""
    command = _command(exc, group, argv)
    where = _where(command, prog)
    name = type(exc).__name__
    message = str(getattr(exc, "message", "") or exc)
    if name == "MissingParameter":
        param = getattr(exc, "param", None)
        kind = "argument" if param is not None and param.param_type_name == "argument" else "option"
        return f"missing {kind} {_typed(param)}, {where}, pass it: {_usage(command, where)}"
    if name == "BadParameter":
        return _bad_value(exc, where)
    if name == "NoSuchOption":
        option = getattr(exc, "option_name", "") or _quoted(message)
        known = [o for p in getattr(command, "params", []) for o in (*p.opts, *p.secondary_opts) if o.startswith("-")]
        close = difflib.get_close_matches(option, known, n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]}? (`{where} --help` lists every option)"
            if close
            else f"`{where} --help` lists every option"
        )
        return f"no such option {option}, {where}, {hint}"
    if name == "BadOptionUsage" and "requires an argument" in message:
        option = getattr(exc, "option_name", "")
        param = next((p for p in getattr(command, "params", []) if option in p.opts), None)
        return f"{option} needs a value, {where}, pass {_typed(param) if param else option + ' VALUE'}"
    found = re.match(r"No such command '([^']*)'", message)
    if found:
        names = list(getattr(group, "commands", {}))
        close = difflib.get_close_matches(found.group(1), names, n=1, cutoff=0.6)
        fix = f"did you mean {close[0]}? (commands: {', '.join(names)})" if close else f"run one of: {', '.join(names)}"
        return f"no such command {found.group(1)!r}, {where}, {fix}"
    extra = re.match(r"Got unexpected extra argument(?:s|\(s\))? \((.*)\)", message)
    if extra:
        return f"unexpected extra argument {extra.group(1)}, {where}, quote a value with spaces (usage: {_usage(command, where)})"
    text = message.rstrip(".")
    return f"{text[:1].lower()}{text[1:]}, {where}, see `{where} --help`"
