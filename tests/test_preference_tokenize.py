"""`packtool tokenize --format preference` against TRL 1.16 `DPOTrainer`'s preprocessing.

Every shape (TRL standard / conversational, explicit / implicit prompt, with tools; LLaMA-Factory's ShareGPT
and Alpaca ranking records) with two real chat templates (Qwen2.5, Llama 3.1: tests/fixtures, tiny tokenizers
built offline): each pair is documents 2i (chosen) and 2i+1 (rejected), their ids are TRL's prompt + completion
ids and `tokens.loss` its completion mask, as `trl_preference_reference.trl_reference` writes TRL's steps out with
transformers (tests/interop/test_trl_preference.py checks that against TRL's own code). Also: `--format auto`,
the same bytes from every source, workers, chunking and engine, hostile records at file:line and in
rejects.jsonl (both sequences or neither), the flags that do not apply.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from input_support import hub_repo, same_store_bytes, tokenize_ok
from support import cli, cli_error, write_jsonl
from trl_preference_reference import (
    LIST_TOOLS,
    MIXED_PARTS,
    SHAPES,
    as_trl,
    build_tokenizers,
    hf_tokenizer,
    sequences,
    trl_reference,
)

from packtool.formats.token_store import open_token_store

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tokenizers(tmp_path_factory.mktemp("pref_tok"))


def store_sequences(out: Path) -> list[tuple[list[int], list[int]]]:
    store = open_token_store(out)
    assert store.loss is not None  # always written for a preference store
    return [(store.document(d).tolist(), store.loss[store.starts[d]: store.boundaries[d]].tolist())
            for d in range(store.n_documents)]


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_1"])
def test_every_shape_gives_trl_ids_and_completion_masks(tmp_path: Path, tokenizers: dict[str, Path],
                                                        family: str) -> None:
    tok_dir = tokenizers[family]
    hf = hf_tokenizer(tok_dir, family)
    for name, (shape, records) in SHAPES.items():
        if family == "llama3_1" and any("tools" in r for r in records) and name != "standard":
            records = [r for r in records if "tools" not in r]  # this Llama 3 template renders no tools
        src = write_jsonl(tmp_path / f"{name}.jsonl", records)
        out = tokenize_ok([src], tok_dir, tmp_path / f"{family}_{name}", "--format", "preference", "--workers", "1")
        want = sequences(trl_reference(hf, [as_trl(name, r) for r in records]))
        assert store_sequences(out) == want, (family, name)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["preference"] == {"pairs": len(records), "layout": "chosen,rejected"}
        assert manifest["input_format"] == "preference" and manifest["input_shape"] == {"name": shape,
                                                                                       "detected": False}
        assert open_token_store(out).preference_pairs == len(records)
        auto = tokenize_ok([src], tok_dir, tmp_path / f"{family}_{name}_auto", "--format", "auto")
        assert json.loads((auto / "manifest.json").read_text())["input_shape"] == {"name": shape, "detected": True}
        same_store_bytes(out, auto)
        fast = tokenize_ok([src], tok_dir, tmp_path / f"{family}_{name}_fast", "--format", "preference",
                           "--backend", "fast", "--workers", "2")
        same_store_bytes(out, fast)


@pytest.mark.parametrize(("family", "case"), [("llama3_1", MIXED_PARTS), ("qwen2_5", LIST_TOOLS)])
def test_objects_with_mixed_keys_are_read_as_datasets_gives_them_to_trl(tmp_path: Path, tokenizers: dict[str, Path],
                                                                         family: str, case: Any) -> None:
    """`datasets` gives every content part every key of any part in its column (None where it has none), every
    tool every property, every tool call's arguments every name: a template that prints a content list (Llama 3.1)
    or `tojson`s the tools (Qwen2.5) renders those Nones. The ids are TRL's of the records as it reads them (written
    out in `trl_preference_reference`; tests/interop checks them against TRL's own preprocessing)."""
    written, read = case
    hf = hf_tokenizer(tokenizers[family], family)
    want = sequences(trl_reference(hf, read))
    assert want != sequences(trl_reference(hf, written))  # the Nones are in the text
    for fmt in ("preference", "auto"):
        out = tokenize_ok([write_jsonl(tmp_path / "p.jsonl", written)], tokenizers[family], tmp_path / fmt,
                          "--format", fmt)
        assert store_sequences(out) == want


def test_the_boundary_cases_are_covered(tokenizers: dict[str, Path]) -> None:
    """The records above do hit TRL's corner cases: a prompt whose last token merges into the completion (the
    cut falls inside the tokenized prompt), an empty completion, a BOS from the tokenizer's post-processor."""
    hf = hf_tokenizer(tokenizers["llama3_1"], "llama3_1")
    records = SHAPES["standard"][1]
    reference = trl_reference(hf, records)
    (p1, _, _), (_, _, r2) = reference[1], reference[2]
    assert len(p1) < len(hf(text=records[1]["prompt"])["input_ids"])  # " " + "4" merged: the cut moved back
    assert r2 == [hf.eos_token_id]  # "" + EOS
    assert p1[0] == hf.bos_token_id  # the post-processor's BOS, once


def test_a_store_whose_every_token_is_a_target_keeps_its_loss_file(tmp_path: Path,
                                                                    tokenizers: dict[str, Path]) -> None:
    """An empty explicit prompt on a tokenizer without BOS: every token is a target, and tokens.loss is there."""
    src = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "", "chosen": "a b", "rejected": "c"}])
    out = tokenize_ok([src], tokenizers["qwen2_5"], tmp_path / "out", "--format", "preference")
    store = open_token_store(out)
    assert store.loss is not None and store.loss.all() and (out / "tokens.loss").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_target_tokens"] == manifest["n_tokens"] and "tokens.loss" in manifest["files"]


def _csv(records: list[dict[str, Any]]) -> str:
    header = sorted({k for r in records for k in r})
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for r in records:
        writer.writerow([json.dumps(r[k], ensure_ascii=False) if isinstance(r.get(k), (list, dict)) else r.get(k, "")
                         for k in header])
    return buf.getvalue()


@pytest.mark.parametrize("name", ["standard", "conversational", "ranking_sharegpt"])
def test_the_same_records_give_the_same_bytes_from_every_source(tmp_path: Path, tokenizers: dict[str, Path],
                                                                 name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    tok = tokenizers["qwen2_5"]
    records = SHAPES[name][1] * 40  # several chunks at 4 KiB
    src = write_jsonl(tmp_path / "src.jsonl", records)
    ref = tokenize_ok([src], tok, tmp_path / "ref", "--format", "preference", "--workers", "1")
    (tmp_path / "src.json").write_text(json.dumps(records, ensure_ascii=False), "utf-8")
    (tmp_path / "src.csv").write_text(_csv(records), "utf-8")
    keys = sorted({k for r in records for k in r})  # from_pylist would take the first record's keys only
    table = pa.Table.from_pydict({k: [r.get(k) for r in records] for k in keys})
    pq.write_table(table, tmp_path / "src.parquet", row_group_size=7)
    datasets.Dataset(table).save_to_disk(str(tmp_path / "saved"))
    cache = tmp_path / "hub"
    hub_repo(cache, "datasets", "org/pairs", {"data/train.parquet": (tmp_path / "src.parquet").read_bytes()})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    inputs = {"json": [tmp_path / "src.json"], "csv": [tmp_path / "src.csv"], "parquet": [tmp_path / "src.parquet"],
              "arrow": [tmp_path / "saved"], "hub": ["hf://datasets/org/pairs"]}
    for kind, paths in inputs.items():
        out = tokenize_ok(paths, tok, tmp_path / f"out_{kind}", "--format", "preference", "--workers", "2", "--chunk-bytes",
                          "4096")
        same_store_bytes(ref, out)
        assert open_token_store(out).preference_pairs == len(records), kind
    small = tokenize_ok([src], tok, tmp_path / "small", "--format", "auto", "--workers", "2", "--chunk-bytes", "512")
    same_store_bytes(ref, small)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


GOOD = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
CONV = {"prompt": [{"role": "user", "content": "USR hi"}], "chosen": [{"role": "assistant", "content": "Hello."}],
        "rejected": [{"role": "assistant", "content": "Go."}]}
#: (format the first record sets, bad record, the reason it must give)
HOSTILE: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    (GOOD, {"prompt": "x", "chosen": " y"}, "missing field 'rejected'"),
    (GOOD, {"prompt": "x", "chosen": 3, "rejected": "z"}, "field 'chosen' is not a string (got int)"),
    (GOOD, {"prompt": None, "chosen": "a", "rejected": "b"}, "missing field 'prompt'"),
    (GOOD, {"prompt": "x", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]},
     "field 'rejected' is a list, but the first record holds strings (standard)"),
    (GOOD, CONV, "field 'prompt' is a list, but the first record holds strings"),
    (GOOD, {"prompt": "x", "chosen": "a", "rejected": "b", "tools": "{not json"}, "field 'tools' is a string that is not JSON"),
    (GOOD, "just a string", "the record is not a JSON object"),
    (GOOD, {**GOOD, "messages": [{"role": "user", "content": "hi"}]}, "the record's 'messages' field is a list of "
     "messages while its pair is standard (strings): TRL decides whether a record is conversational from one of"),
    (GOOD, {**GOOD, "images": ["cat.png"]}, "the record has 'images': pairs with images are not supported yet"),
    (CONV, {**CONV, "chosen": []}, "field 'chosen' is an empty list of messages"),
    (CONV, {**CONV, "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}]},
     "message 0 of field 'prompt' holds a content part of type 'image': pairs with images are not supported yet"),
    (CONV, {**CONV, "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "What?"}, {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}]},
     "message 1 of field 'prompt' holds a content part of type 'image_url': pairs with images are not supported yet"),
    (CONV, {**CONV, "rejected": [{"role": "assistant", "content": [{"type": "video", "video": "a.mp4"}]}]},
     "message 0 of field 'rejected' holds a content part of type 'video': pairs with images are not supported yet"),
    (CONV, {**CONV, "image": "cat.png"}, "the record has 'image': pairs with images are not supported yet"),
    (CONV, {**CONV, "images": []}, "the record has 'images' (empty: TRL reads a dataset with this column as vision"),
    (CONV, {**CONV, "completion": "Hello."}, "the record's 'completion' field is not a list of messages while its "
     "pair is conversational"),
    (CONV, {**CONV, "messages": None}, "the record's 'messages' field is not a list of messages"),
    (CONV, {**CONV, "image": None}, "the record has 'image' (empty: TRL reads a dataset with this column as vision"),
    (CONV, {**CONV, "prompt": [{"role": "user", "content": [{"type": "text", "text": "q", "meta": _nested(900)}]}]},
     "field 'prompt' nests objects too deeply to read"),
    (CONV, {**CONV, "chat_template_kwargs": {"enable_thinking": False}}, "the record sets 'chat_template_kwargs'"),
    (CONV, {**CONV, "chosen": "Hello."}, "field 'chosen' is a string, but the first record holds lists of messages"),
    (CONV, {**CONV, "rejected": [{"role": "robot", "content": "x"}]}, "message 1 has unknown role 'robot'"),
    (CONV, {**CONV, "chosen": [{"role": "assistant", "content": 5}]}, "message 1 content is not a string"),
    (CONV, {"chosen": CONV["prompt"] + CONV["chosen"], "rejected": CONV["prompt"] + CONV["rejected"]},
     "missing field 'prompt'"),
    ({"chosen": "Same start, yes", "rejected": "Same start, no"}, {"chosen": "abc", "rejected": "xyz"},
     "chosen and rejected share no leading text"),
    ({"chosen": "Same start, yes", "rejected": "Same start, no"}, {"chosen": "ends in a space ", "rejected": "other"},
     "chosen and rejected share no leading text"),
    ({"chosen": "Same start, yes", "rejected": "Same start, no"}, {"chosen": "", "rejected": "x"},
     "field 'chosen' is empty"),
    ({"chosen": "Same start, yes", "rejected": "Same start, no"}, GOOD, "the record has a 'prompt' field but the first"),
    ({"chosen": "Same start, yes", "rejected": "Same start, no"},
     {"chosen": "Same yes", "rejected": "Same no", "completion": [{"role": "assistant", "content": "x"}]},
     "the record's 'completion' field is a list of messages while its pair is standard"),
    ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
      "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]},
     {"chosen": [{"role": "user", "content": "q1"}], "rejected": [{"role": "user", "content": "q2"}]},
     "chosen and rejected share no leading text"),
    (SHAPES["ranking_sharegpt"][1][0], {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
                                        "chosen": {"from": "gpt", "value": "x"}, "rejected": {"from": "gpt", "value": "y"}},
     "does not end on a user or observation turn"),
    (SHAPES["ranking_sharegpt"][1][0], {"conversations": [{"from": "human", "value": "q"}],
                                        "chosen": {"from": "human", "value": "x"}, "rejected": {"from": "gpt", "value": "y"}},
     "field 'chosen' is a 'human' turn, LLaMA-Factory expects an assistant or function_call turn"),
    (SHAPES["ranking_sharegpt"][1][0], {"conversations": [{"from": "human", "value": "q"}], "chosen": "x",
                                        "rejected": {"from": "gpt", "value": "y"}},
     "field 'chosen' is not a {from, value} turn object (got str)"),
    (SHAPES["ranking_alpaca"][1][0], {"instruction": "q", "chosen": "x"}, "missing field 'rejected'"),
    (SHAPES["ranking_alpaca"][1][0], {"instruction": "q", "chosen": "x", "rejected": "y", "images": ["a.jpg"]},
     "the record has 'images'"),
]


def test_hostile_records_fail_at_file_line_or_are_rejected_whole(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """Per first record (it sets the shape): the bad records are rejected by reason at their line, both
    sequences gone; the first bad one of each file fails a --on-error fail run at file:line, nothing written."""
    tok = tokenizers["qwen2_5"]
    groups: dict[str, list[tuple[dict[str, Any], dict[str, Any], str]]] = {}
    for case in HOSTILE:
        groups.setdefault(json.dumps(case[0]), []).append(case)
    for k, cases in enumerate(groups.values()):
        first = cases[0][0]
        src = write_jsonl(tmp_path / f"bad{k}.jsonl", [first, *(bad for _, bad, _ in cases), first])
        line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / f"o{k}"),
                         "--format", "preference")
        assert f"bad{k}.jsonl:2" in line and cases[0][2] in line, (k, line)
        assert not (tmp_path / f"o{k}").exists()
        out = tokenize_ok([src], tok, tmp_path / f"skip{k}", "--format", "preference", "--on-error", "skip")
        rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
        assert [r["line"] for r in rejects] == list(range(2, len(cases) + 2)), (k, rejects)
        for reject, (_, _, reason) in zip(rejects, cases, strict=True):
            assert reason in reject["reason"], (reject, reason)
        store = open_token_store(out)
        assert store.n_documents == 4 and store.preference_pairs == 2  # both sequences of each bad one are gone
        assert store.document(0).tolist() == store.document(2).tolist()


def test_mixed_shapes_in_one_file(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """--format preference reads the first record's shape (as TRL does) and rejects the others by name;
    --format auto refuses a file of two shapes."""
    tok = tokenizers["qwen2_5"]
    src = write_jsonl(tmp_path / "mixed.jsonl", [GOOD, CONV, GOOD])
    out = tokenize_ok([src], tok, tmp_path / "skip", "--format", "preference", "--on-error", "skip")
    assert open_token_store(out).preference_pairs == 2
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "auto"),
                     "--format", "auto")
    assert "two record shapes" in line and "mixed.jsonl:1" in line and "mixed.jsonl:2" in line


def test_flags_that_do_not_apply_to_pairs_are_usage_errors(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    tok = tokenizers["qwen2_5"]
    src = write_jsonl(tmp_path / "p.jsonl", [GOOD])
    for flags in (["--eos"], ["--no-bos"], ["--assistant-turns", "last"]):
        line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "o"), "--format",
                         "preference", *flags, code=2)
        assert flags[0] in line and ("does not apply to preference pairs" in line or "applies to records with" in line)
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "o"), "--format",
                     "preference", "--instruction-field", "q", code=2)
    assert "--instruction-field does not apply to preference records" in line, line
    conv = write_jsonl(tmp_path / "c.jsonl", [CONV])
    line = cli_error("tokenize", str(conv), "--tokenizer", str(tok), "--output", str(tmp_path / "o"), "--format",
                     "auto", "--assistant-turns", "last", code=2)
    assert "does not apply to preference pairs" in line


def test_standard_pairs_need_an_eos_token(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(bpe_tokenizer_dir, tok)
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": None}))
    src = write_jsonl(tmp_path / "p.jsonl", [GOOD])
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "o"),
                     "--format", "preference")
    assert "defines no eos_token" in line


def test_sharded_runs_merge_into_the_pairs_of_every_shard(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    tok = tokenizers["qwen2_5"]
    src = write_jsonl(tmp_path / "p.jsonl", SHAPES["standard"][1] * 30)
    whole = tokenize_ok([src], tok, tmp_path / "whole", "--format", "preference", "--chunk-bytes", "1024")
    shards = [tokenize_ok([src], tok, tmp_path / f"s{i}", "--format", "preference", "--chunk-bytes", "1024",
                          "--num-shards", "2", "--shard-index", str(i)) for i in range(2)]
    code, _, err = cli("merge", *map(str, shards), "--output", str(tmp_path / "merged"), "-q")
    assert code == 0, err
    same_store_bytes(whole, tmp_path / "merged")
    assert open_token_store(tmp_path / "merged").preference_pairs == 150


def test_the_pair_targets_are_a_vectorised_common_prefix() -> None:
    from packtool.core.encoding.pairs import common_prefix_lengths, targets_from

    rng = np.random.default_rng(0)
    a = [rng.integers(0, 3, size=int(n)) for n in rng.integers(0, 12, size=200)]
    b = [np.r_[x[: int(rng.integers(0, x.size + 1))], rng.integers(0, 3, size=int(rng.integers(0, 5)))] for x in a]
    la, lb = np.array([x.size for x in a]), np.array([x.size for x in b])
    got = common_prefix_lengths(np.concatenate(a), np.cumsum(la) - la, la, np.concatenate(b), np.cumsum(lb) - lb, lb)
    want = [next((i for i in range(min(x.size, y.size)) if x[i] != y[i]), min(x.size, y.size)) for x, y in zip(a, b, strict=True)]
    assert got.tolist() == want
    assert targets_from(np.array([1, 0, 3]), np.array([2, 2, 2])).tolist() == [0, 1, 1, 1, 0, 0]


def test_a_tokenized_preference_store_packs_pair_atomically_and_verifies(tmp_path: Path,
                                                                         tokenizers: dict[str, Path]) -> None:
    """The contract with `pack`: the store `tokenize --format preference` writes packs with --share-prompt and
    without, and `verify --source` finds every pair whole and every document intact."""
    src = write_jsonl(tmp_path / "c.jsonl", SHAPES["conversational"][1] * 5)
    store = tokenize_ok([src], tokenizers["qwen2_5"], tmp_path / "tok", "--format", "preference")
    for flags in ([], ["--share-prompt"]):
        packs = tmp_path / f"packs{len(flags)}"
        code, out, err = cli("pack", str(store), "--size", "1024", "--output", str(packs), *flags)
        assert code == 0, err
        assert "20 of 20 pairs packed whole" in out, out
        code, out, err = cli("verify", str(packs), "--source", str(store))
        assert code == 0 and "20 pairs" in out, (out, err)
