"""`packtool export` through the CLI and `export_store`: every target against packtool's own loader, pack by pack.

Stores are made by the real pipeline on the shipped sample data (a chat store with loss and no EOS,
a text store with EOS packed with --overlong drop, a --pad-multiple store) plus a uint32 store from
the big-vocab fixture tokenizer. The files are read back with pyarrow / numpy following each
trainer's documented convention (the trainers' own readers run in tests/interop, `make interop`),
and every failure path must exit 1 with one `error:` line and leave nothing behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support import big_vocab_texts, build_big_vocab_tokenizer, build_file, cli, cli_error

from packtool.choices import ExportTarget
from packtool.errors import ConfigError, UsageError
from packtool.stages.export import EXPORTERS, ExportConfig, Exporter, export_store

torch = pytest.importorskip("torch")
from packtool.loader import PackedDataset  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"
SIZE = 512
TARGETS = ["megatron-bridge", "nemo", "trl", "olmo-core"]


def _ok(*args: str) -> str:
    code, out, err = cli(*args)
    assert code == 0, err
    return out


def _make(root: Path, name: str, inputs: list[str], tok: str, *flags: str, pack: tuple[str, ...] = ()) -> Path:
    _ok("tokenize", *inputs, "--tokenizer", tok, "--output", str(root / f"{name}_tok"), "--workers", "1", "-q", *flags)
    _ok("pack", str(root / f"{name}_tok"), "--size", str(SIZE), "--output", str(root / name), "-q", *pack)
    return next((root / name / "packed").iterdir())


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("export_stores")
    tok = str(SAMPLE / "tokenizer")
    big = build_big_vocab_tokenizer(root / "big_tok")
    (root / "big.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in big_vocab_texts(80, seed=5)))
    chat = [str(SAMPLE / "chat.jsonl")]
    return {
        "chat": _make(root, "chat", chat, tok, "--format", "chat"),
        "text": _make(root, "text", [str(SAMPLE / "text.jsonl")], tok, pack=("--overlong", "drop")),
        "pad8": _make(root, "pad8", [str(SAMPLE / "prompt_completion.jsonl")], tok, "--format", "prompt-completion",
                      pack=("--pad-multiple", "8")),
        "u32": _make(root, "u32", [str(root / "big.jsonl")], str(big), pack=("--overlong", "drop")),
        # long documents, default --overlong split: head fragments without EOS, each alone in its pack
        "text_split": _make(root, "text_split", [str(SAMPLE / "text.jsonl")], tok),
    }


def _loader(pack_dir: Path) -> tuple[PackedDataset, np.ndarray]:
    ds = PackedDataset(pack_dir, size=SIZE)
    counts = np.diff(np.load(build_file(pack_dir, SIZE, "pack_offsets")))
    return ds, counts


def _check_megatron_rows(rows: list[dict], pack_dir: Path) -> None:
    """Megatron-Bridge convention vs the loader: no tail, shifted loss, sequence starts."""
    ds, counts = _loader(pack_dir)
    assert len(rows) == len(ds)
    for i, row in enumerate(rows):
        item = ds[i]
        ids, labels = item["input_ids"].numpy(), item["labels"].numpy()
        cu = item["cu_seqlens"].numpy()[: counts[i] + 1]
        used = int(cu[-1])
        assert row["input_ids"] == ids[:used].tolist()
        assert row["seq_start_id"] == cu[:-1].tolist()
        want = np.zeros(used, dtype=np.int64)
        want[:-1] = labels[1:used] != -100  # target of the next token; 0 at every sequence's last token
        assert row["loss_mask"] == want.tolist()


@pytest.mark.parametrize("name", ["chat", "text", "u32"])
def test_megatron_bridge_parquet_and_metadata(stores: dict[str, Path], tmp_path: Path, name: str) -> None:
    out = _ok("export", str(stores[name]), "--to", "megatron-bridge", "--output", str(tmp_path / "mb"), "-q")
    assert "PackedSequenceSpecs(packed_sequence_size=512" in out and "global_batch_size" in out
    table = pq.read_table(tmp_path / "mb" / f"training_{SIZE}.idx.parquet")
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"
    assert str(table.schema.field("loss_mask").type) == "list<element: int8>"
    assert str(table.schema.field("seq_start_id").type) == "list<element: int32>"
    _check_megatron_rows(table.to_pylist(), stores[name])
    [entry] = json.loads((tmp_path / "mb" / f"{SIZE}_metadata.jsonl").read_text())  # a JSON array
    meta = json.loads((stores[name] / f"{SIZE}_metadata.jsonl").read_text().splitlines()[0])
    for key in ("dataset_max_seqlen", "max_samples_per_bin", "packing_factor", "packing_efficiency", "pack_size",
                "min_packed_seqlen"):
        assert entry[key] == meta[key]
    assert sorted(p.name for p in (tmp_path / "mb").iterdir()) == [f"{SIZE}_metadata.jsonl", f"training_{SIZE}.idx.parquet"]


def test_nemo_object_npy_holds_python_lists(stores: dict[str, Path], tmp_path: Path) -> None:
    _ok("export", str(stores["chat"]), "--to", "nemo", "--output", str(tmp_path / "nemo"), "-q")
    arr = np.load(tmp_path / "nemo" / f"training_{SIZE}.npy", allow_pickle=True)
    assert arr.dtype == object and arr.ndim == 1
    rows = list(arr)
    assert all(list(r) == ["input_ids", "loss_mask", "seq_start_id"] for r in rows)
    assert all(type(v) is list and type(v[0]) is int for r in rows for v in r.values())
    _check_megatron_rows(rows, stores["chat"])
    assert (tmp_path / "nemo" / f"{SIZE}_metadata.jsonl").exists()


@pytest.mark.parametrize("name", ["chat", "text", "pad8", "u32"])
def test_trl_rows_are_the_loader_items(stores: dict[str, Path], tmp_path: Path, name: str) -> None:
    _ok("export", str(stores[name]), "--to", "trl", "--output", str(tmp_path / "trl"), "-q")
    rows = pq.read_table(tmp_path / "trl" / f"training_{SIZE}.parquet").to_pylist()
    ds, _ = _loader(stores[name])
    assert len(rows) == len(ds)
    for i, row in enumerate(rows):
        item = ds[i]
        assert row["input_ids"] == item["input_ids"].tolist()
        assert row["labels"] == item["labels"].tolist()
        assert [0, *np.cumsum(row["seq_lengths"]).tolist()] == item["cu_seqlens"].tolist()  # tail = one sequence


@pytest.mark.parametrize("name", ["text", "u32", "text_split"])
def test_olmo_core_raw_files_and_eos_documents(stores: dict[str, Path], tmp_path: Path, name: str) -> None:
    out = _ok("export", str(stores[name]), "--to", "olmo-core", "--output", str(tmp_path / "olmo"), "-q")
    assert "NumpyFSLDataset(" in out and "generate_doc_lengths=True" in out and "label_mask_paths=" in out
    ds, _ = _loader(stores[name])
    dtype = np.uint16 if ds.metadata["dtype"] == "uint16" else np.uint32
    assert ("np.uint32" in out) == (dtype is np.uint32)
    tokens = np.fromfile(tmp_path / "olmo" / f"training_{SIZE}.npy", dtype=dtype).reshape(-1, SIZE)
    mask = np.fromfile(tmp_path / "olmo" / f"training_{SIZE}.label_mask.npy", dtype=np.bool_).reshape(-1, SIZE)
    eos = json.loads((stores[name].parents[1].parent / f"{name}_tok" / "manifest.json").read_text())["tokenizer"]["eos_id"]
    assert tokens.shape[0] == mask.shape[0] == len(ds)
    for i in range(len(ds)):
        item = ds[i]
        assert np.array_equal(tokens[i], item["input_ids"].numpy())
        assert np.array_equal(mask[i], item["labels"].numpy() != -100)
        ends = np.flatnonzero(tokens[i] == eos) + 1  # OLMo-core: a document ends at each EOS, the rest is one more
        bounds = [0, *ends.tolist()] + ([SIZE] if not ends.size or ends[-1] != SIZE else [])
        assert bounds == item["cu_seqlens"].tolist()
    if name == "text_split":  # the case the export used to refuse: fragments without EOS (full packs alone)
        meta = ds.metadata
        assert meta["overlong"]["policy"] == "split" and meta["overlong"]["count"] > 0
        assert sum(int(tokens[i, -1] != eos and tokens[i, -1] != meta["pad_id"]) for i in range(len(ds))) > 0


def test_olmo_core_refuses_a_fragment_followed_by_another_sequence(stores: dict[str, Path], tmp_path: Path) -> None:
    """A store tokenized without EOS: the first pack holding two sequences is named, with the fix."""
    tok = str(SAMPLE / "tokenizer")
    pack_dir = _make(tmp_path, "noeos", [str(SAMPLE / "text.jsonl")], tok, "--no-eos")
    counts = np.diff(np.load(build_file(pack_dir, SIZE, "pack_offsets")))
    first = int(np.flatnonzero(counts >= 2)[0])
    line = cli_error("export", str(pack_dir), "--to", "olmo-core", "--output", str(tmp_path / "o"))
    assert f"(first: pack {first}, sequence 0 of it)" in line and "followed by another sequence" in line
    assert "tokenize with --eos" in line
    assert not (tmp_path / "o").exists()


def test_small_blocks_give_the_same_exports(stores: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    """Streaming: 3 packs per block (many block boundaries) gives the same rows as the default blocks."""
    import packtool.stages.export.blocks as blocks

    def read(d: Path) -> list:
        return [pq.read_table(f).to_pylist() if f.suffix == ".parquet" else f.read_bytes() for f in sorted(d.iterdir())]

    for target, name in [("megatron-bridge", "chat"), ("trl", "pad8"), ("olmo-core", "text"), ("nemo", "chat")]:
        export_store(ExportConfig(stores[name], target, tmp_path / f"{target}_big"))
        monkeypatch.setattr(blocks, "BLOCK_TOKENS", 3 * SIZE)
        export_store(ExportConfig(stores[name], target, tmp_path / f"{target}_small"))
        monkeypatch.undo()
        assert read(tmp_path / f"{target}_big") == read(tmp_path / f"{target}_small"), target


def test_validation_split_merges_into_the_megatron_metadata(stores: dict[str, Path], tmp_path: Path) -> None:
    root = stores["chat"].parents[1]
    _ok("pack", str(root.parent / "chat_tok"), "--size", str(SIZE), "--output", str(root), "--split", "validation", "-q")
    out = tmp_path / "mb"
    _ok("export", str(root), "--to", "megatron-bridge", "--output", str(out), "-q")
    text = _ok("export", str(root), "--to", "megatron-bridge", "--split", "validation", "--output", str(out), "-q")
    assert "packed_val_data_path" in text
    entries = json.loads((out / f"{SIZE}_metadata.jsonl").read_text())
    assert [e["split"] for e in entries] == ["training", "validation"]
    _ok("export", str(root), "--to", "megatron-bridge", "--output", str(out), "--overwrite", "-q")
    assert sorted(e["split"] for e in json.loads((out / f"{SIZE}_metadata.jsonl").read_text())) == ["training", "validation"]


def test_a_pack_file_path_fixes_split_and_size(stores: dict[str, Path], tmp_path: Path) -> None:
    result = export_store(ExportConfig(stores["chat"] / f"training_{SIZE}.npy", "trl", tmp_path / "t"))
    assert result.n_packs == len(PackedDataset(stores["chat"])) and result.size == SIZE
    with pytest.raises(ConfigError, match="contradicts"):
        export_store(ExportConfig(stores["chat"] / f"training_{SIZE}.npy", "trl", tmp_path / "u", size=1024))


# ---- the registry: one list of targets, tied to the `--to` choices --------------------------------


def test_the_registry_is_the_one_list_of_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `ExportTarget` (the CLI's `--to` choices) has exactly one `Exporter`, and nothing else is registered."""
    assert set(EXPORTERS) == set(ExportTarget), "an ExportTarget without an exporter, or an exporter without a target"
    assert [t.value for t in EXPORTERS] == TARGETS
    for target, spec in EXPORTERS.items():
        assert isinstance(spec, Exporter) and spec.target is target
        assert spec.files and spec.reader and callable(spec.check) and callable(spec.write)
        names, shared = spec.file_names("training", 4096)
        assert names and all("training_4096" in n for n in names) and all("4096" in n for n in shared)
        assert len(set(names + shared)) == len(names + shared)
    code, out, _ = cli("export", "--help")  # the choices, a comma list wrapped between words
    assert code == 0 and f"One of: {', '.join(TARGETS)}." in " ".join(out.split())


def test_out_of_domain_export_flags_are_usage_errors(stores: dict[str, Path], tmp_path: Path) -> None:
    for flag, value in (("--size", "0"), ("--size", "-4"), ("--eos-id", "-1")):
        line = cli_error("export", str(stores["text"]), "--to", "trl", flag, value, "--output", str(tmp_path / "o"), code=2)
        assert f"{flag} must be an integer >=" in line
    with pytest.raises(UsageError, match="--size must be an integer >= 1, got 0"):
        ExportConfig(stores["text"], "trl", tmp_path / "o", size=0).validate()
    assert not (tmp_path / "o").exists()


def test_an_eos_id_outside_the_vocabulary_is_refused(stores: dict[str, Path], tmp_path: Path) -> None:
    """`--eos-id 99999999999999` was written into Megatron's metadata and config lines as the EOS id."""
    vocab = json.loads((stores["text"].parents[2] / "text_tok" / "manifest.json").read_text())["tokenizer"]["vocab_size"]
    for target in ("megatron-bridge", "olmo-core", "trl"):
        line = cli_error("export", str(stores["text"]), "--to", target, "--eos-id", "99999999999999",
                         "--output", str(tmp_path / "o"), code=2)  # fmt: skip
        assert f"--eos-id 99999999999999 is not a token id of the tokenizer's vocabulary of {vocab}" in line
    assert not (tmp_path / "o").exists()


def test_output_may_not_be_a_token_store(stores: dict[str, Path]) -> None:
    tokens = stores["text"].parents[2] / "text_tok"
    before = sorted(p.name for p in tokens.iterdir())
    line = cli_error("export", str(stores["text"]), "--to", "trl", "--output", str(tokens))
    assert "--output is a token store" in line and sorted(p.name for p in tokens.iterdir()) == before


# ---- failure paths: exit 1, one line, nothing left ------------------------------------------------


def test_unknown_target(stores: dict[str, Path], tmp_path: Path) -> None:
    code, _, err = cli("export", str(stores["chat"]), "--to", "axolotl", "--output", str(tmp_path / "o"))
    assert code == 2 and "'axolotl' is not one of" in err and "Traceback" not in err  # a usage error
    with pytest.raises(ConfigError, match="unknown export target 'axolotl'.*megatron-bridge, nemo, trl, olmo-core"):
        ExportConfig(stores["chat"], "axolotl", tmp_path / "o").validate()  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()


def test_missing_split_and_size(stores: dict[str, Path], tmp_path: Path) -> None:
    line = cli_error("export", str(stores["text"]), "--to", "trl", "--split", "test", "--output", str(tmp_path / "o"))
    assert "no metadata line for split 'test'" in line
    line = cli_error("export", str(stores["text"]), "--to", "trl", "--size", "4096", "--output", str(tmp_path / "o"))
    assert "no packs of size 4096 (found 512)" in line
    line = cli_error("export", str(tmp_path / "nowhere"), "--to", "trl", "--output", str(tmp_path / "o"))
    assert "no pack store" in line
    tokens = stores["text"].parents[2] / "text_tok"  # was "no token store or pack store at ... (no manifest.json"
    line = cli_error("export", str(tokens), "--to", "trl", "--output", str(tmp_path / "o"))
    assert "is a token store, not a pack store" in line and "run `packtool pack`" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("target", TARGETS)
def test_a_write_the_file_system_refuses_is_one_line_and_leaves_nothing(stores: dict[str, Path], tmp_path: Path,
                                                                       target: str) -> None:
    """A read-only or full file system under --output was an OSError traceback (the lock file, or the data
    written under `ulimit -f` as ENOSPC would be); now one line naming the file, and nothing left behind."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the default kill

    out = tmp_path / "o"
    proc = subprocess.run([sys.executable, "-m", "packtool", "export", str(stores["text"]), "--to", target, "--output",
                           str(out), "-q"], preexec_fn=limited, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr.startswith("error: cannot write the output (") and "File too large" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not list(out.iterdir())
    assert [p.name for p in tmp_path.iterdir()] in ([], ["o"])  # no lock, no staging left beside it
    (tmp_path / ".o.lock").mkdir()  # the lock cannot be opened: EISDIR (EROFS on a read-only mount alike)
    line = cli_error("export", str(stores["text"]), "--to", target, "--output", str(out))
    assert line.startswith("error: cannot write the output (Is a directory)") and ".o.lock" in line, line


@pytest.mark.parametrize("target", ["megatron-bridge", "nemo", "olmo-core"])
def test_pad_multiple_store_is_refused(stores: dict[str, Path], tmp_path: Path, target: str) -> None:
    line = cli_error("export", str(stores["pad8"]), "--to", target, "--output", str(tmp_path / "o"))
    assert "--pad-multiple" in line and "re-pack without --pad-multiple" in line
    assert not (tmp_path / "o").exists()


def test_olmo_core_refuses_sequences_without_eos(stores: dict[str, Path], tmp_path: Path) -> None:
    line = cli_error("export", str(stores["chat"]), "--to", "olmo-core", "--output", str(tmp_path / "o"))
    assert "do not end with EOS" in line and "followed by another sequence" in line and "--eos" in line
    assert not (tmp_path / "o").exists()  # refused mid-write: the staged files are gone too


def test_olmo_core_refuses_eos_inside_a_sequence_and_pad_equal_to_eos(stores: dict[str, Path], tmp_path: Path) -> None:
    tokens = np.load(stores["text"] / f"training_{SIZE}.npy")
    common = int(np.bincount(tokens[:, :50].ravel()).argmax())  # a frequent token id, called EOS here
    assert common not in (0, 1)
    line = cli_error("export", str(stores["text"]), "--to", "olmo-core", "--eos-id", str(common), "--output", str(tmp_path / "o"))
    assert "EOS" in line and "OLMo-core" in line
    line = cli_error("export", str(stores["text"]), "--to", "olmo-core", "--eos-id", "1", "--output", str(tmp_path / "o"))
    assert "pad id 1" in line and "is the EOS id" in line
    assert not (tmp_path / "o").exists()


def test_megatron_refuses_targets_after_an_eos_input(stores: dict[str, Path], tmp_path: Path) -> None:
    """Megatron zeroes the loss after every EOS input: a store where that drops targets is refused, mid-write."""
    tokens = np.load(stores["text"] / f"training_{SIZE}.npy")
    common = int(np.bincount(tokens[:, :50].ravel()).argmax())
    line = cli_error("export", str(stores["text"]), "--to", "megatron-bridge", "--eos-id", str(common),
                  "--output", str(tmp_path / "o"))
    assert "follow an EOS" in line
    assert not (tmp_path / "o").exists()


def test_existing_output_is_refused_then_overwritten(stores: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "o"
    _ok("export", str(stores["text"]), "--to", "olmo-core", "--output", str(out), "-q")
    before = (out / f"training_{SIZE}.npy").read_bytes()
    line = cli_error("export", str(stores["text"]), "--to", "olmo-core", "--output", str(out))
    assert "already exists" in line and "--overwrite" in line
    (out / "keep.txt").write_text("mine")
    _ok("export", str(stores["text"]), "--to", "olmo-core", "--output", str(out), "--overwrite", "-q")
    assert (out / f"training_{SIZE}.npy").read_bytes() == before and (out / "keep.txt").read_text() == "mine"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp left


def test_output_may_not_be_the_pack_directory(stores: dict[str, Path]) -> None:
    line = cli_error("export", str(stores["chat"]), "--to", "nemo", "--output", str(stores["chat"]))
    assert "pack directory itself" in line


def test_run_yaml_export_section(tmp_path: Path) -> None:
    """`packtool run`: an `export:` section with the flags as keys; path/size/split come from the pack step."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"tokenize: {{inputs: {SAMPLE / 'prompt_completion.jsonl'}, tokenizer: {SAMPLE / 'tokenizer'}, "
        "output: out/tokens, format: prompt-completion, workers: 1}\n"
        "pack: {size: 512, output: out, overlong: drop}\n"
        "export: {to: olmo-core, output: out/olmo}\n"
    )
    out = _ok("run", str(cfg), "-q")
    assert "exported" in out and "NumpyFSLDataset(" in out
    assert (tmp_path / "out" / "olmo" / f"training_{SIZE}.label_mask.npy").exists()
    cfg.write_text(cfg.read_text().replace("to: olmo-core", "to: axolotl"))
    line = cli_error("run", str(cfg), "-q", code=2)  # a value outside its choices, as `--to axolotl`
    assert "'axolotl' is not one of megatron-bridge, nemo, trl, olmo-core" in line


@pytest.mark.parametrize("values", [[], [0, 1, 255], [7, 256, 65535], [3, 65536, 2**31 - 1]])
def test_pickled_int_lists_load_as_plain_python_lists(values: list[int], tmp_path: Path) -> None:
    """The pre-encoded pickle opcodes (K/M/J by width) load exactly like pickling the Python list."""
    import io

    from packtool.formats.exports import PickledIntList, write_object_npy

    rows = [{"input_ids": PickledIntList(np.array(values, dtype=np.int64)), "seq_start_id": PickledIntList(np.zeros(1))}]
    buf = io.BytesIO()
    write_object_npy(buf, rows)
    ref = io.BytesIO()
    np.save(ref, np.array([{"input_ids": list(values), "seq_start_id": [0]}], dtype=object), allow_pickle=True)
    got, want = np.load(io.BytesIO(buf.getvalue()), allow_pickle=True), np.load(io.BytesIO(ref.getvalue()), allow_pickle=True)
    assert got.dtype == want.dtype == object and got.shape == want.shape == (1,)
    assert got[0] == want[0] and all(type(v) is int for v in got[0]["input_ids"])
    with pytest.raises(ValueError):
        PickledIntList(np.array([-1]))


def test_a_second_export_into_a_locked_output_fails_at_once(stores: dict[str, Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    out = tmp_path / "o"
    hold = "import sys, time\nfrom packtool.formats.locks import exclusive_output\nwith exclusive_output(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(30)\n"
    proc = subprocess.Popen([sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        line = cli_error("export", str(stores["chat"]), "--to", "trl", "--output", str(out))
        assert f"pid {proc.pid}" in line and "another packtool run" in line
        assert not out.exists()
    finally:
        proc.kill()
        proc.wait()
