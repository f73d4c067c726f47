"""Chat format: transformers-style rendering, and loss exactly on assistant turns + end-of-turn."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import zipf_texts
from tokenizers import Tokenizer

import packtool
from packtool.choices import InputFormat
from packtool.core.encoding.chat import ChatRecordError, load_chat_template, render_with_spans
from packtool.formats.token_store import open_token_store

LLAMA2_LIKE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ '<<SYS>>' + message['content'] + '<</SYS>>' }}"
    "{% else %}{{ raise_exception('unsupported role ' + message['role']) }}{% endif %}{% endfor %}"
)


def conversation(texts: list[str], turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(turns):
        messages.append({"role": "user", "content": texts[2 * i]})
        messages.append({"role": "assistant", "content": texts[2 * i + 1]})
    return messages


def tokenize_chat(tmp_path: Path, tokenizer: Path, rows: list[object], **kw: object) -> packtool.stages.tokenize.TokenizeResult:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = packtool.TokenizeConfig(inputs=(str(path),), tokenizer=str(tokenizer), output=str(tmp_path / "s"),
                                  format=InputFormat.CHAT, workers=1, **kw)  # type: ignore[arg-type]
    return packtool.tokenize_corpus(cfg)


def target_runs(ids: np.ndarray, loss: np.ndarray) -> list[list[int]]:
    edges = np.flatnonzero(np.diff(np.r_[0, loss.astype(int), 0]))
    return [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2], strict=True)]


def test_chatml_targets_decode_to_assistant_turns_plus_end_of_turn(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    texts = zipf_texts(200, seed=21)
    rows = [{"messages": conversation(texts[10 * k :], 1 + k % 4)} for k in range(15)]
    rows[3]["messages"][2]["content"] = ""  # empty assistant turn: only its end-of-turn is a target
    rows[4]["messages"][2]["content"] = "assistant"  # content that also appears in the header
    result = tokenize_chat(tmp_path, bpe_tokenizer_dir, rows)
    store = open_token_store(tmp_path / "s")
    assert store.loss is not None and result.manifest["eos"]["enabled"] is False
    template = chat(json.loads((bpe_tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"])
    for i, row in enumerate(rows):
        ids = store.document(i)
        rendered = template.render(row["messages"])
        assert ids.tolist() == tok.encode(rendered, add_special_tokens=False).ids  # what apply_chat_template(tokenize=True) gives
        runs = target_runs(ids, store.loss[store.starts[i] : store.boundaries[i]])
        want = [m["content"] + "<|im_end|>" for m in row["messages"] if m["role"] == "assistant"]
        assert [tok.decode(r, skip_special_tokens=False) for r in runs] == want


def test_custom_template_file_with_bos_trim_and_eos(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    template_file = tmp_path / "llama.jinja"
    template_file.write_text(LLAMA2_LIKE)
    texts = zipf_texts(40, seed=22)
    rows = [{"conv": {"msgs": conversation(texts[4 * k :], 2)}} for k in range(6)]
    rows[0]["conv"]["msgs"][2]["content"] = "  padded answer  "  # the template trims it
    tokenize_chat(tmp_path, bpe_tokenizer_dir, rows, chat_template=str(template_file), messages_field="conv.msgs")
    store = open_token_store(tmp_path / "s")
    for i, row in enumerate(rows):
        ids = store.document(i)
        assert ids[0] == 4  # bos_token rendered by the template
        runs = target_runs(ids, store.loss[store.starts[i] : store.boundaries[i]])
        want = [m["content"].strip() + " <|endoftext|>" for m in row["conv"]["msgs"] if m["role"] == "assistant"]
        # byte-level BPE glues the template's space to the first content word: that token straddles the
        # span start and counts as a target
        assert [tok.decode(r, skip_special_tokens=False).lstrip() for r in runs] == want


def chat(source: str, bos: str | None = None, eos: str | None = None):  # type: ignore[no-untyped-def]
    return load_chat_template(source, bos, eos, ("<|im_start|>", "<|im_end|>", "<eot>", "</turn>", "<a>", "<u>"))


def test_render_spans_are_exact_character_ranges() -> None:
    template = chat("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</turn>\n{% endfor %}"
                    "{% if add_generation_prompt %}<assistant>{% endif %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"},
                {"role": "assistant", "content": "bye"}]
    text, spans = render_with_spans(template, messages)
    assert [text[a:b] for a, b in spans] == ["yo</turn>", "bye</turn>"]
    text, spans = render_with_spans(template, messages, last_only=True)
    assert [text[a:b] for a, b in spans] == ["bye</turn>"]


def test_per_turn_targets_choose_the_spans_and_last_keeps_the_last_turn_if_a_target() -> None:
    """`Conversation.targets`: one flag per message; `last_only` keeps the last assistant turn only when it is one."""
    template = chat("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</turn>\n{% endfor %}"
                    "{% if add_generation_prompt %}<assistant>{% endif %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"},
                {"role": "assistant", "content": "bye"}]
    for targets, last, want in [
        ((False, True, False, True), False, ["yo</turn>", "bye</turn>"]),
        ((False, False, False, True), False, ["bye</turn>"]),
        ((False, True, False, False), False, ["yo</turn>"]),
        ((False, True, False, False), True, []),  # the last turn is context: no target at all
        ((False, False, False, True), True, ["bye</turn>"]),
        ((False, True, False, True), True, ["bye</turn>"]),
        ((False, False, False, False), False, []),
    ]:
        text, spans = render_with_spans(template, messages, last, targets=targets)
        assert [text[a:b] for a, b in spans] == want, (targets, last)
    with pytest.raises(ValueError, match="only assistant messages"):
        render_with_spans(template, messages, targets=(True, True, False, True))
    with pytest.raises(ValueError, match="4 target flags for 2 messages"):
        render_with_spans(template, messages[:2], targets=(False, True, False, True))
    skips = chat("{% for m in messages %}<{{ m['role'] }}>{% if m['role'] == 'assistant' and m['content'] != 'yo' %}"
                 "{% generation %}{{ m['content'] }}</turn>{% endgeneration %}{% else %}{{ m['content'] }}</turn>"
                 "{% endif %}\n{% endfor %}")  # its {% generation %} blocks leave "yo" out
    with pytest.raises(ChatRecordError, match="cannot tell the assistant turns that are context"):
        render_with_spans(skips, messages, targets=(False, False, False, True))


def test_template_that_rewrites_history_is_located_exactly() -> None:
    """Reasoning only in the last turn (Qwen3-style), and a header appended after every conversation."""
    template = chat(
        "{% for m in messages %}<{{ m['role'] }}>\n{% if m['role'] == 'assistant' and loop.last %}<think>\n"
        "{{ m.get('reasoning_content', '') }}\n</think>\n{% endif %}{{ m['content'] | trim }}<eot>\n{% endfor %}<assistant>\n"
    )
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": " a1 ", "reasoning_content": "r1"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2", "reasoning_content": "r2"}]
    text, spans = render_with_spans(template, messages)
    assert text.endswith("<eot>\n<assistant>")  # appended even without add_generation_prompt
    assert [text[a:b] for a, b in spans] == ["a1<eot>", "<think>\nr2\n</think>\na2<eot>"]


def test_generation_blocks_give_the_targets() -> None:
    template = chat("{% for m in messages %}<{{ m['role'] }}>{% if m['role'] == 'assistant' %}{% generation %}"
                    "{{ m['content'] }}<eot>{% endgeneration %}{% else %}{{ m['content'] }}<eot>{% endif %}\n{% endfor %}")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"},
                {"role": "assistant", "content": "bye"}]
    text, spans = render_with_spans(template, messages)
    assert [text[a:b] for a, b in spans] == ["yo<eot>", "bye<eot>"]


def test_template_failure_is_a_record_error() -> None:
    template = chat("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}")
    with pytest.raises(ChatRecordError, match="cannot render"):
        render_with_spans(template, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])


@pytest.mark.parametrize(("messages", "reason"), [
    ([{"role": "wizard", "content": "x"}], "unknown role 'wizard'"),
    ([{"role": "user", "content": 3}], "content is not a string"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "'text' is not a string"),
    ([{"role": "user", "content": [{"type": "image"}]}], "miscounted images"),
    ([], "non-empty list"),
    ("hello", "non-empty list"),
])
def test_bad_conversations_are_rejected_with_reason(tmp_path: Path, bpe_tokenizer_dir: Path, messages: object, reason: str) -> None:
    rows = [{"messages": conversation(["q", "a"], 1)}, {"messages": messages}]
    result = tokenize_chat(tmp_path, bpe_tokenizer_dir, rows, on_error="skip")
    assert result.manifest["n_documents"] == 1 and result.manifest["sources"][0]["rejected"] == 1
    reject = json.loads((tmp_path / "s" / "rejects.jsonl").read_text())
    assert reject["line"] == 2 and reason in reject["reason"]


def test_chat_without_template_is_a_config_error(tmp_path: Path, big_vocab_tokenizer_dir: Path) -> None:
    model = tmp_path / "no_template"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((big_vocab_tokenizer_dir / "tokenizer.json").read_bytes())
    with pytest.raises(packtool.errors.ConfigError, match="--chat-template"):
        tokenize_chat(tmp_path, model, [{"messages": conversation(["q", "a"], 1)}])


def test_tools_and_strftime_now_render_as_in_transformers() -> None:
    """Real templates (Llama 3.x, Qwen2.5) test `tools is not none` and date the system prompt."""
    from datetime import datetime

    template = chat(
        "{% if tools is not none %}TOOLS{{ tools | tojson }}\n{% endif %}"
        "{% if documents is not none %}DOCS\n{% endif %}"
        "Today: {{ strftime_now('%d %b %Y') }}\n"
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eot>\n{% endfor %}"
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text, spans = render_with_spans(template, messages)
    assert "TOOLS" not in text and "DOCS" not in text
    assert text.startswith(f"Today: {datetime.now().strftime('%d %b %Y')}\n")
    assert [text[a:b] for a, b in spans] == ["yo<eot>"]


def test_cli_assistant_turns_last_and_bad_template(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    from support import cli

    data = tmp_path / "c.jsonl"
    data.write_text(json.dumps({"messages": conversation(["q1", "a1", "q2", "a2"], 2)}) + "\n")
    base = ["tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--format", "chat", "-q"]
    code, _, err = cli(*base, "--output", str(tmp_path / "all"))
    assert code == 0, err
    code, _, err = cli(*base, "--output", str(tmp_path / "last"), "--assistant-turns", "last")
    assert code == 0, err
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    decoded = {}
    for name in ("all", "last"):
        store = open_token_store(tmp_path / name)
        assert store.loss is not None
        decoded[name] = [tok.decode(r, skip_special_tokens=False) for r in target_runs(store.document(0), store.loss)]
    assert decoded == {"all": ["a1<|im_end|>", "a2<|im_end|>"], "last": ["a2<|im_end|>"]}
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }")
    code, _, err = cli(*base, "--output", str(tmp_path / "bad"), "--chat-template", str(bad))
    assert code == 1 and err.startswith("error: ") and "chat template" in err and err.count("\n") == 1
    code, _, err = cli(*base, "--output", str(tmp_path / "x"), "--assistant-turns", "first")
    assert code == 2 and "first" in err
