"""Hostile inputs, table-driven: every case through the CLI -> exit 1, ONE `error:` line, no traceback.

For every case also: nothing appears under the final name, the previous store next to it is
byte-identical, every file that was there before is still there unchanged (packtool deletes only
what it wrote), and no lock / staging / moved-aside directory is left behind.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import CHATML_TEMPLATE, cli, zipf_texts

ROOT = Path(__file__).resolve().parents[1]
IS_ROOT = os.geteuid() == 0
SETPRIV = shutil.which("setpriv")


def lines(rows: list[object]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


GOOD = lines([{"text": t} for t in zipf_texts(60, seed=9)])


def zstd_frames(data: bytes, n: int) -> list[bytes]:
    """`data` as n independently compressed frames (line-aligned, as streaming writers flush them)."""
    cuts = [0] + [data.index(b"\n", len(data) * i // n) + 1 for i in range(1, n)] + [len(data)]
    return [zstandard.ZstdCompressor(write_checksum=True).compress(data[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]


def big_block_zstd(data: bytes) -> bytes:
    """One frame of several 128 KiB blocks (incompressible-ish data so the blocks are large)."""
    return zstandard.ZstdCompressor(level=1, write_checksum=False).compress(data)


@dataclass
class Ws:
    """A case's workspace: `data/` inputs, `tok/` tokenizer, `prev/` a finished store, `out` the target."""

    root: Path
    tok: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def out(self) -> Path:
        return self.root / "out"

    def write(self, name: str, data: bytes | str) -> str:
        path = self.data / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return str(path)

    def tokenize(self, *inputs: str, extra: tuple[str, ...] = (), out: Path | None = None) -> list[str]:
        dest = self.out if out is None else out
        return ["tokenize", *inputs, "--tokenizer", str(self.tok), "--output", str(dest), "-q", "--workers", "1", *extra]


def _truncated_zstd_mid_frame(ws: Ws) -> list[str]:
    frames = zstd_frames(GOOD, 4)
    data = b"".join(frames)
    return ws.tokenize(ws.write("a.jsonl.zst", data[: len(data) - len(frames[-1]) // 2]))


def _truncated_zstd_in_checksum(ws: Ws) -> list[str]:
    data = b"".join(zstd_frames(GOOD, 3))
    return ws.tokenize(ws.write("a.jsonl.zst", data[:-2]))


def _truncated_zstd_block_boundary(ws: Ws) -> list[str]:
    raw = os.urandom(300_000).hex().encode()  # 600 KB of hex: several 128 KiB blocks in one frame
    doc = lines([{"text": raw[i : i + 1000].decode()} for i in range(0, len(raw), 1000)])
    data = big_block_zstd(doc)
    pos, cut = 4, None
    fhd = data[pos]
    pos += 1 + (0 if (fhd >> 5) & 1 else 1) + [0, 1, 2, 4][fhd & 3] + [0, 2, 4, 8][fhd >> 6] + (
        1 if (fhd >> 5) & 1 and fhd >> 6 == 0 else 0
    )
    header = int.from_bytes(data[pos : pos + 3], "little")
    cut = pos + 3 + (header >> 3)  # the end of the first block: a clean block boundary inside the frame
    assert not header & 1 and cut < len(data)
    return ws.tokenize(ws.write("a.jsonl.zst", data[:cut]))


def _truncated_zstd_skip(ws: Ws) -> list[str]:
    return [*_truncated_zstd_mid_frame(ws), "--on-error", "skip"]


def _truncated_gz(ws: Ws) -> list[str]:
    data = gzip.compress(GOOD)
    return ws.tokenize(ws.write("a.jsonl.gz", data[: len(data) * 2 // 3]), extra=("--on-error", "skip"))


def _corrupted_gz(ws: Ws) -> list[str]:
    data = bytearray(gzip.compress(GOOD))
    for i in range(len(data) // 2, len(data) // 2 + 40):
        data[i] ^= 0x5A
    return ws.tokenize(ws.write("a.jsonl.gz", bytes(data)))


def _parquet(ws: Ws, corrupt: str) -> list[str]:
    path = ws.data / "a.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in zipf_texts(3000, seed=5)]), path, row_group_size=1000)
    data = bytearray(path.read_bytes())
    if corrupt == "page":
        for i in range(len(data) // 4, len(data) // 4 + 64):
            data[i] ^= 0xFF
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))
    return ws.tokenize(str(path))


def _parquet_long_row(ws: Ws, nested: bool) -> list[str]:
    path = ws.data / "a.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    if nested:  # chat: the size of a row counts the strings inside its messages
        rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a" * n}]}
                for n in (10, 20, 600, 1600, 30)]
        extra: tuple[str, ...] = ("--format", "chat", "--max-record-bytes", "1000")
    else:
        rows = [{"text": t, "id": i} for i, t in enumerate(["short", "x" * 1500, "also short"])]
        extra = ("--max-record-bytes", "1000")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
    return ws.tokenize(str(path), extra=extra)


def _tokenizer_config(ws: Ws, content: str) -> list[str]:
    tok = ws.root / "tok2"
    shutil.copytree(ws.tok, tok)
    (tok / "tokenizer_config.json").write_text(content)
    return ["tokenize", ws.write("a.jsonl", GOOD), "--tokenizer", str(tok), "--output", str(ws.out), "-q"]


def _template(ws: Ws, content: bytes | None) -> list[str]:
    path = ws.root / "t.jinja"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    return ws.tokenize(ws.write("c.jsonl", lines(rows)), extra=("--format", "chat", "--chat-template", str(path)))


def _overwrite_inputs_dir(ws: Ws) -> list[str]:
    a = ws.write("a.jsonl", GOOD)
    ws.write("notes.md", "mine")
    return ws.tokenize(a, out=ws.data, extra=("--overwrite",))


def _overwrite_foreign_dir(ws: Ws) -> list[str]:
    (ws.out / "sub").mkdir(parents=True)
    (ws.out / "thesis.tex").write_text("years of work")
    (ws.out / "sub" / "x.bin").write_bytes(b"\0" * 10)
    return ws.tokenize(ws.write("a.jsonl", GOOD), extra=("--overwrite",))


def _overwrite_store_with_extra_file(ws: Ws) -> list[str]:
    shutil.copytree(ws.root / "prev", ws.out)
    (ws.out / "notes.txt").write_text("mine")
    return ws.tokenize(ws.write("a.jsonl", lines([{"text": "other"}])), extra=("--overwrite",))


def _overwrite_store_holding_input(ws: Ws) -> list[str]:
    shutil.copytree(ws.root / "prev", ws.out)
    return ws.tokenize(str(ws.out / "rejects.jsonl"), extra=("--overwrite",))


def _max_record(ws: Ws) -> list[str]:
    big = json.dumps({"text": "x" * 5000})
    return ws.tokenize(ws.write("a.jsonl", GOOD + big.encode() + b"\n"), extra=("--max-record-bytes", "1000"))


def _held_lock(ws: Ws) -> list[str]:
    """Another process holds the output's lock (the losing side of two concurrent runs)."""
    ready = ws.root / "ready"
    code = (
        "import sys, time, pathlib; from packtool.formats.locks import exclusive_output\n"
        "with exclusive_output(sys.argv[1]):\n"
        "    pathlib.Path(sys.argv[2]).write_text('x'); time.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(ws.out), str(ready)], env=_env())
    ws.holder = holder  # type: ignore[attr-defined]
    for _ in range(300):
        if ready.exists():
            break
        time.sleep(0.05)
    return ws.tokenize(ws.write("a.jsonl", GOOD))


def _setpriv(args: list[str]) -> list[str]:
    """Run as root without the capabilities that bypass file permissions (or as is, when not root)."""
    if not IS_ROOT:
        return args
    drop = "-dac_override,-dac_read_search"
    return [str(SETPRIV), f"--inh-caps={drop}", f"--bounding-set={drop}", *args]


def _unreadable_input(ws: Ws) -> list[str]:
    path = ws.write("a.jsonl", GOOD)
    os.chmod(path, 0)
    return ws.tokenize(path)


def _unlistable_dir(ws: Ws, how: str) -> list[str]:
    ws.write("sub/a.jsonl", GOOD)
    os.chmod(ws.data / "sub", 0)
    return ws.tokenize({"dir": str(ws.data), "file": str(ws.data / "sub" / "a.jsonl"), "glob": str(ws.data / "sub" / "*.jsonl")}[how])


def _hidden_behind(ws: Ws, what: str) -> list[str]:
    """The tokenizer / chat template / run config sits in a directory that cannot be searched."""
    locked = ws.root / "locked"
    shutil.copytree(ws.tok, locked / "tok")
    (locked / "t.jinja").write_text(CHATML_TEMPLATE)
    (locked / "run.yaml").write_text("tokenize: {}\n")
    src = ws.write("a.jsonl", GOOD)
    os.chmod(locked, 0)
    if what == "tokenizer":
        return ["tokenize", src, "--tokenizer", str(locked / "tok"), "--output", str(ws.out), "-q"]
    if what == "template":
        return ws.tokenize(src, extra=("--format", "chat", "--chat-template", str(locked / "t.jinja")))
    return ["run", str(locked / "run.yaml")]


def _unwritable_parent(ws: Ws) -> list[str]:
    parent = ws.root / "ro"
    parent.mkdir()
    os.chmod(parent, 0o555)
    return ws.tokenize(ws.write("a.jsonl", GOOD), out=parent / "out")


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() then fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))


def _disk_full(ws: Ws) -> list[str]:
    return ws.tokenize(ws.write("a.jsonl", lines([{"text": t} for t in zipf_texts(6000, seed=3)])))


@dataclass(frozen=True)
class Case:
    name: str
    setup: Callable[[Ws], list[str]]
    expect: str
    subprocess: bool = False
    preexec: Callable[[], None] | None = None
    wrap: Callable[[list[str]], list[str]] | None = None
    needs: bool = True  # False: skipped on this machine

    def __str__(self) -> str:
        return self.name


CASES = [
    # 1: --overwrite replaces only a token store
    Case("overwrite-inputs-dir", _overwrite_inputs_dir, "holds the input"),
    Case("overwrite-foreign-dir", _overwrite_foreign_dir, "not a packtool token store"),
    Case("overwrite-store-with-user-file", _overwrite_store_with_extra_file, "also holds notes.txt"),
    Case("overwrite-store-holding-input", _overwrite_store_holding_input, "holds the input"),
    Case("output-is-a-file", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD), out=Path(ws.write("f.jsonl", GOOD))),
         "not a directory"),
    # 3: truncated / corrupted compressed inputs are file-level errors, also with --on-error skip
    Case("zst-cut-mid-frame", _truncated_zstd_mid_frame, "truncated"),
    Case("zst-cut-mid-frame-skip", _truncated_zstd_skip, "truncated"),
    Case("zst-cut-in-checksum", _truncated_zstd_in_checksum, "truncated"),
    Case("zst-cut-at-block-boundary", _truncated_zstd_block_boundary, "truncated"),
    Case("zst-garbage", lambda ws: ws.tokenize(ws.write("a.jsonl.zst", b"not zstd at all")), "not a zstd frame"),
    Case("gz-truncated-skip", _truncated_gz, "truncated"),
    Case("gz-corrupted", _corrupted_gz, "cannot decompress"),
    Case("parquet-corrupted-page", lambda ws: _parquet(ws, "page"), "cannot read parquet data"),
    Case("parquet-truncated", lambda ws: _parquet(ws, "cut"), "cannot read parquet"),
    # record-level classes (fail mode): file:line
    Case("malformed-json", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD + b'{"text": "x\n')), "a.jsonl:61"),
    Case("invalid-utf8", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD + b'{"text": "\xff"}\n')), "invalid UTF-8"),
    Case("missing-field", lambda ws: ws.tokenize(ws.write("a.jsonl", b'{"body": 1}\n')), "missing field 'text'"),
    # 7: bare JSON values are bad records, --field is never ignored
    Case("bare-string-record", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD + b'"x"\n')), "a.jsonl:61"),
    Case("bare-number-record", lambda ws: ws.tokenize(ws.write("a.jsonl", b'42\n')), "not an object"),
    Case("null-record", lambda ws: ws.tokenize(ws.write("a.jsonl", b"null\n")), "not an object"),
    Case("list-record", lambda ws: ws.tokenize(ws.write("a.jsonl", b'["a", "b"]\n')), "not an object"),
    Case("string-record-other-field",
         lambda ws: ws.tokenize(ws.write("a.jsonl", b'"x"\n'), extra=("--field", "body")), "'body'"),
    # empty / huge documents
    Case("empty-file", lambda ws: ws.tokenize(ws.write("a.jsonl", b"")), "no documents"),
    Case("blank-lines-only", lambda ws: ws.tokenize(ws.write("a.jsonl", b"\n  \n\n")), "no documents"),
    Case("record-over-max-record-bytes", _max_record, "over --max-record-bytes 1000"),
    Case("parquet-row-over-max-record-bytes", lambda ws: _parquet_long_row(ws, False), "a.parquet:2"),
    Case("parquet-chat-row-over-max-record-bytes", lambda ws: _parquet_long_row(ws, True), "a.parquet:4"),
    Case("txt-over-max-record-bytes",
         lambda ws: ws.tokenize(ws.write("a.txt", "y" * 3000), extra=("--max-record-bytes", "1000")), "a.txt:1"),
    # 6: tokenizer_config.json / mismatched tokenizer
    Case("tokenizer-config-list", lambda ws: _tokenizer_config(ws, "[1, 2]"), "tokenizer_config.json holds a JSON list"),
    Case("tokenizer-config-invalid-json", lambda ws: _tokenizer_config(ws, "{'bos': 1"), "not valid JSON"),
    Case("tokenizer-config-template-number", lambda ws: _tokenizer_config(ws, '{"chat_template": 7}'),
         "chat_template in tokenizer_config.json is a int"),
    Case("tokenizer-config-eos-number", lambda ws: _tokenizer_config(ws, '{"eos_token": 3}'), "eos_token"),
    Case("tokenizer-config-eos-unknown", lambda ws: _tokenizer_config(ws, '{"eos_token": "<nope>"}'),
         "not in the vocabulary"),
    Case("tokenizer-json-garbage", lambda ws: ["tokenize", ws.write("a.jsonl", GOOD), "--tokenizer",
                                               ws.write("tokenizer.json", "{}"), "--output", str(ws.out)],
         "cannot load tokenizer"),
    # 9 / 19: chat templates
    Case("template-syntax-error", lambda ws: _template(ws, b"{% for m in messages %}{{ m.content }"), "line 1"),
    Case("template-not-utf8", lambda ws: _template(ws, CHATML_TEMPLATE.encode() + b"\xff\xfe"), "not UTF-8"),
    Case("template-is-a-directory", lambda ws: _template(ws, None), "is a directory"),
    Case("template-empty", lambda ws: _template(ws, b"  \n"), "is empty"),
    Case("template-error-new-parents", lambda ws: [*_template(ws, b"{% if %}"), "--output",
                                                   str(ws.root / "new" / "deeper" / "out")], "does not compile"),
    Case("template-unknown-tag", lambda ws: _template(ws, b"{% frobnicate %}"), "does not compile"),
    Case("run-config-is-a-directory", lambda ws: ["run", str(ws.root / "prev")], "is a directory"),
    # 17
    Case("stats-of-a-jsonl", lambda ws: ["stats", ws.write("a.jsonl", GOOD)], "neither a token store"),
    # 9: environment
    Case("input-io-error", lambda ws: ws.tokenize(_symlink(ws, "/proc/self/mem", "mem.jsonl")),
         "cannot read the input (Input/output error)"),
    Case("output-under-proc", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD), out=Path("/proc/packtool-test-out")),
         "cannot write the output"),
    Case("input-not-readable", _unreadable_input, "cannot read the input (Permission denied)", subprocess=True,
         wrap=_setpriv, needs=not IS_ROOT or SETPRIV is not None),
    *[Case(f"input-under-unlistable-dir-{how}", lambda ws, how=how: _unlistable_dir(ws, how),
           "cannot read the input (Permission denied)", subprocess=True, wrap=_setpriv,
           needs=not IS_ROOT or SETPRIV is not None) for how in ("dir", "file", "glob")],
    *[Case(f"{what}-behind-unsearchable-dir", lambda ws, what=what: _hidden_behind(ws, what), "Permission denied",
           subprocess=True, wrap=_setpriv, needs=not IS_ROOT or SETPRIV is not None)
      for what in ("tokenizer", "template", "run-config")],
    Case("input-is-a-device", lambda ws: ws.tokenize(_symlink(ws, "/dev/zero", "zero.jsonl")), "not a regular file"),
    Case("output-under-a-file", lambda ws: ws.tokenize(ws.write("a.jsonl", GOOD), out=ws.data / "a.jsonl" / "out"),
         "a.jsonl is a file, not a directory"),
    Case("output-parent-not-writable", _unwritable_parent, "cannot write the output (Permission denied)",
         subprocess=True, wrap=_setpriv, needs=not IS_ROOT or SETPRIV is not None),
    Case("disk-full", _disk_full, "cannot write the output (File too large)", subprocess=True, preexec=_limit_file_size),
    Case("concurrent-writer", _held_lock, "being written by another packtool run (pid", subprocess=True),
]


def _symlink(ws: Ws, target: str, name: str) -> str:
    ws.data.mkdir(parents=True, exist_ok=True)
    os.symlink(target, ws.data / name)
    return str(ws.data / name)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (symlinks as their target) -> sha256; packtool's resume dir excluded."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if ".out.partial" in rel or ".data.partial" in rel:
            continue
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            try:
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
            except PermissionError:
                out[rel] = "unreadable"
    return out


@pytest.fixture(scope="module")
def prev_store(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer_dir: Path) -> Path:
    """A finished store (with rejects.jsonl) that every case keeps next to its output."""
    root = tmp_path_factory.mktemp("prev")
    (root / "p.jsonl").write_bytes(GOOD + b"{broken\n")
    store = root / "prev"
    code, _, err = cli("tokenize", str(root / "p.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(store),
                       "-q", "--on-error", "skip")
    assert code == 0, err
    return store


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_input_fails_with_one_line_and_touches_nothing(case: Case, tmp_path: Path, bpe_tokenizer_dir: Path,
                                                          prev_store: Path) -> None:
    if not case.needs:
        pytest.skip("needs setpriv to drop root's permission override")
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    shutil.copytree(prev_store, tmp_path / "prev")
    args = case.setup(ws)
    out_before = ws.out.exists()
    before = snapshot(tmp_path)
    dirs_before = {p for p in tmp_path.rglob("*") if p.is_dir()}
    try:
        if case.subprocess:
            command = [sys.executable, "-m", "packtool", *args]
            command = case.wrap(command) if case.wrap else command
            proc = subprocess.run(command, capture_output=True, text=True, env=_env(), preexec_fn=case.preexec,
                                  timeout=120, cwd=tmp_path)
            code, err = proc.returncode, proc.stderr
        else:
            code, _, err = cli(*args)
    finally:
        holder = getattr(ws, "holder", None)
        if holder is not None:
            holder.kill()
            holder.wait()
        for path in tmp_path.rglob("*"):  # let pytest clean up what the case made unreadable
            if not path.is_symlink():
                os.chmod(path, 0o755)
    assert code == 1, (code, err)
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert case.expect in err, err
    after = snapshot(tmp_path)
    lost = {k: v for k, v in before.items() if after.get(k) != v}
    assert not lost, f"changed or deleted: {sorted(lost)[:5]}"
    if not out_before:
        assert not ws.out.exists(), "something appeared under the final name"
    held = {".out.lock"} if case.name == "concurrent-writer" else set()  # the SIGKILLed holder's; the next run's
    leftovers = [p.name for p in tmp_path.rglob(".*") if not p.name.endswith(".partial") and p.name not in held]
    new_dirs = {p for p in tmp_path.rglob("*") if p.is_dir() and ".partial" not in p.as_posix()} - dirs_before
    assert not new_dirs, f"directories left behind: {sorted(map(str, new_dirs))[:3]}"
    assert not leftovers, leftovers


def test_generation_tag_template_is_one_line_or_works(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`{% generation %}` (TRL's assistant masks): supported by the chat work, else one error line, never a traceback."""
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    template = CHATML_TEMPLATE.replace(
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}",
        "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}{% endgeneration %}"
        "{% else %}{{ message['content'] }}{% endif %}",
    )
    code, _, err = cli(*_template(ws, template.encode()))
    assert code == 0 or (code == 1 and err.startswith("error: ") and err.count("\n") == 1), err


# ---- what hostile inputs must NOT break: accepted variants, skip mode, real races and signals ----


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def test_utf8_bom_is_accepted_in_jsonl_gz_and_txt(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    plain = [ws.write("p/a.jsonl", GOOD), ws.write("p/b.txt", "Héllo wörld.\n")]
    bom = [ws.write("b/a.jsonl.gz", gzip.compress(b"\xef\xbb\xbf" + GOOD)), ws.write("b/b.txt", b"\xef\xbb\xbfH\xc3\xa9llo w\xc3\xb6rld.\n")]
    assert cli(*ws.tokenize(*plain, out=tmp_path / "plain"))[0] == 0
    code, _, err = cli(*ws.tokenize(*bom, out=tmp_path / "bom"))
    assert code == 0, err
    a, b = store_bytes(tmp_path / "plain"), store_bytes(tmp_path / "bom")
    assert a["tokens.bin"] == b["tokens.bin"] and a["tokens.boundaries"] == b["tokens.boundaries"]


def test_a_bom_on_a_later_jsonl_line_is_named_as_a_bom_not_invalid_utf8(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Two files joined with `cat`: the second one's BOM was reported as "invalid UTF-8" (misleading)."""
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    joined = b'{"text": "a"}\n' + b'\xef\xbb\xbf{"text": "b"}\n' + b'{"text": "c"}\n'
    for name, data in (("a.jsonl", joined), ("a.jsonl.gz", gzip.compress(joined))):
        code, _, err = cli(*ws.tokenize(ws.write(name, data), out=tmp_path / name))
        assert code == 1 and err.count("\n") == 1 and "invalid UTF-8" not in err, err
        assert "byte order mark (BOM) starts this line" in err and f"{name}:2" in err, err
        code, _, err = cli(*ws.tokenize(str(ws.data / name), out=tmp_path / f"skip-{name}", extra=("--on-error", "skip")))
        assert code == 0, err
        rejects = [json.loads(x) for x in (tmp_path / f"skip-{name}" / "rejects.jsonl").read_text().splitlines()]
        assert [(r["line"], "BOM" in r["reason"]) for r in rejects] == [(2, True)]
    bad = ws.write("u.jsonl", b'{"text": "a"}\n{"text": "\xff"}\n')  # real invalid UTF-8 keeps its words
    assert "invalid UTF-8" in cli(*ws.tokenize(bad, out=tmp_path / "u"))[2]


def test_skip_rejects_overlong_and_bare_records_with_their_lines(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    good = [{"text": t} for t in zipf_texts(10, seed=2)]
    rows = [json.dumps(r).encode() for r in good]
    rows[2:2] = [json.dumps({"text": "z" * 3000}).encode(), b'"a bare string"', b"7", b"null", b'{"text": ']
    path = ws.write("a.jsonl", b"\n".join(rows) + b"\n")
    code, out, err = cli(*ws.tokenize(path, extra=("--on-error", "skip", "--max-record-bytes", "2000")))
    assert code == 0, err
    rejects = [json.loads(x) for x in (ws.out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [3, 4, 5, 6, 7]
    assert "over --max-record-bytes 2000" in rejects[0]["reason"] and "malformed JSON" in rejects[4]["reason"]
    assert all("not an object" in r["reason"] for r in rejects[1:4])
    manifest = json.loads((ws.out / "manifest.json").read_text())
    assert manifest["n_documents"] == 10 and manifest["n_rejected"] == 5


def test_complete_multi_frame_zstd_with_skippable_frame_reads_every_record(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    skippable = (0x184D2A50).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    data = skippable + b"".join(zstd_frames(GOOD, 5))
    assert cli(*ws.tokenize(ws.write("a.jsonl", GOOD), out=tmp_path / "plain"))[0] == 0
    code, _, err = cli(*ws.tokenize(ws.write("b.jsonl.zst", data), out=tmp_path / "zst"))
    assert code == 0, err
    assert store_bytes(tmp_path / "plain")["tokens.bin"] == store_bytes(tmp_path / "zst")["tokens.bin"]


def _slow_corpus(ws: Ws) -> str:
    return ws.write("big.jsonl", lines([{"text": t} for t in zipf_texts(40_000, seed=8)]) * 2)


def _spawn(ws: Ws, out: Path, src: str) -> subprocess.Popen[str]:
    args = [*ws.tokenize(src, out=out)[:-2], "--workers", "2", "--chunk-bytes", "200000"]
    return subprocess.Popen([sys.executable, "-m", "packtool", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())


def _wait_for(path: Path, proc: subprocess.Popen[str], lines_needed: int = 1) -> None:
    for _ in range(1200):
        if path.is_file() and path.read_text().count("\n") >= lines_needed or proc.poll() is not None:
            return
        time.sleep(0.01)


def test_two_concurrent_runs_the_second_fails_with_one_line_naming_the_first(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    src = _slow_corpus(ws)
    first = _spawn(ws, ws.out, src)
    _wait_for(tmp_path / ".out.partial" / "journal.jsonl", first)
    if first.poll() is not None:
        pytest.skip("the first run finished before the second could start")
    first.send_signal(signal.SIGSTOP)  # keep it mid-run (holding the lock) however fast this machine is
    try:
        second = _spawn(ws, ws.out, src)
        _, err2 = second.communicate(timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 1 and err2.count("\n") == 1 and f"pid {first.pid}" in err2, err2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]  # no lock, no staging, no work dir


def test_sigterm_mid_run_is_one_line_and_the_rerun_is_byte_identical(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    src = _slow_corpus(ws)
    proc = _spawn(ws, ws.out, src)
    _wait_for(tmp_path / ".out.partial" / "journal.jsonl", proc, 2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the run finished before SIGTERM arrived (machine too fast for this corpus)")
    assert proc.returncode == 143, err
    assert err.startswith("error: terminated (SIGTERM)") and err.count("\n") == 1, err  # no leaked-semaphore warning
    assert not ws.out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [".out.partial", "data"]
    rerun = _spawn(ws, ws.out, src)
    assert rerun.wait(timeout=300) == 0
    reference = _spawn(ws, tmp_path / "ref", src)
    assert reference.wait(timeout=300) == 0
    assert store_bytes(ws.out) == store_bytes(tmp_path / "ref")


def test_cli_default_max_record_bytes_is_the_config_default() -> None:
    import inspect

    from packtool.cli.commands import tokenize
    from packtool.stages.tokenize import TokenizeConfig

    default = inspect.signature(tokenize).parameters["max_record_bytes"].default
    assert default == TokenizeConfig.max_record_bytes == 16 << 20


def test_an_error_line_stays_one_bounded_line_whatever_it_quotes(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A newline in a file name split the `error:` line in two; a 100,000-character --role-map was quoted whole
    (200 kB on one line). Control characters are escaped and overlong words shortened, the ends kept."""
    ws = Ws(tmp_path, bpe_tokenizer_dir)
    bad = ws.write("a\nb.jsonl", b'{"text": 5}\n')
    code, _, err = cli(*ws.tokenize(bad))
    assert code == 1 and err.count("\n") == 1 and "a\\nb.jsonl:1" in err and "not a string" in err, err
    chat = ws.write("c.jsonl", b'{"messages": [{"role": "user", "content": "hi"}]}\n')
    code, _, err = cli(*ws.tokenize(chat, extra=("--format", "chat", "--role-map", "x" * 100_000)))
    assert code == 2 and err.count("\n") == 1 and len(err) < 1000 and "(100,002 characters)" in err, err[:300]
    assert err.startswith("error: --role-map 'xxx") and "is not FROM=TO" in err
    code, _, err = cli("pack", str(tmp_path / "no\rstore"), "--size", "8", "--output", str(tmp_path / "p"))
    assert code == 1 and err.count("\n") == 1 and "no\\rstore does not exist" in err, err
