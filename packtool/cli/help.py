"""`--help` that reads at 80 columns, with or without rich installed: click's plain layout, never rich's table.

Rich's table cut option names (`--completion-fie…`), broke the format list mid-word (`prompt-comp|letion`)
and showed typer's type placeholders (`<bool>`, `<list[str]>`, `{inputs}`, `<str>`). Here every value has a
metavar (`--size N`; a flag without one gets its name in capitals), a choice is `--format FORMAT` with its
choices as a comma list in the help (wrapped between words, never inside one: no break at a hyphen), the
usage line names the arguments as they are typed (`INPUT...`), and the command list shows each command's
first sentence whole instead of cutting it at 45 characters.
"""

from __future__ import annotations

import re
import sys
import textwrap
from typing import Any

from typer.core import TyperCommand, TyperGroup

from packtool.cli.summaries import error_line
from packtool.cli.usage import ClickFailure, NoArgsIsHelp, UsageFailure, choice_values, usage_line

_Context: Any = TyperCommand.context_class
_Formatter: Any = _Context.formatter_class


_EXTRA = re.compile(r"\[(?:default|required)[^\]]{0,40}\]")


def _wrap(text: str, width: int, indent: str = "", first: str | None = None) -> list[str]:
    """Paragraphs (blank-line separated) wrapped at `width` between words only: a hyphenated word
    (`prompt-completion`, `data-parallel`) and a long path stay whole."""
    lines: list[str] = []
    wrapper = textwrap.TextWrapper(width, break_on_hyphens=False, break_long_words=False)
    for i, para in enumerate(p for p in textwrap.dedent(text).split("\n\n") if p.strip()):
        if i:
            lines.append("")
        wrapper.initial_indent = first if (first is not None and not lines) else indent
        wrapper.subsequent_indent = indent
        glued = _EXTRA.sub(lambda m: m.group(0).replace(" ", "\xa0"), " ".join(para.split()))  # `[default: x]` whole
        lines += [line.replace("\xa0", " ") for line in wrapper.wrap(glued)]
    return lines


class PlainFormatter(_Formatter):  # type: ignore[misc]
    """click's HelpFormatter, wrapping text and option help between words only."""

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        self.write("".join(line + "\n" for line in _wrap(text, self.width, indent)))

    def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
        rows = list(rows)
        first_col = min(max((len(r[0]) for r in rows), default=0), col_max) + col_spacing
        pad = " " * (first_col + self.current_indent)
        width = max(self.width - first_col - self.current_indent, 20) + first_col + self.current_indent
        for name, text in rows:
            head = " " * self.current_indent + name
            if not text:
                self.write(head + "\n")
                continue
            if len(name) <= first_col - col_spacing:
                lines = _wrap(text, width, pad, first=head.ljust(first_col + self.current_indent))
            else:
                lines = [head, *_wrap(text, width, pad)]
            self.write("".join(line + "\n" for line in lines))


class PlainContext(_Context):  # type: ignore[misc]
    formatter_class = PlainFormatter


#: how each value is written in --help and in usage errors: `COMMAND FLAG` first, then `FLAG` (an argument by
#: its name); a value not listed shows its name in capitals (`--new-flag NEW_FLAG`), never a type placeholder
METAVARS: dict[str, str] = {
    "tokenize inputs": "INPUT...", "merge shards": "SHARD...", "path": "PATH", "stats path": "PATH|STORE:W...", "run config": "CONFIG.yaml",
    "audit model": "MODEL", "--tokenizer": "TOKENIZER", "--output": "DIR", "pack --output": "ROOT",
    "--field": "FIELD", "--prompt-field": "FIELD", "--completion-field": "FIELD", "--messages-field": "FIELD",
    "--instruction-field": "FIELD", "--input-field": "FIELD", "--output-field": "FIELD", "--history-field": "FIELD",
    "--system-field": "FIELD", "--role-map": "FROM=TO,...", "--chat-template": "FILE", "--separator": "STR", "--media-dir": "DIR",
    "--assistant-turns": "TURNS", "--on-error": "MODE", "--workers": "N", "--max-record-bytes": "BYTES",
    "--chunk-bytes": "BYTES", "--num-shards": "N", "--shard-index": "I", "--ray-address": "ADDRESS",
    "--size": "N", "--seed": "SEED", "--overlong": "POLICY", "--pad-multiple": "M", "--max-docs-per-pack": "K", "--vision-budget": "PATCHES",
    "--validation": "FRACTION", "--batch-size": "B", "--plot": "FILE.png", "--world-size": "W",
    "--micro-batches": "B", "stats --model": "CONFIG.json", "--hidden-size": "H", "--source": "STORE",
    "--to": "TRAINER", "--eos-id": "ID", "--attn-implementation": "NAME",
}  # fmt: skip


def _metavar(command: str, param: Any) -> str:
    keys = [param.name or ""] if param.param_type_name == "argument" else list(param.opts)
    for key in [f"{command} {k}" for k in keys] + keys:
        if key in METAVARS:
            return METAVARS[key]
    return (param.name or "VALUE").upper()


def _prepare(command: str, params: list[Any]) -> None:
    """Give every value a metavar (no `<str>` placeholder) and name a choice's values in its help."""
    for param in params:
        if getattr(param, "is_flag", False) or getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            name = param.metavar or _metavar(command, param)
            param.metavar = name if param.nargs == 1 or name.endswith("...") else name + "..."
            continue
        values = choice_values(param)
        if param.metavar is None:
            param.metavar = _metavar(command, param)
        if values and "One of:" not in (param.help or ""):
            param.help = f"{param.help or ''} One of: {', '.join(values)}.".strip()


class PlainCommand(TyperCommand):  # type: ignore[misc]
    """A typer command whose help is plain, 80-column text (see the module docstring)."""

    context_class = PlainContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = None
        super().__init__(*args, **kwargs)
        _prepare(self.name or "", self.params)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                pieces.append(str(param.metavar) if param.required else f"[{param.metavar}]")
        return pieces

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append((str(param.metavar), record[1]))
            else:
                opts.append(record)
        for title, rows in (("Arguments", args), ("Options", opts)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


class PlainGroup(TyperGroup):  # type: ignore[misc]
    """The `packtool` group: plain help, and each command's first sentence shown whole."""

    context_class = PlainContext

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["rich_markup_mode"] = None
        super().__init__(*args, **kwargs)
        _prepare(self.name or "", self.params)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """click's main, with every parser failure as one `error:` line (exit 2 for usage): for the console
        entry and for any caller of the app (typer's CliRunner included). Other exceptions pass through."""
        kwargs.update(zip(("args", "prog_name", "complete_var", "standalone_mode"), args, strict=False))
        given = kwargs.pop("args", None)
        argv = list(sys.argv[1:] if given is None else given)
        standalone_mode = kwargs.pop("standalone_mode", True)
        kwargs["prog_name"] = kwargs.get("prog_name") or "packtool"
        try:
            code = super().main(argv, standalone_mode=False, **kwargs)
        except UsageFailure as exc:
            if NoArgsIsHelp is not None and isinstance(exc, NoArgsIsHelp):  # bare `packtool`: the help, as asked
                _echo(exc.format_message(), err=False)  # type: ignore[attr-defined]
                sys.exit(0)
            _echo(error_line(usage_line(exc, self, argv)))
            sys.exit(2)
        except ClickFailure as exc:  # a parser failure that is not about usage: still one line
            _echo(error_line(exc.format_message()))  # type: ignore[attr-defined]
            sys.exit(getattr(exc, "exit_code", 1))
        if standalone_mode:  # as click: exit with the code (typer.Exit(n), Ctrl-C's 130), 0 after a success
            sys.exit(code if isinstance(code, int) else 0)
        return code

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            text = command.short_help or (command.help or "").strip().split("\n\n")[0]
            rows.append((name, " ".join(text.split())))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _echo(text: str, err: bool = True) -> None:
    import typer

    typer.echo(text, err=err)
