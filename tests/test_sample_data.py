"""The shipped sample corpus and tokenizer: they load offline, parse, and have a long-tailed shape.

The demo, the docs and the benchmarks rely on data/sample/ (built by scripts/make_sample_data.py
and committed). These tests pin what they rely on: uint16-sized vocabulary, ChatML specials,
valid records in each input format, and a skewed length distribution worth packing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jinja2
import numpy as np
import pytest
import tokenizers
from tokenizers import Tokenizer

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"
TOKENIZER_DIR = SAMPLE / "tokenizer"
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]


def _rows(name: str) -> list[dict]:
    lines = (SAMPLE / name).read_text("utf-8").splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))


@pytest.fixture(scope="module")
def config() -> dict:
    return json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text("utf-8"))


def test_tokenizer_loads_with_uint16_vocab_and_specials(tokenizer: Tokenizer, config: dict) -> None:
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    assert size == 8192
    assert max(tokenizer.get_vocab(with_added_tokens=True).values()) <= 65535
    assert [tokenizer.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    assert config["name_or_path"] == "packtool-sample-bpe-8k"
    assert (config["eos_token"], config["pad_token"], config["bos_token"]) == ("<|endoftext|>", "<|pad|>", None)


def test_tokenizer_round_trips_text_and_keeps_specials_whole(tokenizer: Tokenizer) -> None:
    text = "def packtool(x):\n    return json.dumps(x)  # héllo 東京 🙂"
    enc = tokenizer.encode(text)
    assert tokenizer.decode(enc.ids) == text
    chat = "<|im_start|>user\nhi<|im_end|>\n"
    ids = tokenizer.encode(chat).ids
    assert ids[0] == 2 and 3 in ids  # <|im_start|> and <|im_end|> are single tokens
    assert tokenizer.encode("no specials here").ids[-1] != 0  # post-processor appends no EOS


def test_chat_template_renders_chatml(config: dict) -> None:
    template = jinja2.Environment().from_string(config["chat_template"])
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    out = template.render(messages=messages, add_generation_prompt=False)
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
    assert template.render(messages=messages[:2], add_generation_prompt=True).endswith("<|im_start|>assistant\n")


def test_tokenizer_readme_states_origin_and_license() -> None:
    readme = (TOKENIZER_DIR / "README.md").read_text("utf-8")
    for needle in ("scripts/make_sample_data.py", "Apache-2.0", "PSF", "packtool-sample-bpe-8k"):
        assert needle in readme


def test_text_jsonl_parses() -> None:
    rows = _rows("text.jsonl")
    assert 1500 <= len(rows) <= 2500
    assert all(set(r) == {"text"} and isinstance(r["text"], str) and r["text"].strip() for r in rows)


def test_prompt_completion_jsonl_parses() -> None:
    rows = _rows("prompt_completion.jsonl")
    assert 400 <= len(rows) <= 600
    for r in rows:
        assert set(r) == {"prompt", "completion"}
        assert isinstance(r["prompt"], str) and r["prompt"] and isinstance(r["completion"], str) and r["completion"]


def test_chat_jsonl_is_valid_multi_turn_chatml() -> None:
    rows = _rows("chat.jsonl")
    assert 400 <= len(rows) <= 600
    n_turns = []
    for r in rows:
        msgs = r["messages"]
        roles = [m["role"] for m in msgs]
        if roles[0] == "system":
            roles = roles[1:]
        assert roles and roles[::2] == ["user"] * len(roles[::2]) and roles[1::2] == ["assistant"] * len(roles[1::2])
        assert roles[-1] == "assistant" and all(isinstance(m["content"], str) and m["content"] for m in msgs)
        n_turns.append(len(roles) // 2)
    assert max(n_turns) >= 3 and min(n_turns) == 1
    assert any(r["messages"][0]["role"] == "system" for r in rows)
    assert any(r["messages"][0]["role"] == "user" for r in rows)


def test_plain_text_docs_exist() -> None:
    docs = sorted((SAMPLE / "docs").glob("*.txt"))
    assert 3 <= len(docs) <= 10
    assert all(p.read_text("utf-8").strip() for p in docs)


def test_sample_is_small() -> None:
    total = sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file())
    assert total < 3 * 2**20


def test_text_lengths_are_long_tailed(tokenizer: Tokenizer) -> None:
    """Packing is only interesting on skewed lengths: many short docs, a tail past common pack sizes."""
    texts = [r["text"] for r in _rows("text.jsonl")]
    lengths = np.array([len(e.ids) for e in tokenizer.encode_batch(texts)])
    p50, p99 = np.percentile(lengths, [50, 99])
    assert p99 / p50 > 5
    assert lengths.mean() > 1.5 * p50  # right-skewed
    assert (lengths > 4096).sum() >= 3  # exercises --overlong at --size 4096
    assert lengths.min() < 16


def test_prompt_completion_and_chat_lengths_are_skewed(tokenizer: Tokenizer) -> None:
    for name, text_of in (
        ("prompt_completion.jsonl", lambda r: r["prompt"] + r["completion"]),
        ("chat.jsonl", lambda r: "".join(m["content"] for m in r["messages"])),
    ):
        lengths = np.array([len(e.ids) for e in tokenizer.encode_batch([text_of(r) for r in _rows(name)])])
        p50, p99 = np.percentile(lengths, [50, 99])
        assert p99 / p50 > 4, name


@pytest.mark.skipif(sys.version_info[:3] != (3, 11, 7) or tokenizers.__version__ != "0.23.3",
                    reason="the sample was generated from CPython 3.11.7 docstrings with tokenizers 0.23.3")
def test_script_rebuilds_the_committed_sample_byte_for_byte(tmp_path: Path) -> None:
    """Reproducibility: fixed seeds, sorted modules, no addresses in signatures, deterministic BPE (~1 s)."""
    script = SAMPLE.parent.parent / "scripts" / "make_sample_data.py"
    subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], check=True, capture_output=True)
    # vision/ (LLaMA-Factory's demo records, its README says how) and vision_model/ (scripts/make_vision_model.py,
    # pinned by tests/test_vision_train.py) are made elsewhere
    others = ("vision", "vision_model")
    committed = sorted(p.relative_to(SAMPLE) for p in SAMPLE.rglob("*") if p.is_file() and p.relative_to(SAMPLE).parts[0] not in others)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == committed
    for rel in committed:
        assert (tmp_path / rel).read_bytes() == (SAMPLE / rel).read_bytes(), rel


def test_preference_sample_tokenizes_packs_with_a_shared_prompt_and_verifies(tmp_path: Path) -> None:
    """data/sample/preference.jsonl (what `make demo` trains DPO on): TRL conversational pairs, found by --format
    auto, every pair packed whole with its prompt held once, verified against its token store."""
    from tests.support import cli

    rows = _rows("preference.jsonl")
    assert len(rows) == 64 and all(set(r) == {"prompt", "chosen", "rejected"} for r in rows)
    assert all(r["chosen"] != r["rejected"] and r["prompt"][-1]["role"] == "user" for r in rows)
    tok, packs = tmp_path / "tok", tmp_path / "packs"
    code, out, err = cli("tokenize", str(SAMPLE / "preference.jsonl"), "--format", "auto", "--tokenizer",
                         str(SAMPLE / "tokenizer"), "--output", str(tok), "--quiet")
    assert code == 0, err
    assert "conversational-preference" in out and "tokenized 64 preference pairs (128 documents" in out
    code, out, err = cli("pack", str(tok), "--size", "2048", "--share-prompt", "--output", str(packs), "--quiet")
    assert code == 0, err
    assert "64 of 64 pairs packed whole (shared-prompt)" in out
    code, out, err = cli("verify", str(packs), "--source", str(tok))
    assert code == 0 and "64 pairs (shared-prompt) each whole in one pack" in out, err
