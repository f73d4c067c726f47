"""`packtool audit` on a config whose `auto_map` names the model's own code while its `model_type` is one
transformers knows: the report (text and JSON) says which class was audited and that the model's own code
was not, for every model class `auto_map` may name (`AutoModel` alone too), with or without
--trust-remote-code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli

from packtool.audit.source import ModelSource, code_note

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
NOTE = ("the model's own code (modeling_x.XModel, named by auto_map) was NOT used: transformers' built-in "
        "LlamaForCausalLM was audited instead; pass --trust-remote-code to audit the model's own code (read from "
        "disk only)")


def _config(directory: Path, auto_map: dict[str, str]) -> Path:
    d = transformers.AutoConfig.for_model("llama").to_dict()
    d["auto_map"] = auto_map
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(d))
    return directory


def test_every_model_class_auto_map_names_is_own_code(tmp_path: Path) -> None:
    """`auto_map` with `AutoModel` only (no AutoModelForCausalLM) gave no note: the built-in class, without a word."""
    raw = {"auto_map": {"AutoModel": "modeling_x.XModel", "AutoTokenizer": ["tok.T", None]}}
    assert code_note(ModelSource(tmp_path / "config.json", raw, None, False), transformers.LlamaForCausalLM) == NOTE
    # with --trust-remote-code transformers still builds its own class: the note says why
    assert code_note(ModelSource(tmp_path / "config.json", raw, None, True), transformers.LlamaForCausalLM) == (
        "the model's own code (modeling_x.XModel, named by auto_map) was NOT used: it names no AutoModelForCausalLM, "
        "so transformers' built-in LlamaForCausalLM was audited")
    tokenizer_only = {"auto_map": {"AutoTokenizer": ["tok.T", None]}}
    assert code_note(ModelSource(tmp_path / "config.json", tokenizer_only, None, False), transformers.LlamaForCausalLM) is None


@pytest.mark.slow
def test_the_json_report_names_the_class_audited_and_the_code_not_used(tmp_path: Path) -> None:
    path = _config(tmp_path / "m", {"AutoModel": "modeling_x.XModel"})
    code, out, err = cli("audit", str(path), "--json", "--attn-implementation", "sdpa")
    assert code == 0, err
    report = json.loads(out)
    assert report["architecture"] == "LlamaForCausalLM" and report["code"] == NOTE
