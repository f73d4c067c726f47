"""`--tokenizer ORG/NAME[@REV]` not in the local cache: its tokenizer files fetched with huggingface_hub into that cache.

huggingface_hub (a dependency of `tokenizers`) does the transfer (`formats/hub_fetch.py`: quiet, retries
bounded, bytes reported through the progress callback), so its settings hold as everywhere else:
`HF_ENDPOINT`, `HF_TOKEN` (or the token `hf auth login` saved), `HF_HUB_CACHE`/`HF_HOME`, and `HF_HUB_OFFLINE=1`,
which fails at once, naming the `hf download` command to run where the hub is reachable. Only what packtool
reads is fetched, all from the one commit that REV (default `main`) names when the download starts: the
optional side files (`tokenizer_config.json`, `special_tokens_map.json`, `chat_template.jinja`,
`additional_chat_templates/*.jinja`) the repo holds first, and `tokenizer.json` last, so that a snapshot holding
it was fetched whole (the cache lookup takes a snapshot with `tokenizer.json` as complete); REV is recorded
under `refs/`. Any failure is one TokenizerError line.
"""

from __future__ import annotations

from pathlib import Path

from packtool.errors import TokenizerError
from packtool.formats.hub_cache import hub_cache_dir, is_revision
from packtool.formats.hub_fetch import failure_text, fetch_files, offline, repo_revision
from packtool.progress import Progress
from packtool.stages.tokenize.engine.locate import (
    CHAT_TEMPLATE_DIR,
    CHAT_TEMPLATE_JINJA,
    SPECIAL_TOKENS_MAP,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    fetch_command,
    split_revision,
)

#: fetched when the repo has them, before tokenizer.json
OPTIONAL_FILES = (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP, CHAT_TEMPLATE_JINJA)


def download_tokenizer(spec: str, progress: Progress | None = None) -> Path:
    """Fetch the tokenizer files of model repo `ORG/NAME[@REV]` into the hub cache; the snapshot holding them."""
    name, revision = split_revision(spec)
    cache = hub_cache_dir()
    fix = (
        f"fetch it where the hub is reachable ({fetch_command(spec)}) or pass a local tokenizer.json or model directory"
    )
    if revision is not None and not is_revision(revision):
        raise TokenizerError(
            f"tokenizer {spec!r}: {revision!r} is not a revision (a branch, tag or commit name), "
            "write --tokenizer ORG/NAME@REV"
        )
    if offline():
        raise TokenizerError(
            f"tokenizer {spec!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set, {cache}, {fix}"
        )
    try:
        import huggingface_hub  # noqa: F401 - a dependency of tokenizers, present unless removed by hand
    except ImportError:
        raise TokenizerError(
            f"tokenizer {spec!r} is not in the local Hugging Face cache and huggingface_hub is not installed, "
            f"{cache}, pip install huggingface_hub (or {fix})"
        ) from None
    try:
        remote = repo_revision("model", name, revision)
    except Exception as exc:  # a connection error, a refused token, a hub that answers 5xx: one line, never a trace
        raise TokenizerError(_failure(spec, revision, exc, fix)) from exc
    if TOKENIZER_JSON not in remote.files:
        raise TokenizerError(
            f"hub repo {name} has no {TOKENIZER_JSON}, {endpoint_page(name)}, convert it once with transformers "
            f"(AutoTokenizer.from_pretrained({name!r}).save_pretrained(DIR)) and pass DIR"
        )
    wanted = [f for f in (*OPTIONAL_FILES, *_named_templates(remote.files)) if f in remote.files]
    try:
        return fetch_files("model", name, revision or "main", remote.commit, [*wanted, TOKENIZER_JSON], progress)
    except Exception as exc:
        raise TokenizerError(_failure(spec, revision, exc, fix)) from exc


def endpoint_page(name: str) -> str:
    from packtool.formats.hub_fetch import repo_page

    return repo_page("model", name)


def _named_templates(files: tuple[str, ...]) -> list[str]:
    """`additional_chat_templates/*.jinja` of the repo (directly in the folder)."""
    return sorted(
        f
        for f in files
        if f.startswith(f"{CHAT_TEMPLATE_DIR}/") and f.endswith(".jinja") and "/" not in f[len(CHAT_TEMPLATE_DIR) + 1 :]
    )


def _failure(spec: str, revision: str | None, exc: Exception, fix: str) -> str:
    """One line: the tokenizer, why the hub call failed, what to do."""
    name = split_revision(spec)[0]
    text = failure_text("model", name, revision, exc)
    if text.startswith("cannot reach") or text.startswith("the hub answered"):
        return f"tokenizer {spec!r} is not a local path, and downloading it from the hub failed: {text}, or {fix}"
    return f"tokenizer {spec!r} is not a local path: {text}"
