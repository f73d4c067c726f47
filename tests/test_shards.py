"""Sharded tokenization + merge: byte-identical to one run (manifest included); resume after a kill."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support import cli, zipf_texts

from packtool import merge_shards
from packtool.errors import ConfigError
from packtool.exec.local import process_executor as local_executor
from packtool.formats.token_store import open_token_store
from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus
from packtool.stages.tokenize.chunks import ChunkTask
from packtool.stages.tokenize.journal import ChunkResult
from packtool.stages.tokenize.shards import shard_bounds

CHUNK = "3000"  # bytes: the corpus below becomes ~10 chunks




@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two jsonl files (Zipf lengths, empty docs, unicode) and one malformed record for --on-error skip."""
    root = tmp_path_factory.mktemp("shard_corpus")
    texts = zipf_texts(600, seed=11)
    texts[5] = ""
    texts[300] = "  \n\t 🙂 東京 <|endoftext|> 1234567 "
    rows = [json.dumps({"text": t}, ensure_ascii=False) for t in texts]
    rows.insert(200, '{"text": broken')
    (root / "a.jsonl").write_text("\n".join(rows[:350]) + "\n", encoding="utf-8")
    (root / "b.jsonl").write_text("\n".join(rows[350:]) + "\n", encoding="utf-8")
    return [str(root / "a.jsonl"), str(root / "b.jsonl")]


def tokenize_args(corpus: list[str], tok: Path, out: Path, *extra: str) -> list[str]:
    return ["tokenize", *corpus, "--tokenizer", str(tok), "--output", str(out), "--chunk-bytes", CHUNK,
            "--on-error", "skip", "--workers", "1", "--backend", "hf", "--quiet", *extra]


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def single(corpus: list[str], bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("single") / "store"
    tokenize_corpus(TokenizeConfig(tuple(corpus), str(bpe_tokenizer_dir), str(out), workers=1, backend="hf",
                                   on_error="skip", chunk_bytes=int(CHUNK)))
    return out


@pytest.mark.parametrize("num_shards", [2, 25])  # 25 > number of chunks: some shards are empty
def test_merged_shards_are_byte_identical_to_single_run(corpus: list[str], bpe_tokenizer_dir: Path, single: Path,
                                                        tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        num_shards: int) -> None:
    shards = []
    for i in range(num_shards):
        out = tmp_path / f"shard{i}"
        code, _, err = cli(*tokenize_args(corpus, bpe_tokenizer_dir, out, "--num-shards", str(num_shards),
                                             "--shard-index", str(i)))
        assert code == 0, err
        shards.append(out)
    n_chunks = json.loads((shards[0] / "manifest.json").read_text())["shard"]["n_chunks"]
    assert n_chunks >= 5
    code, out, err = cli(*["merge", *map(str, reversed(shards)), "--output", str(tmp_path / "merged"), "-q"])
    assert code == 0, err
    assert f"merged {num_shards} shards" in out
    assert store_bytes(tmp_path / "merged") == store_bytes(single)
    assert (tmp_path / "merged" / "rejects.jsonl").read_text().count("\n") == 1


def test_prompt_completion_shards_keep_the_loss_file(bpe_tokenizer_dir: Path, tmp_path: Path) -> None:
    texts = zipf_texts(200, seed=3)
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps({"prompt": t[: len(t) // 2], "completion": t[len(t) // 2:]}) + "\n" for t in texts))
    base = {"inputs": (str(path),), "tokenizer": str(bpe_tokenizer_dir), "format": "prompt-completion",
            "chunk_bytes": 2000, "workers": 1}
    tokenize_corpus(TokenizeConfig(output=str(tmp_path / "one"), **base))  # type: ignore[arg-type]
    shards = [tmp_path / f"s{i}" for i in range(4)]
    for i, out in enumerate(shards):
        tokenize_corpus(TokenizeConfig(output=str(out), num_shards=4, shard_index=i, **base))  # type: ignore[arg-type]
    result = merge_shards(shards, tmp_path / "merged")
    assert "tokens.loss" in result.manifest["files"]
    assert store_bytes(tmp_path / "merged") == store_bytes(tmp_path / "one")
    assert open_token_store(tmp_path / "merged", check_hashes=True).loss is not None


def test_shard_bounds_are_contiguous_and_cover_everything() -> None:
    for n_chunks in (0, 1, 7, 100):
        for n in (1, 2, 3, 8, 200):
            ranges = [shard_bounds(n_chunks, n, i) for i in range(n)]
            assert ranges[0][0] == 0 and ranges[-1][1] == n_chunks
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            sizes = [e - s for s, e in ranges]
            assert max(sizes) - min(sizes) <= 1


@pytest.fixture(scope="module")
def three_shards(corpus: list[str], bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("three")
    out = []
    for i in range(3):
        path = root / f"s{i}"
        tokenize_corpus(TokenizeConfig(tuple(corpus), str(bpe_tokenizer_dir), str(path), workers=1, backend="hf",
                                       on_error="skip", chunk_bytes=int(CHUNK), num_shards=3, shard_index=i))
        out.append(path)
    return out


def test_merge_refuses_incomplete_duplicate_and_foreign_shards(three_shards: list[Path], corpus: list[str],
                                                               bpe_tokenizer_dir: Path, single: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    s0, s1, s2 = map(str, three_shards)
    cases = {
        "are missing": [s0, s2],
        "given twice": [s0, s1, s1, s2],
        "is not a shard": [s0, s1, s2, str(single)],
    }
    other = tmp_path / "other1"  # same shard slot, but another run (--no-eos)
    assert cli(*tokenize_args(corpus, bpe_tokenizer_dir, other, "--num-shards", "3", "--shard-index", "1", "--no-eos"))[0] == 0
    cases["differs from"] = [s0, str(other), s2]
    for expected, args in cases.items():
        code, _, err = cli(*["merge", *args, "--output", str(tmp_path / "m"), "-q"])
        assert code == 1, expected
        assert err.startswith("error: ") and expected in err and err.count("\n") == 1, err
        assert not (tmp_path / "m").exists()


def test_bad_shard_flags_are_usage_errors(corpus: list[str], bpe_tokenizer_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Out-of-domain and contradictory shard flags exit 2 (they exited 1, as a data problem)."""
    for flags, message in ((["--num-shards", "2", "--shard-index", "2"], "--shard-index 2 is outside 0..1"),
                           (["--num-shards", "2", "--shard-index", "3"], "--shard-index 3 is outside 0..1")):
        code, _, err = cli(*tokenize_args(corpus, bpe_tokenizer_dir, tmp_path / "x", *flags))
        assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


def test_merge_output_exists_needs_overwrite(three_shards: list[Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    code, _, err = cli(*["merge", *map(str, three_shards), "--output", str(out), "-q"])
    assert code == 1 and "--overwrite" in err and (out / "keep.txt").exists()
    code, _, err = cli("merge", *map(str, three_shards), "--output", str(out), "-q", "--overwrite")
    assert code == 1 and "not a packtool token store" in err and (out / "keep.txt").read_text() == "x"  # never deleted
    (out / "keep.txt").unlink()
    assert cli("merge", *map(str, three_shards), "--output", str(out), "-q")[0] == 0
    assert cli("merge", *map(str, three_shards), "--output", str(out), "-q", "--overwrite")[0] == 0
    code, _, err = cli("merge", *map(str, three_shards), "--output", str(three_shards[0]), "-q", "--overwrite")
    assert code == 1 and "holds the input" in err and open_token_store(three_shards[0]).n_documents > 0


def dying_executor(after: int) -> object:
    """A local executor that is 'killed' (KeyboardInterrupt) after `after` chunks were journaled."""

    def execute(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        for done, result in enumerate(local_executor(1)(tasks)):
            if done == after:
                raise KeyboardInterrupt
            yield result

    return execute


def test_killed_shard_resumes_from_its_journal(corpus: list[str], bpe_tokenizer_dir: Path, three_shards: list[Path],
                                              tmp_path: Path) -> None:
    config = TokenizeConfig(tuple(corpus), str(bpe_tokenizer_dir), str(tmp_path / "s1"), workers=1, backend="hf",
                            on_error="skip", chunk_bytes=int(CHUNK), num_shards=3, shard_index=1)
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(config, executor=dying_executor(2))  # type: ignore[arg-type]
    assert not (tmp_path / "s1").exists()
    result = tokenize_corpus(config)
    assert result.reused_chunks == 2 and result.n_chunks > 2
    assert store_bytes(tmp_path / "s1") == store_bytes(three_shards[1])


def test_shard_index_must_be_in_range() -> None:
    with pytest.raises(ConfigError, match="--num-shards must be at least 1"):
        shard_bounds(10, 0, 0)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("left", ["old", "staged-new"])
def test_merge_repairs_a_swap_that_a_killed_writer_left(three_shards: list[Path], tmp_path: Path, left: str) -> None:
    """SIGKILL between the two renames of a swap: nothing under the name, the store in a hidden sibling."""
    import shutil

    out = tmp_path / "m"
    assert cli("merge", *map(str, three_shards), "--output", str(out), "-q")[0] == 0
    want = {p.name: p.read_bytes() for p in out.iterdir()}
    tag = "old" if left == "old" else "tmp"
    shutil.move(out, tmp_path / f".m.{tag}-{_dead_pid()}")
    (tmp_path / f".m.old-{_dead_pid()}").mkdir()  # an incomplete leftover of another dead run
    assert cli("merge", *map(str, three_shards), "--output", str(out), "-q", "--overwrite")[0] == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize(("change", "message"), [
    ({"shard": {"index": "x"}}, "the shard entry's 'index' must be an integer >= 0, got \"x\""),
    ({"shard": {"count": 1e400}}, "the shard entry's 'count' must be an integer >= 0, got Infinity"),
    ({"shard": {"chunk_end": -1}}, "the shard entry's 'chunk_end' must be an integer >= 0"),
    ({"shard": {"build": None}}, "the shard entry's 'build' is not a string"),
    ({"shard": {"index": 7}}, "the shard entry is inconsistent (index 7 of 3"),
    ({"shard": "0"}, "is not a shard"),
    ({"sources": [{"records": "many"}]}, "per-shard counts (sources, n_rejected, rejected_by_reason) are damaged"),
    ({"n_rejected": -3}, "per-shard counts (sources, n_rejected, rejected_by_reason) are damaged"),
])
def test_a_damaged_shard_entry_or_count_is_one_line(three_shards: list[Path], tmp_path: Path, change: dict[str, object],
                                                     message: str) -> None:
    """`"shard": {"index": "x"}` was a ValueError traceback in merge's sort; a count of 10**12 a set that size."""
    import shutil

    shards = [tmp_path / f"s{i}" for i in range(3)]
    for src, dst in zip(three_shards, shards, strict=True):
        shutil.copytree(src, dst)
    manifest = json.loads((shards[1] / "manifest.json").read_text())
    for key, value in change.items():
        manifest[key] = {**manifest[key], **value} if isinstance(value, dict) else value
        if key == "sources":
            manifest[key] = [{**manifest[key][0], **value[0]}, *manifest[key][1:]]  # type: ignore[index]
    (shards[1] / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli("merge", *map(str, shards), "--output", str(tmp_path / "m"), "-q")
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m*"))


def test_a_shard_count_of_a_trillion_names_the_missing_shards_at_once(three_shards: list[Path], tmp_path: Path) -> None:
    import shutil

    shards = [tmp_path / f"s{i}" for i in range(3)]
    for src, dst in zip(three_shards, shards, strict=True):
        shutil.copytree(src, dst)
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest["shard"]["count"] = 10**12
        (dst / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli("merge", *map(str, shards), "--output", str(tmp_path / "m"), "-q")
    assert code == 1 and "shards [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] of 1000000000000 are missing" in err, err
