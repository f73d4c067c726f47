"""Record shapes (ShareGPT, Alpaca, TRL's conversational prompt-completion, auto) against transformers.

Each record is written next to the messages it must become (written out by hand here, not computed
by packtool); the store's ids must equal `apply_chat_template(messages, tools=..., tokenize=True)` of
those messages with real chat templates (tests/fixtures), conversations transformers cannot render
must be rejected with the template's reason, and the targets must decode to exactly the assistant
turns. Bad records fail at file:line or go to rejects.jsonl counted by reason; contradictory flags
are usage errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import cli, cli_error, target_runs, tokenize_rows, write_jsonl
from test_chat_templates import build_tokenizer, fixture
from tokenizers import Tokenizer

import packtool
from packtool.core.encoding.shapes.alpaca import alpaca_conversation
from packtool.core.encoding.shapes.base import ShapeError, ShapeFields
from packtool.core.encoding.shapes.detect import detect_shape
from packtool.core.encoding.shapes.roles import parse_role_map
from packtool.core.encoding.shapes.sharegpt import DEFAULT_ROLE_MAP, sharegpt_conversation
from packtool.errors import UsageError
from packtool.formats.token_store import open_token_store

transformers = pytest.importorskip("transformers")

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}

#: (ShareGPT record, the messages it must become, the tools it must pass)
SHAREGPT: list[tuple[dict[str, Any], list[dict[str, Any]], list[Any] | None]] = [
    ({"conversations": [{"from": "human", "value": "USR What is packing?"}, {"from": "gpt", "value": "Many documents in one row."}]},
     [{"role": "user", "content": "USR What is packing?"}, {"role": "assistant", "content": "Many documents in one row."}], None),
    ({"system": "You are terse.", "conversations": [
        {"from": "user", "value": "USR Привет! Как дела?"}, {"from": "chatgpt", "value": "Хорошо, спасибо."},
        {"from": "human", "value": "USR 東京の天気は？"}, {"from": "bard", "value": "東京は晴れです。☀️"},
        {"from": "human", "value": "USR مرحبا"}, {"from": "bing", "value": "أهلا بك"}]},
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "USR Привет! Как дела?"},
      {"role": "assistant", "content": "Хорошо, спасибо."}, {"role": "user", "content": "USR 東京の天気は？"},
      {"role": "assistant", "content": "東京は晴れです。☀️"}, {"role": "user", "content": "USR مرحبا"},
      {"role": "assistant", "content": "أهلا بك"}], None),
    ({"tools": json.dumps(TOOLS), "conversations": [
        {"from": "human", "value": "USR Weather in Paris?"}, {"from": "function_call", "value": json.dumps(CALL)},
        {"from": "observation", "value": '{"temperature": 21}'}, {"from": "gpt", "value": "It is 21 °C."}]},
     [{"role": "user", "content": "USR Weather in Paris?"},
      {"role": "assistant", "tool_calls": [{"type": "function", "function": CALL}]},
      {"role": "tool", "content": '{"temperature": 21}'}, {"role": "assistant", "content": "It is 21 °C."}], TOOLS),
    ({"conversations": [{"from": "gpt", "value": "Hello, how can I help?"}, {"from": "human", "value": "USR Tell a joke."},
                        {"from": "model", "value": "No."}]},  # the model speaks first
     [{"role": "assistant", "content": "Hello, how can I help?"}, {"role": "user", "content": "USR Tell a joke."},
      {"role": "assistant", "content": "No."}], None),
    ({"conversations": [{"from": "human", "value": "USR one"}, {"from": "human", "value": "USR two"},
                        {"from": "gpt", "value": "Three."}, {"from": "gpt", "value": "Four."}]},  # two turns of one role
     [{"role": "user", "content": "USR one"}, {"role": "user", "content": "USR two"},
      {"role": "assistant", "content": "Three."}, {"role": "assistant", "content": "Four."}], None),
    ({"conversations": [{"from": "system", "value": "Answer in French."}, {"from": "human", "value": "USR Hi", "lang": "en"},
                        {"from": "assistant", "value": "Bonjour !"}]},  # an extra turn key stays on the message
     [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "USR Hi", "lang": "en"},
      {"role": "assistant", "content": "Bonjour !"}], None),
    ({"system": "", "tools": None, "conversations": [  # null keys of a table's union schema are absent keys
        {"from": "human", "value": "USR Hi", "role": None, "markdown": None}, {"from": "gpt", "value": "Hey.", "role": None}]},
     [{"role": "user", "content": "USR Hi"}, {"role": "assistant", "content": "Hey."}], None),
]

#: (Alpaca record, the messages it must become): LLaMA-Factory's convention
ALPACA: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
    ({"instruction": "USR Add the numbers.", "input": "2 and 3", "output": "5"},
     [{"role": "user", "content": "USR Add the numbers.\n2 and 3"}, {"role": "assistant", "content": "5"}]),
    ({"instruction": "USR Name a colour.", "input": "", "output": "Blue."},
     [{"role": "user", "content": "USR Name a colour."}, {"role": "assistant", "content": "Blue."}]),
    ({"instruction": "USR Translate to German.", "output": "Guten Morgen.", "system": "You translate."},
     [{"role": "system", "content": "You translate."}, {"role": "user", "content": "USR Translate to German."},
      {"role": "assistant", "content": "Guten Morgen."}]),
    ({"instruction": "USR And now 4+4?", "input": "", "output": "8", "system": "Be brief.",
      "history": [["USR 1+1?", "2"], ["USR 2+2?", "4"]]},
     [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "USR 1+1?"}, {"role": "assistant", "content": "2"},
      {"role": "user", "content": "USR 2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "USR And now 4+4?"}, {"role": "assistant", "content": "8"}]),
    ({"instruction": "USR Say hi.", "input": None, "output": "Hi.", "system": "", "history": []},  # a table's empty cells
     [{"role": "user", "content": "USR Say hi."}, {"role": "assistant", "content": "Hi."}]),
]

FAMILIES = ["qwen2_5", "llama3_2", "gemma3", "mistral_nemo"]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shape_tok")
    return {family: build_tokenizer(root / family, fixture(family)) for family in FAMILIES}


def reference(tok_dir: Path, family: str, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int] | None:
    """transformers' ids, or None when its template refuses the conversation."""
    spec = fixture(family)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tok_dir / "tokenizer.json")),
        chat_template=spec["chat_template"], **{k: spec[k] for k in ("bos_token", "eos_token") if spec[k]})
    try:
        out = hf.apply_chat_template(messages, tools=tools, tokenize=True)
    except Exception:
        return None
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def rejected(out: Path) -> dict[int, str]:
    path = out / "rejects.jsonl"
    return {r["line"]: r["reason"] for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def check_store(out: Path, tok_dir: Path, family: str, cases: list[tuple[list[dict[str, Any]], list[Any] | None]],
                last_only: bool = False) -> int:
    """ids == transformers' for every rendered case, the others rejected by the template; returns cases checked."""
    store = open_token_store(out)
    assert store.loss is not None
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    bad = rejected(out)
    doc = checked = 0
    for line, (messages, tools) in enumerate(cases, start=1):
        want = reference(tok_dir, family, messages, tools)
        if want is None:
            assert "chat template cannot render" in bad[line], (family, line, bad)
            continue
        assert line not in bad, (family, line, bad.get(line))
        ids, loss = store.document(doc), store.loss[store.starts[doc] : store.boundaries[doc]]
        doc += 1
        assert ids.tolist() == want, (family, line)
        pieces = [tok.decode(r, skip_special_tokens=False) for r in target_runs(ids, loss)]
        assert all("USR" not in p for p in pieces), (family, line, pieces)  # no user text is a target
        turns = [m for m in messages if m["role"] == "assistant"]
        turns = turns[-1:] if last_only else turns
        if family == "qwen2_5":  # exactly each turn's rendering through <|im_end|>, nothing else
            assert len(pieces) == len(turns), (line, pieces)
            for piece, turn in zip(pieces, turns, strict=True):
                if "tool_calls" in turn:
                    call = json.dumps(turn["tool_calls"][0]["function"], ensure_ascii=False)
                    assert piece == f"<tool_call>\n{call}\n</tool_call><|im_end|>", piece
                else:
                    assert piece == turn["content"] + "<|im_end|>", (piece, turn)
        else:
            texts = [t["content"] for t in turns if t.get("content")]
            assert all(any(text in p for p in pieces) for text in texts), (family, line, pieces, texts)
        checked += 1
    assert doc == store.n_documents
    return checked


@pytest.mark.parametrize("family", FAMILIES)
def test_sharegpt_ids_and_targets_as_transformers(tmp_path: Path, tokenizers: dict[str, Path], family: str) -> None:
    out, stdout = tokenize_rows(tmp_path, tokenizers[family], [r for r, _, _ in SHAREGPT], "--format", "sharegpt")
    checked = check_store(out, tokenizers[family], family, [(m, t) for _, m, t in SHAREGPT])
    assert checked >= (len(SHAREGPT) if family == "qwen2_5" else 2), checked
    if family in ("gemma3", "mistral_nemo"):  # templates that refuse a model-first or same-role-twice conversation
        assert any("chat template cannot render" in r for r in rejected(out).values())
        assert "chat template cannot render this conversation" in json.loads((out / "manifest.json").read_text())[
            "rejected_by_reason"]
    assert json.loads((out / "manifest.json").read_text())["input_format"] == "sharegpt"


def test_sharegpt_fast_backend_and_last_turn(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [r for r, _, _ in SHAREGPT]
    hf, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "sharegpt", "--backend", "hf", name="hf")
    fast, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "sharegpt", "--backend", "fast", name="fast")
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (hf / name).read_bytes() == (fast / name).read_bytes(), name
    last, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "sharegpt", "--assistant-turns", "last", name="last")
    assert check_store(last, tokenizers["qwen2_5"], "qwen2_5", [(m, t) for _, m, t in SHAREGPT], last_only=True) == len(rows)


@pytest.mark.parametrize("family", ["qwen2_5", "gemma3"])
def test_alpaca_ids_and_targets_as_transformers(tmp_path: Path, tokenizers: dict[str, Path], family: str) -> None:
    out, _ = tokenize_rows(tmp_path, tokenizers[family], [r for r, _ in ALPACA], "--format", "alpaca")
    assert check_store(out, tokenizers[family], family, [(m, None) for _, m in ALPACA]) == len(ALPACA)
    last, _ = tokenize_rows(tmp_path, tokenizers[family], [r for r, _ in ALPACA], "--format", "alpaca",
                       "--assistant-turns", "last", name="last")
    assert check_store(last, tokenizers[family], family, [(m, None) for _, m in ALPACA], last_only=True) == len(ALPACA)


def test_alpaca_field_names_are_flags(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [{"q": r["instruction"], "ctx": r.get("input"), "a": r["output"], "sys": r.get("system"), "h": r.get("history")}
            for r, _ in ALPACA]
    out, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "alpaca", "--instruction-field", "q",
                      "--input-field", "ctx", "--output-field", "a", "--system-field", "sys", "--history-field", "h")
    assert check_store(out, tokenizers["qwen2_5"], "qwen2_5", [(m, None) for _, m in ALPACA]) == len(ALPACA)
    fields = json.loads((out / "manifest.json").read_text())["fields"]
    assert fields["instruction_field"] == "q" and fields["history_field"] == "h"


def test_trl_conversational_prompt_completion_targets_only_the_completion(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "USR 1+1?"},
              {"role": "assistant", "content": "Two."}, {"role": "user", "content": "USR 2+2?"}]
    completion = [{"role": "assistant", "content": "Four."}]
    tool_prompt = [{"role": "user", "content": "USR Weather in Paris?"}]
    tool_completion = [{"role": "assistant", "tool_calls": [{"type": "function", "function": CALL}]},
                       {"role": "tool", "content": "USR 21"}, {"role": "assistant", "content": "21 °C."}]
    rows = [{"prompt": prompt, "completion": completion},
            {"prompt": tool_prompt, "completion": tool_completion, "tools": TOOLS}]
    for fmt in ("prompt-completion", "auto"):
        out, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", fmt, name=f"trl-{fmt}")
        store = open_token_store(out)
        assert store.loss is not None and store.n_documents == 2
        tok = Tokenizer.from_file(str(tokenizers["qwen2_5"] / "tokenizer.json"))
        for doc, (p, c, tools) in enumerate([(prompt, completion, None), (tool_prompt, tool_completion, TOOLS)]):
            ids = store.document(doc)
            assert ids.tolist() == reference(tokenizers["qwen2_5"], "qwen2_5", p + c, tools)
            pieces = [tok.decode(r, skip_special_tokens=False) for r in target_runs(ids, store.loss[store.starts[doc] : store.boundaries[doc]])]
            assert len(pieces) == sum(m["role"] == "assistant" for m in c), pieces  # "Two." is context, not a target
            assert pieces[-1] == c[-1]["content"] + "<|im_end|>"
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["input_shape"] == {"name": "conversational-prompt-completion", "detected": fmt == "auto"}
        assert ("detected format conversational-prompt-completion" in stdout) == (fmt == "auto")


def test_auto_detects_and_names_each_shape(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    shapes = {
        "sharegpt": [SHAREGPT[0][0]],
        "alpaca": [ALPACA[0][0]],
        "chat": [{"messages": SHAREGPT[0][1]}],
        "text": [{"text": "plain text"}],
        "prompt-completion": [{"prompt": "Q: 1+1? A:", "completion": " 2"}],
    }
    for name, rows in shapes.items():
        out, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows + rows, "--format", "auto", name=name)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["input_shape"] == {"name": name, "detected": True}, name
        assert manifest["input_format"] == name and f"detected format {name}," in stdout
        assert manifest["n_documents"] == 2
    # the same records under the explicit format give the same bytes
    explicit, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], shapes["sharegpt"] * 2, "--format", "sharegpt", name="explicit")
    assert (explicit / "tokens.bin").read_bytes() == (tmp_path / "sharegpt" / "tokens.bin").read_bytes()


def test_auto_finds_turns_under_conversation_and_names_the_field(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """LMSYS-Chat-1M and WildChat keep role/content turns under `conversation`, with more keys on each turn."""
    rows = [{"conversation_hash": f"h{i}", "model": "m", "turn": 1, "conversation": [
        {"role": "user", "content": f"Bonjour {i}, ça va ?", "language": "French", "toxic": False, "header": None},
        {"role": "assistant", "content": "Oui, merci !", "language": "French", "toxic": False,
         "header": {"accept-language": "fr"}}]} for i in range(3)]
    out, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "auto", name="auto")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["input_shape"] == {"name": "chat", "detected": True}
    assert manifest["fields"]["messages_field"] == "conversation"
    assert "detected format chat (turns under 'conversation')," in stdout and manifest["n_documents"] == 3
    explicit, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "chat", "--messages-field",
                                "conversation", name="explicit")
    assert "detected" not in stdout
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (explicit / name).read_bytes() == (out / name).read_bytes(), name


def test_auto_refuses_mixed_or_unknown_shapes(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    tok = str(tokenizers["qwen2_5"])
    src = write_jsonl(tmp_path / "mixed.jsonl", [SHAREGPT[0][0], ALPACA[0][0]])
    line = cli_error("tokenize", str(src), "--tokenizer", tok, "--output", str(tmp_path / "o"), "--format", "auto")
    assert "two record shapes: sharegpt at" in line and "mixed.jsonl:2" in line
    src = write_jsonl(tmp_path / "odd.jsonl", [{"question": "?", "answer": "!"}])
    line = cli_error("tokenize", str(src), "--tokenizer", tok, "--output", str(tmp_path / "o"), "--format", "auto")
    assert "recognises no record shape" in line and "--format" in line
    assert "the first holds fields 'question', 'answer')" in line  # what to name in the field flags
    src = write_jsonl(tmp_path / "alp.jsonl", [ALPACA[0][0]])
    line = cli_error("tokenize", str(src), "--tokenizer", tok, "--output", str(tmp_path / "o"), "--format", "auto",
                     "--role-map", "bot=assistant", code=2)  # a flag the detected shape does not read: usage
    assert "--role-map applies to chat and sharegpt" in line and "alpaca" in line
    assert not (tmp_path / "o").exists()


def test_role_map_extends_and_overrides(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [{"conversations": [{"from": "person", "value": "USR Hi"}, {"from": "bot", "value": "Hello."},
                               {"from": "gpt", "value": "USR typed by a human"}, {"from": "bot", "value": "Bye."}]}]
    messages = [{"role": "user", "content": "USR Hi"}, {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "USR typed by a human"}, {"role": "assistant", "content": "Bye."}]
    out, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "sharegpt",
                      "--role-map", "person=user, bot=assistant,gpt=user")
    assert check_store(out, tokenizers["qwen2_5"], "qwen2_5", [(messages, None)]) == 1
    assert json.loads((out / "manifest.json").read_text())["fields"]["role_map"] == {
        "person": "user", "bot": "assistant", "gpt": "user"}
    chat_rows = [{"messages": [{"role": "human", "content": "USR Hi"}, {"role": "bot", "content": "Hello."}]}]
    out, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], chat_rows, "--format", "chat", "--role-map", "human=user,bot=assistant",
                      name="chat")
    assert check_store(out, tokenizers["qwen2_5"], "qwen2_5", [(messages[:2], None)]) == 1



def test_role_names_match_whatever_their_case(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    """`Human`, ` GPT `, `SYSTEM` (ShareGPT exports in the wild) take the default map, a `--role-map` name matches
    any case too (sharegpt and chat), a name mapped twice in two cases is refused, an unknown name is still a reject
    with its reason; the ids are transformers' for the mapped messages."""
    rows = [{"conversations": [{"from": "SYSTEM", "value": "Be brief."}, {"from": "Human", "value": "USR Hi"},
                               {"from": " GPT ", "value": "Hello."}, {"from": "Person", "value": "USR More"},
                               {"from": "ChatGPT", "value": "Sure."}]},
            {"conversations": [{"from": "Human", "value": "USR x"}, {"from": "Narrator", "value": "y"}]}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "USR Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "USR More"},
                {"role": "assistant", "content": "Sure."}]
    tok = tokenizers["qwen2_5"]
    out, _ = tokenize_rows(tmp_path, tok, rows, "--format", "sharegpt", "--role-map", "person=user")
    assert check_store(out, tok, "qwen2_5", [(messages, None)]) == 1
    assert rejected(out) == {2: "turn 1 has unknown role 'Narrator' with no mapping (pass --role-map Narrator=assistant)"}
    chat_rows = [{"messages": [{"role": "Human", "content": "USR Hi"}, {"role": "BOT", "content": "Hello."}]}]
    out, _ = tokenize_rows(tmp_path, tok, chat_rows, "--format", "chat", "--role-map", "human=user,bot=assistant", name="chat")
    assert check_store(out, tok, "qwen2_5", [(messages[1:3], None)]) == 1
    src = write_jsonl(tmp_path / "twice.jsonl", rows[:1])
    line = cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "t"), "--format",
                     "sharegpt", "--role-map", "bot=assistant,Bot=user", code=2)
    assert "mapped twice" in line

BAD_SHAREGPT = [
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "robot", "value": "y"}]}, "turn 1 has unknown role 'robot' with no mapping"),
    ({"conversations": [{"from": "human"}, {"from": "gpt", "value": "y"}]}, "turn 0 has no 'value' (from 'human')"),
    ({"conversations": [{"from": "human", "value": ["x"]}, {"from": "gpt", "value": "y"}]}, "turn 0 (human) 'value' is not a string"),
    ({"conversations": [{"from": "human", "value": None}, {"from": "gpt", "value": "y"}]}, "turn 0 (human) 'value' is not a string"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "{get_weather(Paris)"}]},
     "turn 1 function_call value is not JSON"),
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": '{"arguments": {}}'}]},
     "turn 1 function_call is not a"),
    ({"conversations": []}, "empty conversation"),
    ({"conversations": [{"value": "x"}]}, "turn 0 has no 'from'"),
    ({"conversations": "hello"}, "field 'conversations' is not a list of turns"),
    ({"messages": []}, "the record has no 'conversations' field"),
    ({"conversations": [{"from": "human", "value": "x", "content": "y"}]}, "has both 'from'/'value' and 'content'"),
    ({"conversations": [{"from": "human", "value": "x"}], "system": 3}, "field 'system' is not a string"),
    ({"conversations": [{"from": "human", "value": "x"}], "tools": "not json"}, "field 'tools' is a string that is not JSON"),
    # JSON strings nested 100k deep: json.loads raised RecursionError (a traceback) from inside the shape
    ({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "[" * 100_000 + "]" * 100_000}]},
     "turn 1 function_call value is not JSON (nested too deep to read"),
    ({"conversations": [{"from": "human", "value": "x"}], "tools": "[" * 100_000 + "]" * 100_000},
     "field 'tools' is a string that is not JSON (nested too deep to read"),
]
BAD_ALPACA = [
    ({"instruction": "x", "input": ""}, "the Alpaca record has no 'output' field"),
    ({"instruction": "x", "output": 5}, "field 'output' is not a string"),
    ({"output": "x"}, "the Alpaca record has no 'instruction' field"),
    ({"instruction": "x", "input": 3, "output": "y"}, "field 'input' is not a string"),
    ({"instruction": "x", "output": "y", "history": [["only one"]]}, "history[0] is not a [user, assistant] pair"),
]


@pytest.mark.parametrize(("fmt", "cases"), [("sharegpt", BAD_SHAREGPT), ("alpaca", BAD_ALPACA)])
def test_bad_records_fail_at_file_line_or_are_rejected_by_reason(
    tmp_path: Path, tokenizers: dict[str, Path], fmt: str, cases: list[tuple[dict[str, Any], str]]
) -> None:
    tok = str(tokenizers["qwen2_5"])
    good = SHAREGPT[0][0] if fmt == "sharegpt" else ALPACA[0][0]
    for k, (record, reason) in enumerate(cases):
        src = write_jsonl(tmp_path / f"bad{k}.jsonl", [good, good, record])
        line = cli_error("tokenize", str(src), "--tokenizer", tok, "--output", str(tmp_path / f"o{k}"), "--format", fmt)
        assert f"bad{k}.jsonl:3" in line and reason in line, (line, reason)
        assert not (tmp_path / f"o{k}").exists()
    rows = [good] + [r for r, _ in cases] + [good]
    out, stdout = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", fmt, name="skip")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_documents"] == 2 and manifest["n_rejected"] == len(cases)
    reasons = rejected(out)
    assert sorted(reasons) == list(range(2, len(cases) + 2))
    for line, (_, reason) in enumerate(cases, start=2):
        assert reason in reasons[line], (reasons[line], reason)
    assert sum(manifest["rejected_by_reason"].values()) == len(cases)
    assert f"{len(cases)} rejected (" in stdout and "see rejects.jsonl" in stdout
    if fmt == "alpaca":
        assert manifest["rejected_by_reason"]["the Alpaca record has no 'output' field"] == 1


@pytest.mark.parametrize(("flags", "message"), [
    (["--format", "alpaca", "--messages-field", "conversations"], "--messages-field does not apply to --format alpaca"),
    (["--format", "text", "--role-map", "bot=assistant"], "--role-map does not apply to --format text"),
    (["--format", "alpaca", "--role-map", "bot=assistant"], "--role-map does not apply to --format alpaca"),
    (["--format", "prompt-completion", "--role-map", "bot=assistant"], "--role-map does not apply"),
    (["--format", "sharegpt", "--role-map", "bot"], "--role-map 'bot' is malformed"),
    (["--format", "sharegpt", "--role-map", "bot=robot"], "'robot' is not one of system, user, assistant, tool"),
    (["--format", "sharegpt", "--role-map", "bot=user,bot=assistant"], "'bot' is mapped twice"),
    (["--format", "sharegpt", "--role-map", "bot=user,"], "is malformed"),
    (["--format", "chat", "--instruction-field", "q"], "--instruction-field does not apply to --format chat"),
    (["--format", "auto", "--messages-field", "conv"], "--messages-field does not apply to --format auto"),
])
def test_contradictory_flags_are_usage_errors(tmp_path: Path, tokenizers: dict[str, Path], flags: list[str], message: str) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [SHAREGPT[0][0]])
    line = cli_error("tokenize", str(src), "--tokenizer", str(tokenizers["qwen2_5"]), "--output", str(tmp_path / "o"), *flags,
                     code=2)
    assert message in line, line
    assert not (tmp_path / "o").exists()
    with pytest.raises(UsageError):
        packtool.TokenizeConfig(inputs=(str(src),), tokenizer="t", output="o",
                                **_config_kwargs(flags)).validate()


def _config_kwargs(flags: list[str]) -> dict[str, str]:
    return {flags[i][2:].replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}


def test_run_config_takes_the_shape_keys(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [{"conv": [{"from": "person", "value": "USR Hi"}, {"from": "gpt", "value": "Hello."}], "sys": "Be kind."}] * 3
    write_jsonl(tmp_path / "data.jsonl", rows)
    (tmp_path / "run.yaml").write_text(
        f"tokenize: {{inputs: [data.jsonl], tokenizer: {tokenizers['qwen2_5']}, output: tokens, format: sharegpt,\n"
        "           messages_field: conv, role_map: 'person=user', system_field: sys, workers: 1}\n"
        "pack: {size: 256, output: packs}\n")
    code, stdout, err = cli("run", str(tmp_path / "run.yaml"), "-q")
    assert code == 0, err
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "USR Hi"},
                {"role": "assistant", "content": "Hello."}]
    assert check_store(tmp_path / "tokens", tokenizers["qwen2_5"], "qwen2_5", [(messages, None)] * 3) == 3
    (tmp_path / "bad.yaml").write_text(
        f"tokenize: {{inputs: [data.jsonl], tokenizer: {tokenizers['qwen2_5']}, output: t2, format: alpaca,\n"
        "           messages_field: conv}\n")
    assert "--messages-field does not apply to --format alpaca" in cli_error("run", str(tmp_path / "bad.yaml"), "-q", code=2)


def test_shape_functions_directly() -> None:
    """The pure record -> messages functions (the Python API of core/encoding/shapes.py)."""
    conv = sharegpt_conversation(SHAREGPT[2][0], ShapeFields(messages="conversations"))
    assert conv.messages == SHAREGPT[2][1] and conv.tools == TOOLS and conv.targets_from == 0
    two = json.dumps([CALL, {**CALL, "id": "call0"}])
    conv = sharegpt_conversation({"conversations": [{"from": "function_call", "value": two}]}, ShapeFields(messages="conversations"))
    assert conv.messages[0]["tool_calls"][1] == {"type": "function", "function": CALL, "id": "call0"}
    for record, messages in ALPACA:
        assert alpaca_conversation(record, ShapeFields()).messages == messages
    with pytest.raises(ShapeError, match="no 'output'"):
        alpaca_conversation({"instruction": "x"}, ShapeFields())
    assert parse_role_map("a=user, b = assistant") == (("a", "user"), ("b", "assistant"))
    with pytest.raises(ValueError, match="not FROM=TO"):
        parse_role_map("a=user,,b=tool")
    assert {k for k, v in DEFAULT_ROLE_MAP.items() if v == "assistant"} == {"gpt", "assistant", "model", "chatgpt", "bing", "bard"}
    assert {k for k, v in DEFAULT_ROLE_MAP.items() if v == "tool"} == {"observation", "tool", "function"}
    assert detect_shape({"instruction": "a", "input": "", "output": "b"}) == "alpaca"
    assert detect_shape({"conversations": [{"from": "human", "value": "x"}]}) == "sharegpt"
    assert detect_shape({"messages": [{"role": "user", "content": "x"}]}) == "chat"
    assert detect_shape({"prompt": [], "completion": []}) == "conversational-prompt-completion"
    assert detect_shape({"prompt": "a", "completion": "b"}) == "prompt-completion"
    assert detect_shape({"question": "a"}) is None
    assert detect_shape({"conversations": [{"role": "user", "content": "x"}]}) == "chat:conversations"
    assert detect_shape({"messages": [{"from": "human", "value": "x"}]}) == "sharegpt:messages"
    assert detect_shape({"conversation": [{"role": "user", "content": "x"}]}) == "chat:conversation"
    assert detect_shape({"conversation": [{"from": "human", "value": "x"}]}) == "sharegpt:conversation"


def test_sample_sharegpt_and_alpaca_equal_the_same_chats(tmp_path: Path) -> None:
    """data/sample/{sharegpt,alpaca}.jsonl are the first chat.jsonl rows in those shapes: same bytes as --format chat."""
    sample = Path(__file__).resolve().parent.parent / "data" / "sample"
    n = len((sample / "sharegpt.jsonl").read_text("utf-8").splitlines())
    chats = [json.loads(line) for line in (sample / "chat.jsonl").read_text("utf-8").splitlines()[:n]]
    chat, _ = tokenize_rows(tmp_path, sample / "tokenizer", chats, "--format", "chat", name="chat")
    for shape in ("sharegpt", "alpaca"):
        out = tmp_path / shape
        code, stdout, err = cli("tokenize", str(sample / f"{shape}.jsonl"), "--tokenizer", str(sample / "tokenizer"),
                                "--output", str(out), "--format", "auto", "--workers", "1", "-q")
        assert code == 0 and f"detected format {shape}," in stdout, err
        store, reference_store = open_token_store(out), open_token_store(chat)
        assert store.loss is not None and reference_store.loss is not None
        k = reference_store.n_tokens
        assert store.n_documents >= n and np.array_equal(store.tokens[:k], reference_store.tokens)
        assert np.array_equal(store.loss[:k], reference_store.loss), shape


def test_python_api_and_a_tokenizer_without_template(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    from packtool.choices import InputFormat, OnError

    rows = [SHAREGPT[0][0], {"conversations": [{"from": "narrator", "value": "USR x"}, {"from": "gpt", "value": "y"}]}]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    config = packtool.TokenizeConfig(inputs=(str(src),), tokenizer=str(tokenizers["qwen2_5"]), output=str(tmp_path / "api"),
                                     format=InputFormat.SHAREGPT, role_map="narrator=user", on_error=OnError.SKIP, workers=1)
    result = packtool.tokenize_corpus(config)
    assert result.manifest["n_documents"] == 2 and result.manifest["n_rejected"] == 0
    assert check_store(result.path, tokenizers["qwen2_5"], "qwen2_5",
                       [(SHAREGPT[0][1], None), ([{"role": "user", "content": "USR x"}, {"role": "assistant", "content": "y"}], None)]) == 2
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tokenizers["qwen2_5"] / "tokenizer.json").read_bytes())
    line = cli_error("tokenize", str(src), "--tokenizer", str(bare), "--output", str(tmp_path / "o"),
                     "--format", "sharegpt")
    assert "sharegpt records are rendered by a chat template" in line and "--chat-template" in line


@pytest.mark.parametrize("family", ["qwen2_5", "llama3_2"])
def test_chat_records_pass_their_tools_as_transformers(tmp_path: Path, tokenizers: dict[str, Path], family: str) -> None:
    rows = [{"messages": SHAREGPT[2][1], "tools": TOOLS}, {"messages": SHAREGPT[0][1], "tools": []}, {"messages": SHAREGPT[0][1]}]
    out, _ = tokenize_rows(tmp_path, tokenizers[family], rows, "--format", "chat")
    assert check_store(out, tokenizers[family], family, [(SHAREGPT[2][1], TOOLS), (SHAREGPT[0][1], []), (SHAREGPT[0][1], None)]) == 3
    store = open_token_store(out)
    assert store.document(0).size > store.document(1).size  # the tool schema is in the rendering


def test_sharded_run_merges_rejects_by_reason(tmp_path: Path, tokenizers: dict[str, Path]) -> None:
    rows = [SHAREGPT[0][0], BAD_SHAREGPT[0][0], SHAREGPT[1][0], BAD_SHAREGPT[6][0], SHAREGPT[3][0], BAD_SHAREGPT[6][0]] * 3
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    shards = []
    for i in range(2):
        shards.append(str(tmp_path / f"s{i}"))
        code, _, err = cli("tokenize", str(src), "--tokenizer", str(tokenizers["qwen2_5"]), "--output", shards[-1], "-q",
                           "--format", "auto", "--on-error", "skip", "--chunk-bytes", "600", "--num-shards", "2",
                           "--shard-index", str(i), "--workers", "1")
        assert code == 0, err
    code, _, err = cli("merge", *shards, "--output", str(tmp_path / "merged"), "-q")
    assert code == 0, err
    single, _ = tokenize_rows(tmp_path, tokenizers["qwen2_5"], rows, "--format", "auto", "--chunk-bytes", "600", name="single")
    merged = json.loads((tmp_path / "merged" / "manifest.json").read_text())
    whole = json.loads((single / "manifest.json").read_text())
    assert merged["rejected_by_reason"] == whole["rejected_by_reason"] == {
        "empty conversation": 6, "turn N has unknown role 'robot' with no mapping": 3}
    assert merged["input_shape"] == whole["input_shape"] == {"name": "sharegpt", "detected": True}
    assert (tmp_path / "merged" / "tokens.bin").read_bytes() == (single / "tokens.bin").read_bytes()


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("turn 0 has no 'value' (from 'human')", "turn N has no 'value'"),
        ("turn 0 (human) 'value' is not a string (got int)", "turn N 'value' is not a string"),
        ("turn 12 has unknown role 'bing2' with no mapping (pass --role-map bing2=assistant)",
         "turn N has unknown role 'bing2' with no mapping"),
        ("chat template cannot render this conversation (TemplateError: roles must alternate (u/a))",
         "chat template cannot render this conversation"),
        ("invalid JSON: Expecting value at 3", "invalid JSON"),
        ("invalid UTF-8 (byte 0xff at 12)", "invalid UTF-8"),  # was counted as 'invalid UTF-N'
        ("record over 16 MiB, UTF-16 text, role bing2", "record over N MiB, UTF-16 text, role bing2"),
    ],
)
def test_rejects_are_counted_by_the_kind_of_reason(reason: str, kind: str) -> None:
    from packtool.stages.tokenize.chunks import reason_kind

    assert reason_kind(reason) == kind
