"""`--tokenizer ORG/NAME` not in the cache: downloaded with huggingface_hub from HF_ENDPOINT into HF_HUB_CACHE.

Every test talks to a loopback server on 127.0.0.1 that answers as the hub does for what huggingface_hub asks
(HEAD/GET `/{repo}/resolve/{revision}/{file}` with X-Repo-Commit, ETag and Content-Length; the tree listing of
`additional_chat_templates`; 404s with X-Error-Code). The CLI runs in a subprocess, as a user runs it: the
hub client reads its settings when it is imported. Never the real network."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support import CHATML_TEMPLATE, cli_error, write_jsonl

from packtool.formats.token_store import open_token_store

pytest.importorskip("huggingface_hub")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Hub:
    """A fake hub: repos of {path: bytes}, every request recorded as (method, path, Authorization header)."""

    repos: dict[str, dict[str, bytes]]
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""


class _Handler(http.server.BaseHTTPRequestHandler):
    hub: Hub

    def _answer(self, body: bool) -> None:
        self.hub.requests.append((self.command, self.path, self.headers.get("Authorization")))
        path = self.path.split("?")[0]
        if path.startswith("/api/models/"):
            return self._tree(path.removeprefix("/api/models/"))
        parts = path.lstrip("/").split("/")
        if len(parts) < 5 or parts[2] != "resolve":
            return self._error(404, "RepoNotFound")
        repo, file = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
        if repo not in self.hub.repos:
            return self._error(401 if not self.headers.get("Authorization") else 404, "RepoNotFound")
        data = self.hub.repos[repo].get(file)
        if data is None:
            return self._error(404, "EntryNotFound")
        self.send_response(200)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _tree(self, rest: str) -> None:  # {org}/{name}/tree/{revision}/{folder}
        parts = rest.split("/")
        repo, folder = f"{parts[0]}/{parts[1]}", "/".join(parts[4:])
        files = self.hub.repos.get(repo, {})
        entries = [{"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                   for p, d in files.items() if p.startswith(folder + "/")]  # fmt: skip
        if repo not in self.hub.repos or not entries:
            return self._error(404, "EntryNotFound" if repo in self.hub.repos else "RepoNotFound")
        data = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, code: str) -> None:
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(body=True)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(body=False)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub(bpe_tokenizer_dir: Path) -> Iterator[Hub]:
    files = {
        "tokenizer.json": (bpe_tokenizer_dir / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": json.dumps({"bos_token": "<s>", "eos_token": "<|endoftext|>"}).encode(),
        "chat_template.jinja": CHATML_TEMPLATE.encode(),
        "additional_chat_templates/tool_use.jinja": b"{{ messages }}",
        "model.safetensors": b"weights are never fetched",
    }
    state = Hub({"acme/tiny-chat": files})
    handler = type("Handler", (_Handler,), {"hub": state})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def run(tmp_path: Path, hub: Hub, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m packtool ARGS` with HF_ENDPOINT on the fake hub and the cache in tmp_path."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    base.update(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HOME=str(tmp_path / "hf_home"),
                HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")  # fmt: skip
    base.update(env)
    return subprocess.run([sys.executable, "-m", "packtool", *args], env=base, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)  # fmt: skip


def test_a_hub_tokenizer_is_downloaded_then_read_from_the_cache(tmp_path: Path, hub: Hub) -> None:
    src = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hello"},
                                                              {"role": "assistant", "content": "world"}]}])  # fmt: skip
    args = ("tokenize", str(src), "--format", "chat", "--tokenizer", "acme/tiny-chat", "--output")
    done = run(tmp_path, hub, *args, str(tmp_path / "s"), "-q", HF_TOKEN="hf_secret")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # -q and not a terminal: no bars, no warnings
    store = open_token_store(tmp_path / "s")
    assert store.manifest["tokenizer"]["name"] == "acme/tiny-chat"
    assert store.loss is not None and store.manifest["eos"]["enabled"] is False  # the chat template was fetched
    snapshot = tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / COMMIT
    fetched = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert fetched == ["additional_chat_templates/tool_use.jinja", "chat_template.jinja", "tokenizer.json",
                       "tokenizer_config.json"]  # fmt: skip
    got = [(m, p.split("?")[0]) for m, p, _ in hub.requests]
    assert ("GET", f"/acme/tiny-chat/resolve/{COMMIT}/tokenizer.json") in got
    assert not any("safetensors" in p for _, p in got)
    assert all(auth == "Bearer hf_secret" for _, _, auth in hub.requests), hub.requests
    # the second run reads the cache: not one request, even offline
    hub.requests.clear()
    again = run(tmp_path, hub, *args, str(tmp_path / "s2"), "-q", HF_HUB_OFFLINE="1")
    assert again.returncode == 0, again.stderr
    assert hub.requests == []
    assert (tmp_path / "s2" / "tokens.bin").read_bytes() == (tmp_path / "s" / "tokens.bin").read_bytes()


def test_absent_and_unreachable_are_one_line(tmp_path: Path, hub: Hub) -> None:
    src = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}]))
    absent = run(tmp_path, hub, "tokenize", src, "--tokenizer", "acme/nope", "--output", str(tmp_path / "n"))
    lines = absent.stderr.strip().splitlines()
    assert absent.returncode == 1 and len(lines) == 1 and "Traceback" not in absent.stderr, absent.stderr
    assert "the hub has no repo acme/nope" in lines[0] and "HF_TOKEN" in lines[0] and not (tmp_path / "n").exists()
    hub.repos["acme/spm-only"] = {"tokenizer.model": b"sentencepiece", "tokenizer_config.json": b"{}"}
    spm = run(tmp_path, hub, "tokenize", src, "--tokenizer", "acme/spm-only", "--output", str(tmp_path / "m"))
    lines = spm.stderr.strip().splitlines()
    assert spm.returncode == 1 and len(lines) == 1 and "hub repo acme/spm-only has no tokenizer.json" in lines[0]
    assert "save_pretrained(DIR)" in lines[0], spm.stderr
    dead = run(tmp_path, hub, "tokenize", src, "--tokenizer", "acme/tiny-chat", "--output", str(tmp_path / "d"),
               HF_ENDPOINT="http://127.0.0.1:9")  # fmt: skip  (the discard port: nothing listens)
    lines = dead.stderr.strip().splitlines()
    assert dead.returncode == 1 and len(lines) == 1 and "Traceback" not in dead.stderr, dead.stderr
    assert "'acme/tiny-chat' is not a local path, and downloading it from the hub failed" in lines[0] and "hf download acme/tiny-chat" in lines[0]
    assert not (tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots").exists()


def test_offline_names_the_hf_command_and_asks_nothing(tmp_path: Path, hub: Hub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    src = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}]))
    line = cli_error("tokenize", src, "--tokenizer", "Qwen/Qwen2.5-0.5B-Instruct", "--output", str(tmp_path / "o"))
    assert "HF_HUB_OFFLINE" in line and "huggingface-cli" not in line
    assert 'hf download Qwen/Qwen2.5-0.5B-Instruct --include "*.json" --include "*.jinja"' in line
    assert hub.requests == [] and not (tmp_path / "o").exists()
