"""Fetching from the Hugging Face hub into its cache: huggingface_hub does the transfer, made quiet and bounded.

Every call goes through `hub_session()`, which for its duration only (nothing is set at import):
- silences huggingface_hub's logging, its warnings and its own progress bars (bytes are reported through a
  `packtool.progress.Progress` callback instead; the CLI draws it);
- bounds its retries: a transfer that stalls (no byte within `HF_HUB_DOWNLOAD_TIMEOUT`, 10 s by default) fails
  at once instead of six times over (66 s), and a connection dropped mid-file is resumed (an HTTP Range
  request) at most `MAX_RESUMES` times in a row without a new byte. huggingface_hub retries inside
  its `http_get`, which calls itself from its `except` block: the session wraps that one function.

`hf_hub_download` lays the files out as `hf` and `datasets` expect (`blobs/`, `snapshots/<commit>/`); a
branch or tag is resolved to its commit first (`repo_revision`), every file is fetched at that commit, and the
ref is recorded (`hub_cache.record_ref`) so that the cache names the same snapshot offline. A file already in
the snapshot is never fetched again, so a run that was stopped fetches only what it lacked.

`failure_text` turns what huggingface_hub raises into the middle of one error line.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.formats.hub_cache import hub_cache_dir, record_ref, repo_dir
from packtool.progress import Progress

#: resumes of one file after a dropped connection: in a row without a new byte, and in all
MAX_RESUMES = 3
MAX_TRIES = 20
_TRUE = {"1", "on", "yes", "true"}
_lock = threading.Lock()
_depth = 0
_saved: dict[str, Any] = {}


class TransferError(OSError):
    """A transfer that stalled or kept failing: the message says which file and why."""


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), read now (huggingface_hub reads it once, at its import)."""
    return any(os.environ.get(k, "").strip().lower() in _TRUE for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def repo_page(repo_type: str, name: str) -> str:
    """The page that shows a repo (and grants access to a gated one)."""
    return f"{endpoint()}/{'datasets/' if repo_type == 'dataset' else ''}{name}"


@dataclass(frozen=True)
class RepoRevision:
    """A repo at one commit: the commit a branch or tag named when it was asked, and the files there."""

    commit: str
    files: tuple[str, ...]


def repo_revision(repo_type: str, name: str, revision: str | None) -> RepoRevision:
    """The commit `revision` (None: the default branch) names now, and the repo's files at it (one request)."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=endpoint())
    with hub_session():
        info = api.repo_info(name, repo_type=repo_type, revision=revision)
    if not info.sha:
        raise TransferError(f"the hub gave no commit for {name} at {revision or 'main'}")
    files = tuple(s.rfilename for s in (getattr(info, "siblings", None) or []))
    return RepoRevision(info.sha, files)


def fetch_files(
    repo_type: str,
    name: str,
    revision: str | None,
    commit: str,
    files: Sequence[str],
    progress: Progress | None = None,
) -> Path:
    """Fetch `files` of `name` at `commit` into the hub cache (those already there are kept); the snapshot.

    `revision` (a branch or tag that named `commit`) is recorded under `refs/`. `progress(done, total)` gets
    the bytes of the whole set."""
    from huggingface_hub import hf_hub_download

    cache = hub_cache_dir()
    bar = _Bytes(progress)
    snapshot = None
    bars: dict[str, Any] = {}
    if "tqdm_class" in inspect.signature(hf_hub_download).parameters:  # not in older huggingface_hub releases
        bars["tqdm_class"] = bar.bar_class()
    with hub_session():
        for file in files:
            got = hf_hub_download(
                name, file, repo_type=repo_type, revision=commit, cache_dir=str(cache), endpoint=endpoint(), **bars
            )
            bar.file_done()
            snapshot = Path(got).parents[len(Path(file).parts) - 1]
    if revision and revision != commit:
        record_ref(_cache_kind(repo_type), name, revision, commit)
    return snapshot if snapshot is not None else repo_dir(_cache_kind(repo_type), name) / "snapshots" / commit


def _cache_kind(repo_type: str) -> str:
    return "datasets" if repo_type == "dataset" else "models"


class _Bytes:
    """Progress over a set of files: huggingface_hub creates one bar per file (its `tqdm_class`), each forwards
    its bytes here; the total grows as each file's size becomes known."""

    def __init__(self, progress: Progress | None) -> None:
        self.progress = progress
        self.done = 0
        self.total = 0

    def add(self, n: int, total: int | None = None) -> None:
        self.done += n
        if total is not None:
            self.total += total
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done))

    def file_done(self) -> None:
        if self.progress is not None:
            self.progress(self.done, max(self.total, self.done))

    def bar_class(self) -> type:
        sink = self

        class Bar:
            def __init__(self, total: int | None = None, initial: int = 0, **_: Any) -> None:
                self.n = initial
                sink.add(initial, total)

            def update(self, n: float = 1) -> None:
                self.n += int(n)
                sink.add(int(n))

            def close(self) -> None:
                pass

            def __enter__(self) -> Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                pass

        return Bar


@contextlib.contextmanager
def hub_session() -> Iterator[None]:
    """huggingface_hub quiet (no log records, warnings or bars of its own) and its retries bounded, for the
    duration of the block only; nested and concurrent blocks share one setting, restored by the last to leave."""
    global _depth
    with _lock:
        if _depth == 0:
            _enter()
        _depth += 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _leave()


def _enter() -> None:
    from huggingface_hub import file_download
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars

    hub_log = logging.getLogger("huggingface_hub")
    _saved.update(level=hub_log.level, bars_off=are_progress_bars_disabled(), http_get=file_download.http_get)
    hub_log.setLevel(logging.CRITICAL + 1)
    disable_progress_bars()
    file_download.http_get = _bounded(file_download.http_get)


def _leave() -> None:
    from huggingface_hub import file_download
    from huggingface_hub.utils import enable_progress_bars

    logging.getLogger("huggingface_hub").setLevel(_saved["level"])
    if not _saved["bars_off"]:
        enable_progress_bars()
    file_download.http_get = _saved["http_get"]
    _saved.clear()


def _bounded(original: Callable[..., Any]) -> Callable[..., Any]:
    """huggingface_hub's `http_get` with its retries bounded (see the module docstring).

    Its retry is a call to itself made while it handles the error (the `_nb_retries` keyword is set only
    then): `sys.exc_info()` names that error. A read timeout is a stall: never tried again. A dropped
    connection is resumed at most `MAX_RESUMES` times in a row without a new byte (bytes reach the file in
    chunks of up to 10 MB, so a short file's drop shows none), `MAX_TRIES` times in all."""
    tried: dict[str, tuple[int, int, int]] = {}  # url -> (bytes had at the last try, tries since, tries in all)

    def http_get(url: str, temp_file: Any, *args: Any, **kwargs: Any) -> Any:
        resume_size = int(kwargs.get("resume_size", 0))
        if "_nb_retries" in kwargs:  # huggingface_hub retrying after an error
            error = sys.exc_info()[1]
            last, idle, tries = tried.get(url, (0, 0, 0))
            name = url.rsplit("/", 1)[-1]
            if error is not None and "Timeout" in type(error).__name__:
                raise TransferError(
                    f"the transfer of {name} stalled: no byte came for {_download_timeout()} s "
                    f"(HF_HUB_DOWNLOAD_TIMEOUT), {resume_size} bytes had come"
                ) from error
            idle = 0 if resume_size > last else idle + 1
            if idle > MAX_RESUMES or tries >= MAX_TRIES:
                raise TransferError(
                    f"the transfer of {name} kept breaking off ({_first_line(error)}; {tries + 1} tries, "
                    f"{resume_size} bytes kept)"
                ) from error
            tried[url] = (resume_size, idle, tries + 1)
        else:
            tried[url] = (resume_size, 0, 0)
        return original(url, temp_file, *args, **kwargs)

    return http_get


def _download_timeout() -> int:
    from huggingface_hub import constants

    return int(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def missing_entry(exc: BaseException) -> bool:
    """The hub answered that the file (or folder) is not in the repo: never a failure to reach it."""
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    return isinstance(exc, EntryNotFoundError) and not isinstance(exc, LocalEntryNotFoundError)


def failure_text(repo_type: str, name: str, revision: str | None, exc: BaseException) -> str:
    """Why a hub call failed and what to do, for one error line (the caller says what was being fetched)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kind = "dataset" if repo_type == "dataset" else "model"
    page = repo_page(repo_type, name)
    if isinstance(exc, HFValidationError):
        return f"{name!r} is not a valid hub repo name ({_first_line(exc)}), expected ORG/NAME"
    if isinstance(exc, GatedRepoError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        why = "no token was sent" if status == 401 or not os.environ.get("HF_TOKEN") else "the token may not read it"
        return (
            f"the {kind} repo {name} is gated and the hub refused the download (HTTP {status or '401/403'}: {why}), "
            f"accept its terms on {page} and set HF_TOKEN to a token of that account (or run `hf auth login`)"
        )
    if isinstance(exc, RepositoryNotFoundError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return (
            f"the hub has no {kind} repo {name} (or it is private; HTTP {status or 404}), {endpoint()}, "
            "check the name, and for a private repo set HF_TOKEN"
        )
    if isinstance(exc, RevisionNotFoundError):
        return f"the {kind} repo {name} has no revision {revision!r}, {page}, name a branch, tag or commit it has"
    if isinstance(exc, OfflineModeIsEnabled):
        return f"HF_HUB_OFFLINE is set and {name} is not in the local Hugging Face cache ({hub_cache_dir()})"
    if isinstance(exc, TransferError):
        return f"{exc}, {page}, retry (files already fetched are kept)"
    if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
        return f"a download from {name} was cut short ({_first_line(exc)}), {page}, retry"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status:
        hint = "set HF_TOKEN to a token that can read it" if status in (401, 403) else "retry later"
        return f"the hub answered HTTP {status} for {name}, {endpoint()}, {hint}"
    return (
        f"cannot reach the hub at {endpoint()} ({type(exc).__name__}: {_first_line(exc)}), check HF_ENDPOINT and "
        "the network, or set HF_HUB_OFFLINE=1 to read only the local cache"
    )


def _first_line(exc: BaseException | None) -> str:
    if exc is None:
        return "no error"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
