"""--executor ray: the same chunk tasks as Ray tasks give the local executor's bytes; kill + resume works."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from support import zipf_texts

from packtool import merge_shards
from packtool.cli import main
from packtool.exec import make_executor
from packtool.exec.ray import ray_executor
from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus
from packtool.stages.tokenize.chunks import ChunkTask
from packtool.stages.tokenize.journal import ChunkResult

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("ray_corpus")
    texts = zipf_texts(800, seed=21)
    texts[7] = ""
    rows = [json.dumps({"text": t}, ensure_ascii=False) for t in texts]
    rows.insert(100, "not json")
    (root / "data.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(root / "data.jsonl")


def config(corpus: str, tok: Path, out: Path, **kw: object) -> TokenizeConfig:
    base: dict[str, object] = {"workers": 2, "backend": "hf", "on_error": "skip", "chunk_bytes": 4000}
    base.update(kw)
    return TokenizeConfig((corpus,), str(tok), str(out), **base)  # type: ignore[arg-type]


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


@pytest.fixture(scope="module")
def local_store(corpus: str, bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("local") / "store"
    tokenize_corpus(config(corpus, bpe_tokenizer_dir, out, executor="local"))
    return out


def test_ray_cli_output_equals_local_byte_for_byte(corpus: str, bpe_tokenizer_dir: Path, local_store: Path,
                                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ray"
    old = sys.argv
    sys.argv = ["packtool", "tokenize", corpus, "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out),
                "--executor", "ray", "--workers", "2", "--backend", "hf", "--on-error", "skip", "--chunk-bytes", "4000", "-q"]
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    finally:
        sys.argv = old
    assert "tokenized 800 documents" in capsys.readouterr().out
    assert store_bytes(out) == store_bytes(local_store)


def test_ray_shards_merge_to_the_local_single_run(corpus: str, bpe_tokenizer_dir: Path, local_store: Path,
                                                  tmp_path: Path) -> None:
    shards = [tmp_path / f"s{i}" for i in range(3)]
    for i, out in enumerate(shards):
        tokenize_corpus(config(corpus, bpe_tokenizer_dir, out, executor="ray", num_shards=3, shard_index=i))
    merge_shards(shards, tmp_path / "merged")
    assert store_bytes(tmp_path / "merged") == store_bytes(local_store)


def test_killed_ray_run_resumes_from_the_journal(corpus: str, bpe_tokenizer_dir: Path, local_store: Path,
                                                 tmp_path: Path) -> None:
    def dying(tasks: Sequence[ChunkTask]) -> Iterator[ChunkResult]:
        for done, result in enumerate(ray_executor(2)(tasks)):
            if done == 3:
                raise KeyboardInterrupt  # the coordinator dies; outstanding Ray tasks are cancelled
            yield result

    cfg = config(corpus, bpe_tokenizer_dir, tmp_path / "store", executor="ray")
    with pytest.raises(KeyboardInterrupt):
        tokenize_corpus(cfg, executor=dying)
    assert not (tmp_path / "store").exists()
    result = tokenize_corpus(cfg)
    assert result.reused_chunks >= 3 and result.n_chunks > result.reused_chunks
    assert store_bytes(tmp_path / "store") == store_bytes(local_store)


def test_bad_record_in_a_ray_task_is_the_same_one_line_error(bpe_tokenizer_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine"}\n{"text": 3}\n')
    old = sys.argv
    sys.argv = ["packtool", "tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                "--executor", "ray", "-q"]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    err = capsys.readouterr().err
    assert exc.value.code == 1 and err.startswith("error: bad record") and f"{data}:2" in err and err.count("\n") == 1


def test_ray_address_needs_ray_executor() -> None:
    from packtool.errors import ConfigError

    with pytest.raises(ConfigError, match="--ray-address needs --executor ray"):
        make_executor("local", 2, ray_address="127.0.0.1:6379")
