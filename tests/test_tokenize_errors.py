"""Failure paths of `packtool tokenize`: bad records (fail/skip), outputs, interrupted runs and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import cli, crashing_executor, write_jsonl, zipf_texts

import packtool
from packtool.errors import UsageError
from packtool.exec.local import process_executor as local_executor
from packtool.formats.token_store import open_token_store

BAD_RECORDS = [
    (b'{"text": "ok"}\n{"text": "unterminated\n', 2, "malformed JSON"),
    (b'{"text": "ok"}\n{"text": "ok"}\n{"text": "\xff\xfe"}\n', 3, "invalid UTF-8"),
    (b'{"text": "ok"}\n{"body": "no text"}\n', 2, "missing field 'text'"),
    (b'{"text": 42}\n', 1, "not a string"),
    (b'[1, 2]\n', 1, "not an object"),
]


@pytest.mark.parametrize(("data", "line", "reason"), BAD_RECORDS)
def test_bad_record_fails_with_one_line_naming_file_and_line(tmp_path: Path, bpe_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str],
                                                             data: bytes, line: int, reason: str) -> None:
    (tmp_path / "in.jsonl").write_bytes(data)
    out = tmp_path / "s"
    code, _, err = cli(*["tokenize", str(tmp_path / "in.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out), "-q"])
    assert code == 1
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert f"in.jsonl:{line}" in err and reason in err and "--on-error skip" in err
    assert not out.exists()


def test_bad_chat_role_fails_via_cli(tmp_path: Path, bpe_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "a"}]}, {"messages": [{"role": "bot", "content": "b"}]}])
    code, _, err = cli(*["tokenize", str(tmp_path / "c.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "s"), "--format", "chat", "-q"])
    assert code == 1 and err.count("\n") == 1 and "c.jsonl:2" in err and "unknown role 'bot'" in err


def test_skip_mode_keeps_the_rest_and_logs_rejects(tmp_path: Path, bpe_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = zipf_texts(20, seed=31)
    lines = [json.dumps({"text": t}).encode() for t in good]
    lines.insert(3, b'{"text": ')
    lines.insert(9, b'{"text": "\xff"}')
    lines.insert(15, b'{"other": 1}')
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "b.jsonl").write_bytes(b"")  # an empty file next to real data is fine (records 0)
    code, out, err = cli(*["tokenize", str(tmp_path), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"),
                              "--on-error", "skip", "--chunk-bytes", "200", "-q"])
    assert code == 0, err
    assert "3 rejected" in out
    rejects = [json.loads(x) for x in (tmp_path / "s" / "rejects.jsonl").read_text().splitlines()]
    assert [(Path(r["source"]).name, r["line"]) for r in rejects] == [("a.jsonl", 4), ("a.jsonl", 10), ("a.jsonl", 16)]
    assert [r["reason"].split(" ")[0] for r in rejects] == ["malformed", "invalid", "missing"]
    store = open_token_store(tmp_path / "s", check_hashes=True)
    assert store.n_documents == 20 and "rejects.jsonl" in store.manifest["files"]
    assert [(s["records"], s["documents"], s["rejected"]) for s in store.manifest["sources"]] == [(23, 20, 3), (0, 0, 0)]


def test_no_documents_at_all_is_an_error(tmp_path: Path, bpe_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    code, _, err = cli(*["tokenize", str(tmp_path / "empty.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "s"), "-q"])
    assert code == 1 and "no documents to tokenize" in err and "empty.jsonl" in err and err.count("\n") == 1
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("tokenizer", ["missing/dir/tokenizer.json", "./nowhere"])
def test_missing_tokenizer_is_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: str) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "x"}])
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(tmp_path / tokenizer), "--output",
                            str(tmp_path / "s")])
    assert code == 1 and err.startswith("error: tokenizer") and "does not exist" in err and err.count("\n") == 1


def test_overwrite_rules(tmp_path: Path, bpe_tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(30, seed=32)])
    args = ["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"), "-q"]
    assert cli(*args)[0] == 0
    before = (tmp_path / "s" / "tokens.bin").read_bytes()
    code, out, _ = cli(*args)  # the same command again: nothing to do
    assert code == 0 and "up to date" in out
    code, _, err = cli(*[*args, "--no-eos"])  # a different store at the same place
    assert code == 1 and "already holds a different token store" in err and "--overwrite" in err
    assert (tmp_path / "s" / "tokens.bin").read_bytes() == before
    code, _, err = cli(*[*args, "--no-eos", "--overwrite"])
    assert code == 0, err
    assert len((tmp_path / "s" / "tokens.bin").read_bytes()) == len(before) - 2 * 30  # 30 EOS fewer
    (tmp_path / "f").write_text("x")
    code, _, err = cli(*[*args[:-2], str(tmp_path / "f")])
    assert code == 1 and "not a directory" in err


def test_crash_mid_run_resumes_from_journal_with_same_bytes(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(800, seed=33)])

    def cfg(out: str) -> packtool.TokenizeConfig:
        return packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(bpe_tokenizer_dir),
                                       output=str(tmp_path / out), chunk_bytes=5000, workers=1)

    reference = packtool.tokenize_corpus(cfg("ref"))
    assert reference.n_chunks > 10

    with pytest.raises(KeyboardInterrupt):
        packtool.tokenize_corpus(cfg("s"), executor=crashing_executor(4))
    assert not (tmp_path / "s").exists() and (tmp_path / ".s.partial" / "journal.jsonl").is_file()
    resumed = packtool.tokenize_corpus(cfg("s"), executor=local_executor(2))
    assert resumed.reused_chunks == 4
    for name in ("tokens.bin", "tokens.boundaries", "manifest.json"):
        a, b = (tmp_path / "ref" / name).read_bytes(), (tmp_path / "s" / name).read_bytes()
        assert a == b or name == "manifest.json" and json.loads(a)["files"] == json.loads(b)["files"]
    assert not (tmp_path / ".s.partial").exists()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_cli_leaves_nothing_final_and_rerun_matches(tmp_path: Path, bpe_tokenizer_dir: Path, sig: int) -> None:
    rows = [{"text": t} for t in zipf_texts(4000, seed=34, max_words=1500)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    cmd = [sys.executable, "-m", "packtool", "tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_tokenizer_dir),
           "--chunk-bytes", "20000", "--workers", "1", "-q", "--output"]
    proc = subprocess.Popen([*cmd, str(tmp_path / "s")], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    journal = tmp_path / ".s.partial" / "journal.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and journal.read_text().count("\n") >= 2:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed; make the input bigger"
    os.kill(proc.pid, sig)
    proc.wait(timeout=30)
    assert not (tmp_path / "s").exists()
    done = subprocess.run([*cmd, str(tmp_path / "s")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert " 0/" not in done.stdout and "chunks reused" in done.stdout  # it resumed
    fresh = subprocess.run([*cmd, str(tmp_path / "fresh")], capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 0, fresh.stderr
    for name in ("tokens.bin", "tokens.boundaries"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "fresh" / name).read_bytes()
    assert not list(tmp_path.glob(".s*"))  # no staging or work directory left behind


@pytest.mark.parametrize(("flags", "code", "reason"), [(["--executor", "nope"], 2, "'nope' is not one of"),
                                                      (["--ray-address", "auto"], 2, "--ray-address needs --executor ray")])
def test_bad_executor_flags_fail_before_any_work(tmp_path: Path, bpe_tokenizer_dir: Path, flags: list[str], code: int,
                                                reason: str) -> None:
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello"}])
    got, _, err = cli(*["tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"), *flags])
    assert got == code and reason in err and "Traceback" not in err, err
    assert flags[0] == "--executor" or err.count("\n") == 1  # typer's own usage box, or one line
    assert not list(tmp_path.glob(".s*"))  # no partial directory: choices are checked before any work
    assert not (tmp_path / "s").exists()


def test_resume_redoes_chunks_whose_staged_bytes_were_damaged(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The journal's marks carry the sha256 of the store so far: a damaged tail is cut off and redone."""
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(800, seed=35)])
    (tmp_path / "b.jsonl").write_bytes(b'{"text": "x"}\nnot json\n')

    def cfg(out: str) -> packtool.TokenizeConfig:
        return packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")),
                                       tokenizer=str(bpe_tokenizer_dir), output=str(tmp_path / out), chunk_bytes=5000,
                                       workers=2, on_error="skip")  # type: ignore[arg-type]

    reference = packtool.tokenize_corpus(cfg("ref"))

    with pytest.raises(KeyboardInterrupt):
        packtool.tokenize_corpus(cfg("s"), executor=crashing_executor(6))
    staged = tmp_path / ".s.partial" / "store" / "tokens.bin"
    data = bytearray(staged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a byte in the middle of the six chunks written
    staged.write_bytes(bytes(data))
    resumed = packtool.tokenize_corpus(cfg("s"))
    assert 0 < resumed.reused_chunks < 6
    for name in ("tokens.bin", "tokens.boundaries", "rejects.jsonl"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    assert resumed.manifest["files"] == reference.manifest["files"]
    assert open_token_store(tmp_path / "s", check_hashes=True).n_tokens == reference.manifest["n_tokens"]


def test_an_empty_separator_is_a_usage_error(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`--separator ""` was read as no separator (one document per file), silently."""
    (tmp_path / "a.txt").write_text("one\n\ntwo")
    code, _, err = cli("tokenize", str(tmp_path / "a.txt"), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                       str(tmp_path / "s"), "--separator", "", "-q")
    assert code == 2 and err.startswith("error: --separator is empty") and err.count("\n") == 1, err
    assert not (tmp_path / "s").exists() and not list(tmp_path.glob(".s*"))
    with pytest.raises(UsageError, match="--separator is empty"):
        packtool.TokenizeConfig(inputs=(str(tmp_path / "a.txt"),), tokenizer="t", output="o", separator="").validate()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("workers", 0, "--workers must be >= 1"), ("chunk_bytes", 0, "--chunk-bytes must be >= 1"),
    ("max_record_bytes", 0, "--max-record-bytes must be >= 1"), ("num_shards", 0, "--num-shards must be at least 1"),
    ("format", "xml", "--format 'xml' is not one of"), ("inputs", (), "no inputs given"),
])
def test_out_of_domain_values_are_usage_errors_in_the_api(field: str, value: object, message: str) -> None:
    """They were ConfigError (exit 1, a data problem) where every other stage says UsageError (exit 2)."""
    kwargs = {"inputs": ("a.jsonl",), "tokenizer": "t", "output": "o", field: value}
    with pytest.raises(UsageError, match=message):
        packtool.TokenizeConfig(**kwargs).validate()  # type: ignore[arg-type]


def test_a_full_disk_at_the_manifest_leaves_no_temp_file(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full tmpfs: the manifest's buffered bytes failed to flush (ENOSPC), then failed again in the cleanup's
    close(), so `.manifest.json.tmp-PID` stayed in the work directory. Now one line and no temp file."""
    import builtins
    import errno

    from packtool.formats import atomic

    class FullDisk:
        """A file whose writes are buffered and whose every flush fails, as a file on a full disk."""

        def __init__(self, fh: object) -> None:
            self.fh = fh

        def write(self, data: bytes) -> int:
            return len(data)

        def fileno(self) -> int:
            return self.fh.fileno()  # type: ignore[attr-defined]

        def flush(self) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self) -> None:
            self.fh.close()  # type: ignore[attr-defined]
            self.flush()

    def full_open(path: object, mode: str = "r", *args: object) -> object:
        fh = builtins.open(path, mode, *args)  # type: ignore[call-overload]  # noqa: SIM115 - closed by atomic_file
        return FullDisk(fh) if "manifest.json" in str(path) else fh

    monkeypatch.setattr(atomic, "open", full_open, raising=False)
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(20, seed=3)])
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "s"),
                       "-q", "--workers", "1")
    assert code == 1 and err.count("\n") == 1 and "No space left on device" in err, err
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name], list(tmp_path.rglob("*"))
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("which", ["tokenizer_config.json", "special_tokens_map.json", "--chat-template"])
def test_a_side_file_that_never_ends_is_refused_unread(tmp_path: Path, bpe_tokenizer_dir: Path, which: str) -> None:
    """A tokenizer_config.json or a --chat-template linked to /dev/zero was read until a MemoryError traceback."""
    import shutil

    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    tok = tmp_path / "tok"
    shutil.copytree(bpe_tokenizer_dir, tok)
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                          {"role": "assistant", "content": "yo"}]}])
    flags = ["--format", "chat"]
    if which == "--chat-template":
        (tmp_path / "t.jinja").symlink_to("/dev/zero")
        flags += ["--chat-template", str(tmp_path / "t.jinja")]
    else:
        (tok / which).unlink(missing_ok=True)
        (tok / which).symlink_to("/dev/zero")
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "s"), "-q", *flags)
    assert code == 1 and err.count("\n") == 1 and "is not read: it is not a regular file" in err, err[-500:]
    assert (which if which != "--chat-template" else "t.jinja") in err and not (tmp_path / "s").exists()


def test_a_kill_while_later_inputs_are_still_hashed_keeps_the_chunks_of_files_hashed(
    tmp_path: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks are trusted on resume only once their files' sha256 is journaled. The digests were journaled all
    at once, when the last input was hashed: a run killed while a long input list was still being hashed
    redid every chunk (0 reused). Each file's digest is now journaled as soon as that file is hashed."""
    import threading

    from packtool.stages.tokenize.inputs import plan

    for name, seed in (("a", 36), ("b", 37)):
        write_jsonl(tmp_path / f"{name}.jsonl", [{"text": t} for t in zipf_texts(400, seed=seed)])
    inputs = (str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"))

    def cfg(out: str) -> packtool.TokenizeConfig:
        return packtool.TokenizeConfig(inputs=inputs, tokenizer=str(bpe_tokenizer_dir), output=str(tmp_path / out),
                                       chunk_bytes=5000, workers=1)

    packtool.tokenize_corpus(cfg("ref"))
    a_chunks = sum(1 for c in plan.plan_chunks([Path(p) for p in inputs], 5000)[1] if c.paths == (inputs[0],))
    hashed_a, release_b = threading.Event(), threading.Event()
    real_sha256 = plan._sha256

    def slow_b(path: str) -> str:  # b.jsonl stands for the rest of a long list, still being hashed at the kill
        if path.endswith("b.jsonl"):
            release_b.wait(30)
        digest = real_sha256(path)
        hashed_a.set()
        return digest

    def crash_after_a_is_hashed(tasks):  # type: ignore[no-untyped-def]
        for i, task in enumerate(tasks):
            if i == 4:
                raise KeyboardInterrupt
            hashed_a.wait(30)
            yield task.run()

    monkeypatch.setattr(plan, "_sha256", slow_b)
    try:
        with pytest.raises(KeyboardInterrupt):
            packtool.tokenize_corpus(cfg("s"), executor=crash_after_a_is_hashed)
    finally:
        release_b.set()
    monkeypatch.setattr(plan, "_sha256", real_sha256)
    assert a_chunks > 4
    resumed = packtool.tokenize_corpus(cfg("s"))
    assert resumed.reused_chunks == 4
    for name in ("tokens.bin", "tokens.boundaries"):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
