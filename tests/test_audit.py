"""`packtool audit MODEL`: verdicts on real transformers families, cross-checked by an independent run.

The independent run shares nothing with packtool's audit: the model is built here by hand (its own
tiny sizes), the packed batch comes from transformers' `DataCollatorWithFlattening`, and only the
forward logits are compared. The default suite audits a dense model and one hybrid (seconds each,
eager + sdpa); the family sweep is `slow`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from support import cli, cli_error

transformers = pytest.importorskip("transformers")

from packtool.audit import AuditConfig, audit_model  # noqa: E402
from packtool.audit.source import locate_config  # noqa: E402
from packtool.audit.tiny import keep_layers, layer_kinds, tiny_config_dict  # noqa: E402

FAST = ("--attn-implementation", "eager", "--attn-implementation", "sdpa")
LENGTHS = (10, 6, 13)


def save_config(directory: Path, model_type: str, **overrides: object) -> Path:
    transformers.AutoConfig.for_model(model_type, **overrides).save_pretrained(directory)
    return directory


def independent_leak(config: object, impl: str = "sdpa", use_cache: bool = False) -> float:
    """max |Δ| of logits (relative), documents packed by DataCollatorWithFlattening vs each alone (float64)."""
    torch.manual_seed(1)
    model = transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation=impl, experts_implementation="eager", dtype=torch.float64
    ).eval()  # (eager experts: torch's grouped_mm has no float64)
    gen = torch.Generator().manual_seed(2)
    docs = [torch.randint(0, config.vocab_size, (n,), generator=gen) for n in LENGTHS]
    batch = transformers.DataCollatorWithFlattening()([{"input_ids": d.tolist()} for d in docs])
    with torch.no_grad():
        ids, pos = batch["input_ids"], batch["position_ids"]
        packed = model(input_ids=ids, position_ids=pos, use_cache=use_cache).logits[0]
        alone = torch.cat([model(input_ids=d[None]).logits[0] for d in docs])
    return float((packed - alone).abs().max() / alone.abs().max())


def by_key(results: list[dict]) -> dict[tuple[str, str], dict]:
    return {(r["style"], r["attn_implementation"]): r for r in results}


def test_dense_llama_is_exact_and_the_json_names_the_setup(tmp_path) -> None:
    path = save_config(tmp_path / "llama", "llama")
    code, out, err = cli("audit", str(path), "--json", *FAST)
    assert code == 0, err
    report = json.loads(out)
    results = by_key(report["results"])
    assert {s for s, _ in results} == {
        "flat_position_ids",
        "flat_cu_seq_lens",
        "flat_seq_idx",
        "flat_cu_seq_lens_seq_idx",
        "rows_position_ids",
    }
    for r in report["results"]:
        assert set(r) >= {"style", "attn_implementation", "max_abs_diff_logits", "max_abs_diff_grads", "verdict"}
        assert r["verdict"] == "exact", r
        assert r["dtype"] == "float64" and r["max_abs_diff_logits"] < 1e-6 and r["max_abs_diff_grads"] < 1e-5
    assert report["recommended"] == {"style": "flat_position_ids", "attn_implementation": "sdpa"}
    assert report["keys"] == ["input_ids", "position_ids"] and report["needs_seq_idx"] is False
    # cross-check: an independent tiny Llama packed by transformers' own collator is exact too
    tiny = transformers.LlamaConfig(
        vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    assert independent_leak(tiny) < 1e-10
    # transformers detects packed position_ids only without a KV cache: the audit says so, and so does this run
    check = report["use_cache_check"]
    assert check["verdict"] == "leaks" and check["max_abs_diff_logits"] > 1e-3
    assert "use_cache = False" in report["advice"]
    assert independent_leak(tiny, use_cache=True) > 1e-3


def test_qwen35_hybrid_leaks_and_is_never_reported_exact(tmp_path) -> None:
    path = save_config(tmp_path / "qwen35", "qwen3_5_text")
    code, out, err = cli("audit", str(path / "config.json"), "--json", *FAST)
    assert code == 1, err  # no exact setup on the kernels present
    report = json.loads(out)
    results = by_key(report["results"])
    assert report["recommended"] is None and not any(r["verdict"] == "exact" for r in report["results"])
    for impl in ("eager", "sdpa"):
        leak = results[("flat_position_ids", impl)]
        assert leak["verdict"] == "leaks" and leak["max_abs_diff_logits"] > 1e-3
        assert results[("rows_position_ids", impl)]["verdict"] == "leaks"
        # cu_seq_lens / seq_idx reach the linear-attention kernels, whose CPU fallbacks refuse them
        for style in ("flat_cu_seq_lens", "flat_seq_idx"):
            assert results[(style, impl)]["verdict"] == "unsupported"
            assert "can't keep packed sequences apart" in results[(style, impl)]["reason"]
    assert "padded=True" in report["advice"] and "PaddedCollator" in report["advice"]
    # the fallback it names is measured: PaddedCollator batches (right padding) are exact
    assert report["padded_check"]["verdict"] == "exact" and report["padded_check"]["max_abs_diff_grads"] < 1e-6
    assert "causal_conv1d" in report["advice"] or "causal-conv1d" in report["advice"]
    # cross-check with an independently built tiny Qwen3.5 (one linear-attention and one attention layer)
    tiny = transformers.AutoConfig.for_model(
        "qwen3_5_text", vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=12, linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=12, linear_value_head_dim=12, layer_types=["linear_attention", "full_attention"],
    )  # fmt: skip
    assert independent_leak(tiny) > 1e-3


def test_table_output_says_what_to_do(tmp_path) -> None:
    path = save_config(tmp_path / "qwen3", "qwen3")
    code, out, err = cli("audit", str(path), "--attn-implementation", "sdpa")
    assert code == 0, err
    assert "flat_position_ids" in out and "rows_position_ids" in out and "exact" in out
    assert "recommended: flat_position_ids with attn_implementation='sdpa'; batch keys: input_ids, position_ids" in out


def test_tiny_config_keeps_one_layer_of_each_kind() -> None:
    d = transformers.AutoConfig.for_model("qwen3_5_text").to_dict()
    tiny, kept = tiny_config_dict(d)
    assert sorted(set(tiny["layer_types"])) == ["full_attention", "linear_attention"]
    assert tiny["num_hidden_layers"] == len(kept) == len(tiny["layer_types"])
    assert tiny["hidden_size"] == 64 and tiny["vocab_size"] == 128
    # index lists (Bamba's attention layers) are remapped to the kept layers
    bamba = transformers.AutoConfig.for_model("bamba", attn_layer_indices=[3, 7]).to_dict()
    small, kept = tiny_config_dict(bamba)
    assert kept == [0, 3] and small["attn_layer_indices"] == [1]
    assert small["mamba_chunk_size"] == 8 and small["num_hidden_layers"] == 2
    # sparse steps: a dense layer and an expert layer both survive
    kinds = layer_kinds({"decoder_sparse_step": 2, "mlp_only_layers": []}, 6)
    assert keep_layers(kinds) == [0, 1]
    # grouped-query attention stays grouped, a full-heads model stays full
    assert tiny_config_dict(transformers.MistralConfig().to_dict())[0]["num_key_value_heads"] == 2
    assert tiny_config_dict(transformers.LlamaConfig().to_dict())[0]["num_key_value_heads"] == 4


def test_audit_model_api_forward_only_flex_and_unavailable_flash(tmp_path) -> None:
    path = save_config(tmp_path / "llama", "llama")
    report = audit_model(AuditConfig(str(path), implementations=("sdpa", "flash_attention_2")))
    flash = [r for r in report.results if r.attn_implementation == "flash_attention_2"]
    assert flash and all(r.verdict == "unsupported" and r.reason for r in flash)
    assert report.exact and report.recommended == {"style": "flat_position_ids", "attn_implementation": "sdpa"}


def test_errors_are_one_line(tmp_path) -> None:
    assert "does not exist" in cli_error("audit", str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in cli_error("audit", str(tmp_path / "empty"))
    (tmp_path / "bad.json").write_text("{not json")
    assert "cannot read the model config" in cli_error("audit", str(tmp_path / "bad.json"))
    (tmp_path / "nomt.json").write_text('{"hidden_size": 8}')
    assert "no model_type" in cli_error("audit", str(tmp_path / "nomt.json"))
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(
        json.dumps({"model_type": "my_own_arch", "auto_map": {"AutoConfig": "conf.MyConfig"}})
    )
    assert "--trust-remote-code" in cli_error("audit", str(remote))
    assert "not in the local Hugging Face cache" in cli_error("audit", "nobody/no-such-model")
    path = save_config(tmp_path / "llama", "llama")
    assert "unknown attention implementation 'fancy'" in cli_error("audit", str(path), "--attn-implementation", "fancy")


def test_missing_transformers_names_the_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    line = cli_error("audit", str(tmp_path))
    assert "pip install 'packtool[audit]'" in line


def test_hub_cache_names_resolve_offline(tmp_path, monkeypatch) -> None:
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "abc123"
    save_config(snap, "llama")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert locate_config("org/tiny") == snap / "config.json"
    code, out, err = cli("audit", "org/tiny", "--json", "--attn-implementation", "sdpa")
    assert code == 0, err
    assert json.loads(out)["model"] == "org/tiny"


# ---- the family sweep: every default config of a released family, verdict vs an independent run ----

DENSE = ["llama", "qwen3", "gemma3_text", "mistral", "olmo3", "mixtral", "qwen3_moe"]
HYBRID = {
    "qwen3_5_text": {},
    "qwen3_next": {},
    "olmo_hybrid": {},
    "bamba": {"attn_layer_indices": [9, 18, 27]},
    "jamba": {},
    "falcon_h1": {},
    "lfm2": {"num_hidden_layers": 16, "full_attn_idxs": [2, 5, 8, 10, 12, 14]},
    "nemotron_h": {},
    "granitemoehybrid": {"num_hidden_layers": 8, "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("model_type", DENSE)
def test_dense_families_are_exact(tmp_path, model_type) -> None:
    report = audit_model(AuditConfig(str(save_config(tmp_path, model_type)), implementations=("eager", "sdpa")))
    assert report.recommended is not None
    for r in report.results:
        assert r.verdict == "exact", r
    tiny = type(transformers.AutoConfig.for_model(model_type)).from_dict(
        tiny_config_dict(transformers.AutoConfig.for_model(model_type).to_dict())[0]
    )
    assert independent_leak(tiny) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("model_type", sorted(HYBRID))
def test_hybrid_families_are_never_reported_exact_where_they_leak(tmp_path, model_type) -> None:
    path = save_config(tmp_path, model_type, **HYBRID[model_type])
    report = audit_model(AuditConfig(str(path), implementations=("eager", "sdpa")))
    assert report.recommended is None
    by = {(r.style, r.attn_implementation): r for r in report.results}
    assert by[("flat_position_ids", "sdpa")].verdict == "leaks"
    assert report.padded_check is not None and report.padded_check["verdict"] == "exact"  # the fallback it names
    text = transformers.AutoConfig.for_model(model_type, **HYBRID[model_type])
    tiny = type(text).from_dict(tiny_config_dict(text.to_dict())[0])
    assert independent_leak(tiny) > 1e-6  # the same architecture, packed by transformers' collator, leaks too
