"""`packtool tokenize` end to end: every input format, byte identity with the tokenizer, policies, workers."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from support import big_vocab_texts, cli, write_jsonl, zipf_texts
from tokenizers import Tokenizer

import packtool
from packtool.formats.token_store import open_token_store


def docs(path: Path) -> list[list[int]]:
    store = open_token_store(path, check_hashes=True)
    return [store.document(i).tolist() for i in range(store.n_documents)]


def expected(tok: Tokenizer, texts: list[str], eos: int | None = 0, bos: int | None = None) -> list[list[int]]:
    return [([bos] if bos is not None else []) + tok.encode(t).ids + ([eos] if eos is not None else []) for t in texts]


@pytest.fixture(scope="module")
def tok(bpe_tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))


def test_every_input_format_byte_identical_in_sorted_order(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    texts = zipf_texts(120, seed=7) + ["", "   ", "naïve café 東京 🙂"]
    parts = [texts[i::5] for i in range(5)]
    data = tmp_path / "in"
    (data / "txt").mkdir(parents=True)
    write_jsonl(data / "a.jsonl", [{"text": t} for t in parts[0]])
    (data / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in parts[1]).encode()))
    (data / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in parts[2]).encode()))
    pq.write_table(pa.Table.from_pylist([{"text": t} for t in parts[3]]), data / "d.parquet", row_group_size=5)
    for i, t in enumerate(parts[4]):
        (data / "txt" / f"{i:03d}.txt").write_text(t, encoding="utf-8")
    out = tmp_path / "store"
    code, stdout, err = cli(*["tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out),
                                 "--chunk-bytes", "300", "--workers", "1", "-q"])
    assert code == 0, err
    assert "tokenized 123 documents" in stdout
    order = parts[0] + parts[1] + parts[2] + parts[3] + parts[4]
    assert docs(out) == expected(tok, order)
    store = open_token_store(out)
    assert store.loss is None and store.dtype == np.dtype("<u2")
    m = store.manifest
    assert [Path(s["path"]).name for s in m["sources"]][:4] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet"]
    assert sum(s["documents"] for s in m["sources"]) == 123 and m["input_format"] == "text"
    assert m["tokenizer"]["name"] == bpe_tokenizer_dir.name and m["tokenizer"]["eos_id"] == 0
    assert m["eos"] == {"enabled": True, "id": 0, "by": "packtool"} and m["bos"]["enabled"] is False


def test_nested_field_and_txt_separator(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer) -> None:
    texts = zipf_texts(30, seed=8)
    write_jsonl(tmp_path / "a.jsonl", [{"doc": {"body": {"text": t}}, "text": "decoy"} for t in texts])
    cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(bpe_tokenizer_dir),
                                  output=str(tmp_path / "s1"), field="doc.body.text", workers=1)
    packtool.tokenize_corpus(cfg)
    assert docs(tmp_path / "s1") == expected(tok, texts)
    (tmp_path / "b.txt").write_text("\n<doc>\n".join(texts))
    cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "b.txt"),), tokenizer=str(bpe_tokenizer_dir),
                                  output=str(tmp_path / "s2"), separator="\n<doc>\n", workers=1)
    packtool.tokenize_corpus(cfg)
    assert docs(tmp_path / "s2") == expected(tok, texts)


def test_big_vocab_is_uint32_and_byte_identical(tmp_path: Path, big_vocab_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(big_vocab_tokenizer_dir / "tokenizer.json"))
    texts = big_vocab_texts(200) + [""]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(big_vocab_tokenizer_dir / "tokenizer.json"),
                                  output=str(tmp_path / "s"), workers=2, chunk_bytes=2000)
    result = packtool.tokenize_corpus(cfg)
    store = open_token_store(tmp_path / "s")
    assert store.dtype == np.dtype("<u4") and result.manifest["dtype"] == "uint32"
    assert int(store.tokens.max()) > 65535
    assert docs(tmp_path / "s") == expected(tok, texts)
    assert store.manifest["tokenizer"]["vocab_size"] == 70_000


@pytest.mark.parametrize(("flags", "bos", "eos"), [([], None, 0), (["--bos"], 4, 0), (["--no-eos"], None, None),
                                                   (["--bos", "--no-eos"], 4, None)])
def test_bos_eos_flags(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer, capsys: pytest.CaptureFixture[str],
                       flags: list[str], bos: int | None, eos: int | None) -> None:
    texts = ["", *zipf_texts(20, seed=9)]
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "s"), "-q", *flags])
    assert code == 0, err
    got = docs(tmp_path / "s")
    assert got == expected(tok, texts, eos=eos, bos=bos)
    assert len(got[0]) == (bos is not None) + (eos is not None)  # the empty document is kept
    m = open_token_store(tmp_path / "s").manifest
    assert m["bos"]["enabled"] is (bos is not None) and m["eos"]["enabled"] is (eos is not None)


def test_post_processor_bos_is_kept_not_doubled_and_can_be_stripped(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    from tokenizers import processors

    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 4)])
    model = tmp_path / "with_bos"
    model.mkdir()
    tok.save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text((bpe_tokenizer_dir / "tokenizer_config.json").read_text())
    texts = zipf_texts(10, seed=10)
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in texts])
    for name, bos, want in (("default", None, [4]), ("forced", True, [4]), ("off", False, [])):
        cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(model), output=str(tmp_path / name),
                                      bos=bos, workers=1)
        packtool.tokenize_corpus(cfg)
        plain = Tokenizer.from_file(str(model / "tokenizer.json"))
        assert docs(tmp_path / name) == [want + plain.encode(t, add_special_tokens=False).ids + [0] for t in texts], name
    manifest = open_token_store(tmp_path / "default").manifest
    assert manifest["bos"] == {"enabled": True, "id": 4, "by": "tokenizer post-processor"}


def test_workers_and_chunking_do_not_change_bytes(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(600, seed=11)])
    files = {}
    for workers, chunk in ((1, 1 << 20), (2, 4000), (1, 4000)):
        out = tmp_path / f"s{workers}_{chunk}"
        cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(bpe_tokenizer_dir), output=str(out),
                                      workers=workers, chunk_bytes=chunk)
        result = packtool.tokenize_corpus(cfg)
        assert result.n_chunks == (1 if chunk > 4000 else result.n_chunks) and (chunk > 4000 or result.n_chunks > 10)
        files[(workers, chunk)] = [(out / n).read_bytes() for n in ("tokens.bin", "tokens.boundaries")]
        assert not (tmp_path / f".{out.name}.partial").exists()  # the work dir is cleaned up
    assert files[(1, 1 << 20)] == files[(2, 4000)] == files[(1, 4000)]


def test_prompt_completion_targets_are_completion_plus_eos(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer) -> None:
    texts = zipf_texts(60, seed=12)
    rows = [{"q": {"prompt": texts[i] + " Answer:"}, "completion": " " + texts[i + 1]} for i in range(40)]
    rows.append({"q": {"prompt": "empty completion:"}, "completion": ""})
    write_jsonl(tmp_path / "pc.jsonl", rows)
    cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "pc.jsonl"),), tokenizer=str(bpe_tokenizer_dir), output=str(tmp_path / "s"),
                                  format=packtool.choices.InputFormat.PROMPT_COMPLETION, prompt_field="q.prompt",
                                  workers=1)
    packtool.tokenize_corpus(cfg)
    store = open_token_store(tmp_path / "s")
    assert store.loss is not None
    for i, row in enumerate(rows):
        ids = store.document(i)
        loss = store.loss[store.starts[i] : store.boundaries[i]]
        assert ids.tolist() == tok.encode(row["q"]["prompt"] + row["completion"]).ids + [0]
        assert tok.decode(ids[loss == 1].tolist(), skip_special_tokens=False) == row["completion"] + "<|endoftext|>"
        assert np.all(np.diff(loss.astype(int)) >= 0)  # prompt (0s) then completion (1s)
    assert store.manifest["n_target_tokens"] == int(store.loss.sum())


def test_several_megabyte_document(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer) -> None:
    paragraph = "\n".join(zipf_texts(300, seed=13)) + "\n"
    big = (paragraph * (5_000_000 // len(paragraph) + 1))[:5_000_000]
    write_jsonl(tmp_path / "a.jsonl", [{"text": "small"}, {"text": big}, {"text": "after"}])
    cfg = packtool.TokenizeConfig(inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(bpe_tokenizer_dir), output=str(tmp_path / "s"),
                                  chunk_bytes=1000)
    packtool.tokenize_corpus(cfg)
    store = open_token_store(tmp_path / "s")
    assert store.n_documents == 3 and store.lengths[1] > 1_000_000
    ids = store.document(1).tolist()
    assert ids[-1] == 0 and tok.decode(ids[:-1]) == big  # exact round trip (identity vs encode is tested above)
    assert docs(tmp_path / "s")[2] == tok.encode("after").ids + [0]


def test_hub_name_resolved_in_local_cache(tmp_path: Path, bpe_tokenizer_dir: Path, tok: Tokenizer,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "hub" / "models--acme--tiny-bpe"
    for rev in ("0123abc", "fedc987"):
        (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("fedc987")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (repo / "snapshots" / "fedc987" / name).write_bytes((bpe_tokenizer_dir / name).read_bytes())
    (repo / "snapshots" / "0123abc" / "tokenizer.json").write_text("not json")  # the stale revision is never read
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}])
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", "acme/tiny-bpe", "--output", str(tmp_path / "s"), "-q"])
    assert code == 0, err
    assert open_token_store(tmp_path / "s").manifest["tokenizer"]["name"] == "acme/tiny-bpe"
    assert docs(tmp_path / "s") == expected(tok, ["hello world"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # not cached: downloaded, unless offline (tests/test_hub_download.py)
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", "acme/absent", "--output", str(tmp_path / "t")])
    assert code == 1 and err.count("\n") == 1 and "local Hugging Face cache" in err


def test_store_is_named_after_name_or_path_of_a_model_directory(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`--tokenizer ./dir` files the store (and later its packs) under tokenizer_config's name_or_path."""
    model = tmp_path / "checkout"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((bpe_tokenizer_dir / "tokenizer.json").read_bytes())
    config = json.loads((bpe_tokenizer_dir / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "name_or_path": "acme/Tiny-BPE-7B"}))
    write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}])
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(model), "--output", str(tmp_path / "s"), "-q"])
    assert code == 0, err
    assert open_token_store(tmp_path / "s").manifest["tokenizer"]["name"] == "acme/Tiny-BPE-7B"
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "name_or_path": "/home/me/ckpt"}))  # a local path is ignored
    code, _, err = cli(*["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(model), "--output", str(tmp_path / "t"), "-q"])
    assert code == 0, err
    assert open_token_store(tmp_path / "t").manifest["tokenizer"]["name"] == "checkout"


def test_default_chunks_are_a_sixty_fourth_of_the_input_between_1_and_16_mib(tmp_path: Path,
                                                                              bpe_tokenizer_dir: Path) -> None:
    """--chunk-bytes left out: small corpora are still cut into many chunks (every worker busy to the end), the
    cut depends on the inputs alone, and the bytes equal an explicit chunk size's."""
    from packtool.stages.tokenize.config import auto_chunk_bytes

    assert auto_chunk_bytes(0) == auto_chunk_bytes(50 << 20) == 1 << 20
    assert auto_chunk_bytes(640 << 20) == 10 << 20 and auto_chunk_bytes(100 << 30) == 16 << 20
    texts = zipf_texts(3000, seed=12)
    write_jsonl(tmp_path / "a.jsonl", [{"text": " ".join(texts[i : i + 40])} for i in range(0, 3000, 2)])
    assert (tmp_path / "a.jsonl").stat().st_size > 3 << 20
    stores = {}
    for chunk in (None, 16 << 20):
        out = tmp_path / f"s{chunk}"
        result = packtool.tokenize_corpus(packtool.TokenizeConfig(
            inputs=(str(tmp_path / "a.jsonl"),), tokenizer=str(bpe_tokenizer_dir), output=str(out), chunk_bytes=chunk))
        size = (tmp_path / "a.jsonl").stat().st_size
        assert result.n_chunks == (-(-size // (1 << 20)) if chunk is None else 1)  # 1 MiB chunks, one line each
        stores[chunk] = [(out / n).read_bytes() for n in ("tokens.bin", "tokens.boundaries")]
    assert stores[None] == stores[16 << 20]


def test_console_script_ends_fast_after_success_and_keeps_failures(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`python -m packtool` (the console script's `entry`): after a success the process ends without tearing the
    interpreter down, with its summary line printed (flushed first) and the store committed; a failure still
    prints its one line and exits 1."""
    import subprocess
    import sys

    src = write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(200, seed=13)])
    run = [sys.executable, "-m", "packtool", "tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir)]
    ok = subprocess.run([*run, "--output", str(tmp_path / "s"), "-q"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and ok.stdout.startswith("tokenized 200 documents"), ok
    assert open_token_store(tmp_path / "s").n_documents == 200
    bad = subprocess.run([*run[:4], str(tmp_path / "nope.jsonl"), *run[5:], "--output", str(tmp_path / "t")],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr, bad


def test_workers_beyond_the_cores_are_capped_and_change_no_byte(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workers 100000` once set RAYON_NUM_THREADS=100000 (the Rust tokenizer started that many threads: 20
    minutes, or a panic under a memory limit) and asked the pool for as many: both stay at the machine's cores."""
    from packtool.exec import machine_cores
    from packtool.stages.tokenize import pipeline

    write_jsonl(tmp_path / "a.jsonl", [{"text": t} for t in zipf_texts(300, seed=5)])
    seen: list[int] = []

    def env_spy(threads: int) -> dict[str, str]:
        seen.append(threads)
        if threads > machine_cores():  # raise before any thread starts, so the old code fails fast
            raise AssertionError(f"{threads} tokenizer threads on {machine_cores()} cores")
        return pipeline.worker_env.__wrapped__(threads)  # type: ignore[attr-defined]

    env_spy.__wrapped__ = pipeline.worker_env  # type: ignore[attr-defined]
    monkeypatch.setattr(pipeline, "worker_env", env_spy)
    made: list[int] = []
    real_make = pipeline.make_executor
    monkeypatch.setattr(pipeline, "make_executor", lambda name, workers, **kw: made.append(workers) or real_make(name, workers, **kw))
    common = ["tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", str(bpe_tokenizer_dir), "--chunk-bytes", "3000", "-q"]
    stores = []
    for workers in ("1", "100000", "1000000000"):
        code, _, err = cli(*common, "--output", str(tmp_path / workers), "--workers", workers)
        assert code == 0, err
        stores.append([(tmp_path / workers / n).read_bytes() for n in ("tokens.bin", "tokens.boundaries")])
    assert stores[0] == stores[1] == stores[2]
    assert seen and max(seen) <= machine_cores() and made and max(made) <= machine_cores()
    assert packtool.TokenizeConfig(inputs=("x",), tokenizer="t", output="o", workers=10**9).resolved_workers() == machine_cores()
