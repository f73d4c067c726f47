"""`--tokenizer ORG/NAME` not in the local cache: its tokenizer files fetched with huggingface_hub into that cache.

huggingface_hub (a dependency of `tokenizers`) does the transfer, so its settings hold as everywhere else:
`HF_ENDPOINT`, `HF_TOKEN` (or the token `hf auth login` saved), `HF_HUB_CACHE`/`HF_HOME`, and `HF_HUB_OFFLINE=1`,
which fails at once, naming the `hf download` command to run where the hub is reachable. Only what packtool
reads is fetched, all from the one commit `main` names when the download starts: the optional side files
(`tokenizer_config.json`, `special_tokens_map.json`, `chat_template.jinja`, `additional_chat_templates/*.jinja`)
first, a missing one skipped, and `tokenizer.json` last, so that a snapshot holding it was fetched whole (the
cache lookup takes a snapshot with `tokenizer.json` as complete). Anything but a missing optional file stops
the download as one TokenizerError line.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import TokenizerError
from packtool.formats.hub_cache import hub_cache_dir
from packtool.stages.tokenize.engine.locate import (
    CHAT_TEMPLATE_DIR,
    CHAT_TEMPLATE_JINJA,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    fetch_command,
)

#: fetched when the repo has them, before tokenizer.json
OPTIONAL_FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_JINJA)
_TRUE = {"1", "on", "yes", "true"}


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub reads it, read now (it reads it at import)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def download_tokenizer(name: str, show_progress: bool = False) -> Path:
    """Fetch the tokenizer files of model repo `name` into the hub cache; the snapshot directory holding them.

    `show_progress`: huggingface_hub's own bars (else they are off while it runs)."""
    cache = hub_cache_dir()
    fix = (
        f"fetch it where the hub is reachable ({fetch_command(name)}) or pass a local tokenizer.json or model directory"
    )
    if offline():
        raise TokenizerError(
            f"tokenizer {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, {cache}, {fix}"
        )
    try:
        import huggingface_hub  # noqa: F401 - a dependency of tokenizers, present unless removed by hand
    except ImportError:
        raise TokenizerError(
            f"tokenizer {name!r} is not in the local Hugging Face cache and huggingface_hub is not installed, "
            f"{cache}, pip install huggingface_hub (or {fix})"
        ) from None
    try:
        with _bars(show_progress):
            return _download(name, cache)
    except TokenizerError:
        raise
    except Exception as exc:  # a connection error, a refused token, a hub that answers 5xx: one line, never a trace
        raise TokenizerError(_failure(name, exc, fix)) from exc


def _download(name: str, cache: Path) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    url = hf_hub_url(name, TOKENIZER_JSON, endpoint=endpoint())
    commit = get_hf_file_metadata(url, endpoint=endpoint()).commit_hash
    if not commit:
        raise TokenizerError(
            f"the hub at {endpoint()} gave no commit for {name}'s {TOKENIZER_JSON} (no X-Repo-Commit header), "
            f"{url}, check HF_ENDPOINT: it must be a Hugging Face hub or a mirror of one"
        )
    kw: dict[str, Any] = {"revision": commit, "cache_dir": str(cache), "endpoint": endpoint()}
    for file in (*OPTIONAL_FILES, *_named_templates(name, commit)):
        try:
            hf_hub_download(name, file, **kw)
        except Exception as exc:
            if not _missing(exc):
                raise
    return Path(hf_hub_download(name, TOKENIZER_JSON, **kw)).parent


def _named_templates(name: str, commit: str) -> list[str]:
    """`additional_chat_templates/*.jinja` of the repo at `commit` (none when the folder is absent)."""
    from huggingface_hub import HfApi

    try:
        entries = list(HfApi(endpoint=endpoint()).list_repo_tree(name, path_in_repo=CHAT_TEMPLATE_DIR, revision=commit))
    except Exception as exc:
        if _missing(exc):
            return []
        raise
    return sorted(
        e.path
        for e in entries
        if isinstance(getattr(e, "path", None), str)
        and e.path.startswith(f"{CHAT_TEMPLATE_DIR}/")
        and e.path.endswith(".jinja")
        and "/" not in e.path[len(CHAT_TEMPLATE_DIR) + 1 :]
    )


def _missing(exc: Exception) -> bool:
    """The hub answered that the file (or folder) is not in the repo: never a failure to reach it."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    return isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError)


def _failure(name: str, exc: Exception, fix: str) -> str:
    """One line saying why the download failed, where, and what to do."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = endpoint()
    if isinstance(exc, HFValidationError):
        return (
            f"tokenizer {name!r} is not a path and not a valid hub name ({_first_line(exc)}), "
            f"expected a tokenizer.json, a model directory or ORG/NAME"
        )
    if isinstance(exc, GatedRepoError):
        return (
            f"tokenizer repo {name} is gated and the hub refused the download, {where}, accept its terms on its "
            f"page and set HF_TOKEN (or run `hf auth login`), then retry or {fix}"
        )
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"tokenizer {name!r} is not a local path, and the hub has no repo {name} (or it is private), {where}, "
            "check the name (or the path), and for a private repo set HF_TOKEN"
        )
    if _missing(exc):
        return (
            f"hub repo {name} has no {TOKENIZER_JSON}, {where}, convert it once with transformers "
            f"(AutoTokenizer.from_pretrained({name!r}).save_pretrained(DIR)) and pass DIR"
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"hub repo {name} changed while its tokenizer was fetched ({_first_line(exc)}), {where}, retry"
    if isinstance(exc, OfflineModeIsEnabled):
        return f"tokenizer {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, {where}, {fix}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    what = f"HTTP {status}" if status else f"{type(exc).__name__}: {_first_line(exc)}"
    hint = "set HF_TOKEN to a token that can read it, or " if status in (401, 403) else "retry, or "
    return (
        f"tokenizer {name!r} is not a local path, and downloading it from the hub failed ({what}), {where}, {hint}{fix}"
    )


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@contextlib.contextmanager
def _bars(show: bool) -> Iterator[None]:
    """huggingface_hub's progress bars on (a terminal, no --quiet) or off while it downloads."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_off = are_progress_bars_disabled()
    if show or was_off:
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()
