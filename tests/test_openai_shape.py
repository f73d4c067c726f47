"""`--format openai`: OpenAI's fine-tuning chat records with per-message `weight`, against transformers.

Each record is written next to what it must give, by hand: the ids equal transformers'
`apply_chat_template(messages without their weight keys, tools=..., tokenize=True)` with real chat
templates (Qwen2.5, Llama 3.1: tests/fixtures/chat_templates, tiny tokenizers built offline), and
the targets decode to exactly the assistant turns of weight 1 (`--assistant-turns last`: the last
assistant turn, if its weight is 1). Bad weights fail at file:line or go to rejects.jsonl;
`--format auto` finds the shape from records that carry weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import cli, cli_error, target_runs, tokenize_rows, write_jsonl
from test_chat_templates import build_tokenizer, fixture
from tokenizers import Tokenizer

import packtool
from packtool.choices import InputFormat
from packtool.core.encoding.shapes.base import ShapeError, ShapeOptions
from packtool.core.encoding.shapes.registry import shape_spec
from packtool.formats.token_store import open_token_store

transformers = pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
#: (record, the messages the template must see, the tools, the texts of the target assistant turns)
RECORDS: list[tuple[dict[str, Any], list[dict[str, Any]], list[Any] | None, list[str]]] = [
    ({"messages": [{"role": "system", "content": "Marv is a sarcastic bot."},
                   {"role": "user", "content": "USR What's the capital of France?"},
                   {"role": "assistant", "content": "Paris", "weight": 0},
                   {"role": "user", "content": "USR Can you be more sarcastic?"},
                   {"role": "assistant", "content": "Paris, as if everyone doesn't know that already.", "weight": 1}]},
     [{"role": "system", "content": "Marv is a sarcastic bot."},
      {"role": "user", "content": "USR What's the capital of France?"}, {"role": "assistant", "content": "Paris"},
      {"role": "user", "content": "USR Can you be more sarcastic?"},
      {"role": "assistant", "content": "Paris, as if everyone doesn't know that already."}],
     None, ["Paris, as if everyone doesn't know that already."]),
    ({"messages": [{"role": "user", "content": "USR Привет!"}, {"role": "assistant", "content": "Здравствуйте."},
                   {"role": "user", "content": "USR 東京は？"}, {"role": "assistant", "content": "晴れです。", "weight": 0}]},
     [{"role": "user", "content": "USR Привет!"}, {"role": "assistant", "content": "Здравствуйте."},
      {"role": "user", "content": "USR 東京は？"}, {"role": "assistant", "content": "晴れです。"}],
     None, ["Здравствуйте."]),  # no weight = 1; the last turn is context
    ({"messages": [{"role": "user", "content": "USR Weather in Paris?"},
                   {"role": "assistant", "content": "Let me check.", "weight": 0},
                   {"role": "user", "content": "USR Please."}, {"role": "assistant", "content": "It is 21 °C."}],
      "tools": TOOLS},
     [{"role": "user", "content": "USR Weather in Paris?"}, {"role": "assistant", "content": "Let me check."},
      {"role": "user", "content": "USR Please."}, {"role": "assistant", "content": "It is 21 °C."}],
     TOOLS, ["It is 21 °C."]),
    ({"messages": [{"role": "user", "content": "USR one"}, {"role": "assistant", "content": "Uno.", "weight": 1.0},
                   {"role": "user", "content": "USR two"}, {"role": "assistant", "content": "Dos.", "weight": 0.0}]},
     [{"role": "user", "content": "USR one"}, {"role": "assistant", "content": "Uno."},
      {"role": "user", "content": "USR two"}, {"role": "assistant", "content": "Dos."}],
     None, ["Uno."]),  # 1.0 and 0.0: a table's float column
    ({"messages": [{"role": "user", "content": "USR hi"}, {"role": "assistant", "content": "Hello!"}]},
     [{"role": "user", "content": "USR hi"}, {"role": "assistant", "content": "Hello!"}],
     None, ["Hello!"]),  # a record without any weight in a weighted file
]
FAMILIES = ["qwen2_5", "llama3_1"]
END = {"qwen2_5": "<|im_end|>", "llama3_1": "<|eot_id|>"}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("openai_tok")
    return {family: build_tokenizer(root / family, fixture(family)) for family in FAMILIES}


def reference(tok_dir: Path, family: str, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
    spec = fixture(family)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tok_dir / "tokenizer.json")),
        chat_template=spec["chat_template"], **{k: spec[k] for k in ("bos_token", "eos_token") if spec[k]})
    out = hf.apply_chat_template(messages, tools=tools, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def targets_of(out: Path, tok_dir: Path) -> list[list[str]]:
    store = open_token_store(out)
    assert store.loss is not None
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return [[tok.decode(r, skip_special_tokens=False)
             for r in target_runs(store.document(d), store.loss[store.starts[d] : store.boundaries[d]])]
            for d in range(store.n_documents)]


@pytest.mark.parametrize("family", FAMILIES)
def test_ids_are_the_template_without_weights_and_targets_the_weight_1_turns(tmp_path: Path,
                                                                            tokenizers: dict[str, Path],
                                                                            family: str) -> None:
    tok_dir = tokenizers[family]
    out, stdout = tokenize_rows(tmp_path, tok_dir, [r for r, _, _, _ in RECORDS], "--format", "openai")
    store = open_token_store(out)
    assert store.n_documents == len(RECORDS) and "0 rejected" in stdout
    for doc, (_, messages, tools, _) in enumerate(RECORDS):
        assert store.document(doc).tolist() == reference(tok_dir, family, messages, tools), (family, doc)
    for doc, ((_, _, _, wanted), pieces) in enumerate(zip(RECORDS, targets_of(out, tok_dir), strict=True)):
        assert len(pieces) == len(wanted), (family, doc, pieces)
        for piece, text in zip(pieces, wanted, strict=True):
            assert piece.endswith(END[family]) and "USR" not in piece, (family, doc, piece)
            if family == "qwen2_5":  # exactly the turn's rendering through its end-of-turn
                assert piece == text + END[family], (doc, piece)
            else:
                assert text in piece, (doc, piece)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input_format"] == "openai" and manifest["input_shape"] == {"name": "openai", "detected": False}
    assert manifest["fields"] == {"messages_field": "messages"}
    fast, _ = tokenize_rows(tmp_path, tok_dir, [r for r, _, _, _ in RECORDS], "--format", "openai", "--backend", "fast",
                       name="fast")
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (fast / name).read_bytes() == (out / name).read_bytes(), name


def test_the_weight_never_reaches_the_template(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """A template that renders every key of a message (as some tool-call templates do) sees no `weight`."""
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m | tojson }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (tmp_path / "keys.jinja").write_text(template)
    tok_dir = tokenizers["qwen2_5"]
    out, _ = tokenize_rows(tmp_path, tok_dir, [r for r, _, _, _ in RECORDS[:2]], "--format", "openai", "--chat-template",
                      str(tmp_path / "keys.jinja"))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tok_dir / "tokenizer.json")),
                                              chat_template=template)
    store = open_token_store(out)
    for doc, (_, messages, _, _) in enumerate(RECORDS[:2]):
        want = hf.apply_chat_template(messages, tokenize=True)
        assert store.document(doc).tolist() == list(want["input_ids"] if hasattr(want, "keys") else want), doc
        assert "weight" not in hf.decode(store.document(doc).tolist())


def test_assistant_turns_last_is_the_last_turn_when_its_weight_is_1(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    tok_dir = tokenizers["qwen2_5"]
    out, _ = tokenize_rows(tmp_path, tok_dir, [r for r, _, _, _ in RECORDS], "--format", "openai", "--assistant-turns", "last")
    got = targets_of(out, tok_dir)
    last = [[m for m in messages if m["role"] == "assistant"][-1]["content"] for _, messages, _, _ in RECORDS]
    for doc, ((_, _, _, wanted), pieces) in enumerate(zip(RECORDS, got, strict=True)):
        expect = [last[doc] + "<|im_end|>"] if last[doc] in wanted else []  # record 2's last turn has weight 0
        assert pieces == expect, (doc, pieces)
    assert got[1] == [] and open_token_store(out).n_documents == len(RECORDS)


def test_without_weight_0_openai_equals_chat(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """Weights of 1 change nothing: the same bytes as --format chat of the messages without them."""
    rows = [{"messages": [{**m, "weight": 1} if m["role"] == "assistant" else m for m in messages], "tools": tools}
            for _, messages, tools, _ in RECORDS]
    openai, _ = tokenize_rows(tmp_path, tokenizers["llama3_1"], rows, "--format", "openai", name="openai")
    chat, _ = tokenize_rows(tmp_path, tokenizers["llama3_1"], [{"messages": m, "tools": t} for _, m, t, _ in RECORDS],
                       "--format", "chat", name="chat")
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (openai / name).read_bytes() == (chat / name).read_bytes(), name


BAD = [
    ({"messages": [{"role": "user", "content": "x", "weight": 1}, {"role": "assistant", "content": "y"}]},
     "message 0 has a 'weight' but is a 'user' message"),
    ({"messages": [{"role": "system", "content": "s", "weight": 0}, {"role": "user", "content": "x"},
                   {"role": "assistant", "content": "y"}]}, "message 0 has a 'weight' but is a 'system' message"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 2}]},
     "message 1 has weight 2, not 0 or 1"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0.5}]},
     "message 1 has weight 0.5, not 0 or 1"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": True}]},
     "message 1 has weight true, not 0 or 1"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": "1"}]},
     "message 1 has weight \"1\", not 0 or 1"),
    ({"messages": "hello"}, "messages must be a non-empty list"),
    ({"conversation": []}, "missing field 'messages'"),
]


def test_bad_weights_fail_at_file_line_or_are_rejected_by_reason(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    tok = str(tokenizers["qwen2_5"])
    good = RECORDS[0][0]
    for k, (record, reason) in enumerate(BAD):
        src = write_jsonl(tmp_path / f"bad{k}.jsonl", [good, record])
        line = cli_error("tokenize", str(src), "--tokenizer", tok, "--output", str(tmp_path / f"o{k}"), "--format",
                         "openai")
        assert f"bad{k}.jsonl:2" in line and reason in line, (line, reason)
        assert not (tmp_path / f"o{k}").exists()
    out, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], [good, *(r for r, _ in BAD), good], "--format", "openai",
                           name="skip")
    rejects = {r["line"]: r["reason"] for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert sorted(rejects) == list(range(2, len(BAD) + 2))
    for line, (_, reason) in enumerate(BAD, start=2):
        assert reason in rejects[line], (rejects[line], reason)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_documents"] == 2 and manifest["rejected_by_reason"]["message N has a 'weight' but is a 'user' message"] == 1
    assert f"{len(BAD)} rejected (" in stdout


def test_auto_finds_openai_from_weighted_records_and_keeps_plain_chat_chat(tmp_path: Path,
                                                                            tokenizers: dict[str, Path]) -> None:
    tok_dir = tokenizers["qwen2_5"]
    rows = [RECORDS[4][0], RECORDS[4][0], RECORDS[0][0], RECORDS[1][0]]  # weights only from the third record on
    auto, stdout = tokenize_rows(tmp_path, tok_dir, rows, "--format", "auto", name="auto")
    assert "detected format openai," in stdout
    assert json.loads((auto / "manifest.json").read_text())["input_shape"] == {"name": "openai", "detected": True}
    given, _ = tokenize_rows(tmp_path, tok_dir, rows, "--format", "openai", name="given")
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (auto / name).read_bytes() == (given / name).read_bytes(), name
    assert targets_of(auto, tok_dir)[3] == ["Здравствуйте.<|im_end|>"]  # the weight-0 turn is not trained on
    _, stdout = tokenize_rows(tmp_path, tok_dir, [RECORDS[4][0]] * 2, "--format", "auto", name="chat")
    assert "detected format chat," in stdout  # no weight anywhere: chat
    src = write_jsonl(tmp_path / "mixed.jsonl", [RECORDS[0][0], {"conversations": [{"from": "human", "value": "x"}]}])
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok_dir), "--output", str(tmp_path / "m"), "--format", "auto")
    assert "two record shapes: openai at" in line and "sharegpt at" in line and "mixed.jsonl:2" in line
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok_dir), "--output", str(tmp_path / "m"), "--format",
                     "openai", "--role-map", "bot=assistant", code=2)
    assert "--role-map does not apply to --format openai" in line


def test_a_parquet_file_with_null_weights_gives_the_jsonl_bytes(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """A table gives every message every key: weights absent in the jsonl are nulls in parquet, and mean 1."""
    rows = [{"messages": r["messages"]} for r, _, _, _ in RECORDS if "tools" not in r and r is not RECORDS[3][0]]
    table = pa.Table.from_pylist(rows)
    assert table.schema.field("messages").type.value_type.get_field_index("weight") >= 0
    pq.write_table(table, tmp_path / "data.parquet")
    tok = str(tokenizers["qwen2_5"])
    code, _, err = cli("tokenize", str(tmp_path / "data.parquet"), "--tokenizer", tok, "--output", str(tmp_path / "pq"),
                       "--format", "auto", "-q", "--workers", "1")
    assert code == 0, err
    jsonl, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "openai", name="jsonl")
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (tmp_path / "pq" / name).read_bytes() == (jsonl / name).read_bytes(), name


def test_python_api(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    spec = shape_spec("openai")
    conv = spec.convert(RECORDS[0][0], ShapeOptions(spec.default_fields()))
    assert conv.messages == RECORDS[0][1] and conv.targets == (False, False, False, False, True)  # type: ignore[union-attr]
    assert spec.convert(RECORDS[4][0], ShapeOptions(spec.default_fields())).targets is None  # type: ignore[union-attr]
    with pytest.raises(ShapeError, match="not 0 or 1"):
        spec.convert(BAD[2][0], ShapeOptions(spec.default_fields()))
    src = write_jsonl(tmp_path / "in.jsonl", [r for r, _, _, _ in RECORDS])
    result = packtool.tokenize_corpus(packtool.TokenizeConfig(
        inputs=(str(src),), tokenizer=str(tokenizers["qwen2_5"]), output=str(tmp_path / "api"),
        format=InputFormat.OPENAI, workers=1))
    assert result.manifest["n_documents"] == len(RECORDS) and result.manifest["input_format"] == "openai"
