"""Start loading the fast engine at the very start of a run, before the run's own imports.

fastokens builds its BPE from tokenizer.json in ~0.6 s (100k vocabulary; ~1 s at 150k) of one core,
without the GIL, and every chunk waits for it: it is the longest step before the first chunk. The
run's own imports (numpy, `tokenizers`, jinja2, the pipeline: ~0.15-0.2 s of the other core) used to
come first; now `tokenize_corpus` starts the load, then imports, and the `packtool` console script
starts it from the command line before it even imports the CLI (`start_from_argv`): the load begins
~0.035 s after the interpreter starts instead of ~0.25 s. This module is light for that reason (no
numpy, no `tokenizers`): the lookup of the file and a thread. A failure here is silent: the run's
own load (`backend_choice.fast_backend`) meets it again and reports it.

A format with a loss mask needs token offsets, which the fast engine derives from the ids of a byte-level
BPE only: for another tokenizer (Gemma's, Llama 2's) such a run uses `tokenizers`, and loading fastokens
beside it would only take a core away from it (Gemma 3's 262k vocabulary: 3.2 s). So the load is not started
when the format may need offsets and tokenizer.json does not even name `ByteLevel` (`may_be_byte_level`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from packtool.choices import BackendName, InputFormat
from packtool.errors import PacktoolError
from packtool.stages.tokenize.engine.locate import Located, locate_model

_LOCK = threading.Lock()
_LOADS: dict[tuple[str, int, int], Future[Any]] = {}
#: the lookup `start_from_argv` made, taken once by the run it started for (the model folder is located once)
_FROM_ARGV: dict[str, Located] = {}


def load_key(path: str | Path) -> tuple[str, int, int]:
    """Which file a load is of: its path and, so that a file rewritten in between is loaded again, its mtime and size."""
    stat = os.stat(path)
    return str(path), stat.st_mtime_ns, stat.st_size


_SCAN_BLOCK = 1 << 20
_BYTE_LEVEL = b'"ByteLevel"'


def may_be_byte_level(path: str | Path) -> bool:
    """False only when tokenizer.json never names `ByteLevel` (as a type: its decoder cannot be byte-level, so
    the fast engine cannot give offsets). Read by blocks, stopping at the first hit: a byte-level file names it
    in its pre-tokenizer or decoder, which `tokenizers` writes before the vocabulary (~1 ms). Unreadable: True
    (the run's own load reports it). Read once per file version: the early start and the pipeline both ask."""
    try:
        return _names_byte_level(*load_key(path))
    except OSError:
        return True


@functools.lru_cache(maxsize=16)
def _names_byte_level(path: str, mtime_ns: int, size: int) -> bool:
    tail = b""  # the end of what was read, shorter than the name: a name across blocks is found whole
    try:
        with open(path, "rb") as fh:
            while block := fh.read(_SCAN_BLOCK):
                window = tail + block
                if _BYTE_LEVEL in window:
                    return True
                tail = window[-(len(_BYTE_LEVEL) - 1) :]
    except OSError:
        return True
    return False


def worth_loading(path: str | Path, format: str | None) -> bool:
    """Whether a run of `format` (None: unknown) on this tokenizer may use the fast engine."""
    return format in (None, InputFormat.TEXT) or may_be_byte_level(path)


def start_fast_load(tokenizer: str, backend: str, format: str | None = None) -> Located | None:
    """Locate `--tokenizer` and begin `fastokens.Tokenizer.from_file` of its tokenizer.json in a thread when the run
    may use it. Returns where it is, for the run to load everything else from (None: not found here, a hub
    name to download, or a bad path, which the run's own load reports)."""
    with _LOCK:
        located = _FROM_ARGV.pop(tokenizer, None)
    if located is None:
        try:
            located = locate_model(tokenizer)
        except (PacktoolError, OSError):
            return None
    if backend not in (BackendName.AUTO, BackendName.FAST) or importlib.util.find_spec("fastokens") is None:
        return located
    try:
        path = located.tokenizer_json.resolve()
        key = load_key(path)
    except OSError:
        return located
    if not worth_loading(path, format):
        return located
    with _LOCK:
        if key in _LOADS:
            return located
        future: Future[Any] = Future()
        _LOADS[key] = future
    # a daemon thread: a process that ends without taking the load (a usage error) does not wait for it
    threading.Thread(target=_load, args=(str(path), future), name="packtool-early", daemon=True).start()
    return located


def start_from_argv(args: list[str]) -> None:
    """`packtool tokenize ... --tokenizer T [--backend B]`: start the load from the command line itself, before the
    CLI builds its commands (typer: ~0.12 s). Only a hint: typer still parses the line, and a load nobody takes
    (another command, a misread line) is dropped or never waited for."""
    if not args or args[0] != "tokenize":
        return
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        for flag in ("--tokenizer", "--backend", "--format"):
            if arg == flag and i + 1 < len(args):
                found[flag] = args[i + 1]
            elif arg.startswith(flag + "="):
                found[flag] = arg[len(flag) + 1 :]
    if "--tokenizer" in found:
        located = start_fast_load(
            found["--tokenizer"], found.get("--backend", BackendName.AUTO), found.get("--format", InputFormat.TEXT)
        )
        if located is not None:
            with _LOCK:
                _FROM_ARGV.clear()  # one hint at a time
                _FROM_ARGV[located.spec] = located


def take_fast_load(key: tuple[str, int, int]) -> Future[Any] | None:
    """The load started for `key` (`load_key`), handed over once: the caller keeps the engine."""
    with _LOCK:
        return _LOADS.pop(key, None)


def drop_fast_load(located: Located | None) -> None:
    """Forget a load nobody took (the run failed before it needed the engine): a long-lived process keeps nothing."""
    with _LOCK:
        _FROM_ARGV.clear()
        if not _LOADS or located is None:
            return
    try:
        path = str(located.tokenizer_json.resolve())
    except OSError:
        return
    with _LOCK:  # by path: a file rewritten since the load began has another key now
        for key in [k for k in _LOADS if k[0] == path]:
            del _LOADS[key]


def _load(path: str, future: Future[Any]) -> None:
    try:
        import fastokens

        future.set_result(fastokens.Tokenizer.from_file(path))
    except BaseException as exc:  # the taker re-raises it through `result()`, as its own load would
        future.set_exception(exc)
