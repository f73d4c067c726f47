"""Chat templates given with `--chat-template FILE` or found in `tokenizer_config.json`: read and compile once.

A template that cannot be read or compiled is the user's to fix, so it fails before any input is
read, as one ConfigError that names the file (and the template line for a Jinja syntax error).
"""

from __future__ import annotations

from pathlib import Path

from packtool.core.encoding.chat import compile_template
from packtool.errors import ConfigError
from packtool.formats.sidefiles import SideFileError, read_side_file

#: the largest chat template read (released ones are a few kB; the longest, with tool-call grammars, ~40 kB)
TEMPLATE_BYTES = 16 << 20


def read_chat_template(spec: str) -> str:
    """The text of the `--chat-template` file (UTF-8 Jinja)."""
    path = Path(spec).expanduser()
    try:
        if path.is_dir():
            raise ConfigError(f"--chat-template {spec} is a directory, pass a Jinja template file")
        if not path.exists():
            raise ConfigError(f"--chat-template {spec} does not exist, pass a Jinja template file")
        text = read_side_file(path, TEMPLATE_BYTES).decode("utf-8")
    except SideFileError as exc:
        raise ConfigError(f"--chat-template {spec} is not read: {exc}, pass a Jinja template file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"--chat-template {spec} is not UTF-8 text (byte {exc.start}), save the template as UTF-8"
        ) from exc
    except OSError as exc:
        raise ConfigError(
            f"--chat-template {spec} cannot be read ({exc.strerror or exc}), check its permissions"
        ) from exc
    if not text.strip():
        raise ConfigError(f"--chat-template {spec} is empty, pass a Jinja chat template file")
    return text


def check_chat_template(source: str, where: str) -> None:
    """Compile `source` as transformers would; a syntax error (or an unknown tag) is a ConfigError."""
    from jinja2.exceptions import TemplateError, TemplateSyntaxError

    try:
        compile_template(source)
    except TemplateSyntaxError as exc:
        raise ConfigError(
            f"chat template {where} does not compile (line {exc.lineno}: {exc.message}), fix the template"
        ) from exc
    except TemplateError as exc:
        raise ConfigError(f"chat template {where} does not compile ({exc}), fix the template") from exc
