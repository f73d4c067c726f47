"""`--tokenizer ORG/NAME` not in the cache: downloaded with huggingface_hub from HF_ENDPOINT into HF_HUB_CACHE.

Every test talks to a loopback hub on 127.0.0.1 (`hub_loopback.py`) that answers as the hub does for what
huggingface_hub asks. The CLI runs in a subprocess, as a user runs it: the
hub client reads its settings when it is imported. Never the real network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_loopback import Hub, loopback_hub
from support import CHATML_TEMPLATE, cli_error, write_jsonl

from packtool.formats.token_store import open_token_store

pytest.importorskip("huggingface_hub")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def hub(bpe_tokenizer_dir: Path) -> Iterator[Hub]:
    files = {
        "tokenizer.json": (bpe_tokenizer_dir / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": json.dumps({"bos_token": "<s>", "eos_token": "<|endoftext|>"}).encode(),
        "chat_template.jinja": CHATML_TEMPLATE.encode(),
        "additional_chat_templates/tool_use.jinja": b"{{ messages }}",
        "model.safetensors": b"weights are never fetched",
    }
    with loopback_hub(lifetime=300) as state:
        state.model("acme/tiny-chat", files)
        yield state


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
    commit = hub.repo("model", "acme/tiny-chat").refs["main"]
    snapshot = tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / commit
    fetched = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert fetched == ["additional_chat_templates/tool_use.jinja", "chat_template.jinja", "tokenizer.json",
                       "tokenizer_config.json"]  # fmt: skip
    got = [(m, p.split("?")[0]) for m, p, _ in hub.requests]
    assert ("GET", f"/acme/tiny-chat/resolve/{commit}/tokenizer.json") in got
    assert (tmp_path / "hub" / "models--acme--tiny-chat" / "refs" / "main").read_text() == commit
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
    assert "the hub has no model repo acme/nope" in lines[0] and "HF_TOKEN" in lines[0] and not (tmp_path / "n").exists()
    hub.model("acme/spm-only", {"tokenizer.model": b"sentencepiece", "tokenizer_config.json": b"{}"})
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


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_a_truncated_download_is_one_line_and_a_later_quiet_run_says_nothing(tmp_path: Path, hub: Hub) -> None:
    """Full Content-Length, half the body: huggingface_hub's retry warnings (13 lines before) never show."""
    src = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}]))
    hub.faults["tokenizer.json"] = "truncate"
    args = ("tokenize", src, "--tokenizer", "acme/tiny-chat", "--output")
    line = _one_error_line(run(tmp_path, hub, *args, str(tmp_path / "bad")))
    assert "tokenizer.json" in line and "acme/tiny-chat" in line and "retry" in line, line
    assert not (tmp_path / "bad").exists()
    tries = [p for m, p, _ in hub.requests if m == "GET" and p.endswith("/tokenizer.json")]
    assert 1 <= len(tries) <= 4, tries  # three resumes at most without a new byte (six before, and 13 lines)
    del hub.faults["tokenizer.json"]
    ok = run(tmp_path, hub, *args, str(tmp_path / "ok"), "-q")
    assert ok.returncode == 0 and ok.stderr == "", ok.stderr


def test_a_stalled_download_fails_after_one_timeout_not_six(tmp_path: Path, hub: Hub) -> None:
    """A Content-Length 100 bytes over the body, the connection left open: one read timeout, then one line
    (it took 6 retries x the timeout, 66 s at the default 10 s)."""
    src = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}]))
    hub.faults["tokenizer.json"] = "overlong"
    start = time.monotonic()
    done = run(tmp_path, hub, "tokenize", src, "--tokenizer", "acme/tiny-chat", "--output", str(tmp_path / "s"),
               HF_HUB_DOWNLOAD_TIMEOUT="2")  # fmt: skip
    took = time.monotonic() - start
    line = _one_error_line(done)
    assert "stalled" in line and "HF_HUB_DOWNLOAD_TIMEOUT" in line, line
    assert took < 2 * 2 + 6, took  # one timeout (+ the start of python); six would be >= 12 s


def test_a_tokenizer_revision_is_fetched_recorded_and_read_offline(tmp_path: Path, hub: Hub,
                                                                   bpe_tokenizer_dir: Path) -> None:  # fmt: skip
    old = {"tokenizer.json": (bpe_tokenizer_dir / "tokenizer.json").read_bytes(),
           "tokenizer_config.json": json.dumps({"eos_token": "<|endoftext|>"}).encode()}  # fmt: skip
    sha = hub.model("acme/tiny-chat", old, "v1")
    src = str(write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}]))
    args = ("tokenize", src, "--tokenizer", "acme/tiny-chat@v1", "--output")
    done = run(tmp_path, hub, *args, str(tmp_path / "s"), "-q")
    assert done.returncode == 0, done.stderr
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    assert (repo / "refs" / "v1").read_text() == sha and not (repo / "refs" / "main").exists()
    assert sorted(p.name for p in (repo / "snapshots" / sha).iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    store = open_token_store(tmp_path / "s")
    assert store.manifest["tokenizer"]["name"] == "acme/tiny-chat@v1"
    hub.requests.clear()
    again = run(tmp_path, hub, *args, str(tmp_path / "s2"), "-q", HF_HUB_OFFLINE="1")
    assert again.returncode == 0 and hub.requests == [], again.stderr
    pinned = run(tmp_path, hub, *args[:3] + ("acme/tiny-chat@" + sha, "--output"), str(tmp_path / "s3"), "-q",
                 HF_HUB_OFFLINE="1")  # fmt: skip  (a commit names its snapshot directly)
    assert pinned.returncode == 0, pinned.stderr
    line = _one_error_line(run(tmp_path, hub, *args[:-2], "acme/tiny-chat@v9", "--output", str(tmp_path / "n")))
    assert "has no revision 'v9'" in line, line
