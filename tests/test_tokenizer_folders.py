"""Tokenizer folders as transformers 5 saves them: the chat template in `chat_template.jinja` (named ones in
`additional_chat_templates/`), read where AutoTokenizer reads it, in a model folder and in a hub-cache snapshot;
and the name a tokenizer file gives its stores when its config names none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support import CHATML_TEMPLATE, cli, cli_error, write_jsonl
from tokenizers import Tokenizer

from packtool.formats.token_store import open_token_store

transformers = pytest.importorskip("transformers")

#: a template the folder's tokenizer_config.json may still hold (an older save): the jinja file wins over it
STALE = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
TOOL_USE = "{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] }}{% endfor %}"
ROWS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "the model of data"},
                  {"role": "assistant", "content": "packing tokens in a batch"}]},
    {"messages": [{"role": "user", "content": "héllo café 東京"}, {"role": "assistant", "content": "🙂 ok"},
                  {"role": "user", "content": "and the loss"}, {"role": "assistant", "content": "is masked"}]},
]  # fmt: skip


def save_model(directory: Path, bpe_tokenizer_dir: Path, template: str | dict[str, str]) -> Path:
    """A tokenizer folder written by transformers' own `save_pretrained`."""
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json")),
        bos_token="<s>", eos_token="<|endoftext|>", pad_token="<|pad|>",
    )  # fmt: skip
    hf.chat_template = template
    hf.save_pretrained(str(directory))
    return directory


def reference(directory: Path) -> list[list[int]]:
    """What AutoTokenizer, loading the folder, gives for each row: `apply_chat_template(tokenize=True)`."""
    hf = transformers.AutoTokenizer.from_pretrained(str(directory))
    out = []
    for row in ROWS:
        got = hf.apply_chat_template(row["messages"], tokenize=True)
        out.append(list(got["input_ids"] if hasattr(got, "keys") else got))
    return out


def tokenize_chat(tmp_path: Path, tokenizer: str, name: str) -> list[list[int]]:
    src = write_jsonl(tmp_path / "chat.jsonl", ROWS)
    out = tmp_path / name
    code, _, err = cli("tokenize", str(src), "--format", "chat", "--tokenizer", tokenizer, "--output", str(out), "-q")
    assert code == 0, err
    store = open_token_store(out)
    return [store.document(i).tolist() for i in range(len(ROWS))]


def test_a_transformers_5_folder_renders_its_jinja_template(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The old code read `chat_template` from tokenizer_config.json only: such a folder was refused for chat."""
    model = save_model(tmp_path / "mymodel", bpe_tokenizer_dir, CHATML_TEMPLATE)
    assert (model / "chat_template.jinja").is_file()
    assert "chat_template" not in json.loads((model / "tokenizer_config.json").read_text())
    want = reference(model)
    assert tokenize_chat(tmp_path, str(model), "s") == want
    # a stale template left in tokenizer_config.json: transformers reads the jinja file, and so do we
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": STALE}))
    assert reference(model) == want
    assert tokenize_chat(tmp_path, str(model), "stale") == want


def test_named_templates_use_the_default_one(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    model = save_model(tmp_path / "m", bpe_tokenizer_dir, {"default": CHATML_TEMPLATE, "tool_use": TOOL_USE})
    assert (model / "additional_chat_templates" / "tool_use.jinja").is_file()
    assert tokenize_chat(tmp_path, str(model), "s") == reference(model)
    # named templates without a default one: refused by name (transformers refuses it too), with the way out
    (model / "chat_template.jinja").unlink()
    line = cli_error("tokenize", str(write_jsonl(tmp_path / "c.jsonl", ROWS)), "--format", "chat",
                     "--tokenizer", str(model), "--output", str(tmp_path / "t"))  # fmt: skip
    assert "additional_chat_templates/ holds named templates (tool_use)" in line and "--chat-template" in line
    assert not (tmp_path / "t").exists()


def test_a_hub_cache_snapshot_saved_by_transformers_5(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    model = save_model(tmp_path / "saved", bpe_tokenizer_dir, CHATML_TEMPLATE)
    repo = tmp_path / "hub" / "models--acme--chat-tiny"
    commit = "a" * 40
    shutil.copytree(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert tokenize_chat(tmp_path, "acme/chat-tiny", "s") == reference(model)
    # a snapshot fetched without its template (the old hint listed tokenizer.json and tokenizer_config.json only)
    (repo / "snapshots" / commit / "chat_template.jinja").unlink()
    line = cli_error("tokenize", str(write_jsonl(tmp_path / "c.jsonl", ROWS)), "--format", "chat",
                     "--tokenizer", "acme/chat-tiny", "--output", str(tmp_path / "t"))  # fmt: skip
    assert 'hf download acme/chat-tiny --include "*.json" --include "*.jinja"' in line, line


def test_a_processor_template_is_refused_by_name(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """chat_template.json is AutoProcessor's, never AutoTokenizer's: not silently used in its place."""
    model = save_model(tmp_path / "m", bpe_tokenizer_dir, CHATML_TEMPLATE)
    (model / "chat_template.jinja").unlink()
    (model / "chat_template.json").write_text(json.dumps({"chat_template": CHATML_TEMPLATE}))
    line = cli_error("tokenize", str(write_jsonl(tmp_path / "c.jsonl", ROWS)), "--format", "chat",
                     "--tokenizer", str(model), "--output", str(tmp_path / "t"))  # fmt: skip
    assert "chat_template.json is a processor's template" in line and "--chat-template" in line


def test_a_tokenizer_file_names_its_store_after_itself(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`--tokenizer models/qwen-tiny.json` (no name_or_path): the store and its packs were named `models`."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(bpe_tokenizer_dir / "tokenizer.json", models / "qwen-tiny.json")
    src = write_jsonl(tmp_path / "a.jsonl", [{"text": "hello world"}])
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(models / "qwen-tiny.json"), "--output",
                       str(tmp_path / "s"), "-q")  # fmt: skip
    assert code == 0, err
    assert open_token_store(tmp_path / "s").manifest["tokenizer"]["name"] == "qwen-tiny"
    code, _, err = cli("pack", str(tmp_path / "s"), "--size", "64", "--output", str(tmp_path / "p"), "-q")
    assert code == 0, err
    assert [p.name for p in (tmp_path / "p" / "packed").iterdir()] == ["qwen-tiny"]
    # a file named tokenizer.json is its folder's: the folder is the model's, as `--tokenizer DIR` names it
    model = tmp_path / "llama-tiny"
    model.mkdir()
    shutil.copy(bpe_tokenizer_dir / "tokenizer.json", model / "tokenizer.json")
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(model / "tokenizer.json"), "--output",
                       str(tmp_path / "s2"), "-q")  # fmt: skip
    assert code == 0, err
    assert open_token_store(tmp_path / "s2").manifest["tokenizer"]["name"] == "llama-tiny"
