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

from packtool.audit import STYLES, AuditConfig, audit_model  # noqa: E402
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
    line = cli_error("audit", str(path), "--attn-implementation", "fancy", code=2)  # a value outside its domain
    assert "--attn-implementation 'fancy' is not an attention implementation packtool audits" in line


@pytest.mark.parametrize("seed", ["-1", str(2**70)])
def test_a_seed_outside_its_domain_is_a_usage_error(tmp_path: Path, seed: str) -> None:
    """`--seed -1` was a numpy ValueError traceback; `--seed 2**70` reported every run "unsupported" (an overflow)."""
    line = cli_error("audit", str(save_config(tmp_path / "llama", "llama")), "--seed", seed, *FAST, code=2)
    assert f"--seed must be an integer from 0 to 2**63-1, got {seed}" in line


def test_an_implementation_named_twice_runs_once(tmp_path: Path) -> None:
    report = audit_model(AuditConfig(str(save_config(tmp_path / "llama", "llama")), implementations=("sdpa", "sdpa")))
    assert len(report.results) == len({(r.style, r.attn_implementation) for r in report.results}) == len(STYLES)


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


# ---- hostile configs (issue 26): never the network, never a traceback, never a false verdict ----


def _config(directory: Path, model_type: str, **overrides: object) -> Path:
    """`model_type`'s default config.json with `overrides` written raw (values transformers would refuse too)."""
    d = transformers.AutoConfig.for_model(model_type).to_dict()
    d.update(overrides)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(d))
    return directory


REMOTE_CONFIG = '''from transformers import LlamaConfig


class XConfig(LlamaConfig):
    model_type = "x_custom"
'''
REMOTE_MODEL = '''from transformers import LlamaForCausalLM

from .configuration_x import XConfig


class XForCausalLM(LlamaForCausalLM):
    config_class = XConfig
'''


def _audit_against_a_counting_hub(tmp_path: Path, cache: Path, *args: str) -> tuple[int, str, str, list[str]]:
    """`python -m packtool audit ARGS` with HF_ENDPOINT on a loopback server that records every request."""
    import http.server
    import os
    import subprocess
    import threading

    hits: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}", HF_HUB_CACHE=str(cache),
               HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HOME=str(tmp_path / "hf_home"))  # fmt: skip
    try:
        run = subprocess.run([sys.executable, "-m", "packtool", "audit", *args], env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    finally:
        server.shutdown()
    return run.returncode, run.stdout, run.stderr, hits


def test_trust_remote_code_never_reaches_the_network(tmp_path: Path) -> None:
    """An `auto_map` naming another repo's code (`org/repo--module.Class`): the old audit asked the hub endpoint
    for it (3 requests to a local HF_ENDPOINT; 26 s of retries and a traceback against the real one)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "x_custom", "auto_map": {"AutoConfig": "someorg/somerepo--configuration_x.XConfig",
                                               "AutoModelForCausalLM": "someorg/somerepo--modeling_x.XForCausalLM"},
    }))  # fmt: skip
    code, out, err, hits = _audit_against_a_counting_hub(tmp_path, tmp_path / "empty", str(model), "--trust-remote-code")
    assert hits == [] and code == 1, (hits, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and out == ""
    assert "configuration_x.py of someorg/somerepo" in lines[0] and "not in the local Hugging Face cache" in lines[0]
    assert "never downloads" in lines[0]
    # the code in the local cache: audited from disk, still without one request
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someorg--somerepo"
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "configuration_x.py").write_text(REMOTE_CONFIG)
    (repo / "snapshots" / commit / "modeling_x.py").write_text(REMOTE_MODEL)
    code, out, err, hits = _audit_against_a_counting_hub(
        tmp_path, tmp_path / "hub", str(model), "--trust-remote-code", "--json", "--attn-implementation", "sdpa"
    )
    assert hits == [] and code == 0, (hits, err)
    report = json.loads(out)
    assert report["architecture"] == "XForCausalLM" and report["recommended"]["attn_implementation"] == "sdpa"
    assert report["code"].startswith("the model's own code was audited")


def test_the_offline_switch_is_restored(tmp_path: Path) -> None:
    import huggingface_hub.constants as hub_constants

    from packtool.audit.source import offline

    before = hub_constants.HF_HUB_OFFLINE
    with offline():
        assert hub_constants.HF_HUB_OFFLINE is True and sys.modules["os"].environ["HF_HUB_OFFLINE"] == "1"
    assert before == hub_constants.HF_HUB_OFFLINE


@pytest.mark.parametrize(("field", "value"), [
    ("hidden_size", "abc"), ("hidden_size", float("nan")), ("num_key_value_heads", "x"), ("vocab_size", "big"),
    ("num_hidden_layers", 100_000_000), ("num_hidden_layers", 1e8), ("intermediate_size", {"a": 1}),
    # head counts are divisors: 0 was "model_type 'llama' is not buildable (integer division or modulo by zero)"
    ("num_attention_heads", 0), ("num_key_value_heads", 0),
])  # fmt: skip
def test_a_bad_size_field_is_named_in_one_line(tmp_path: Path, field: str, value: object) -> None:
    """`hidden_size: "abc"` was a TypeError traceback; `num_hidden_layers: 1e8` a MemoryError after 2.4 GB."""
    line = cli_error("audit", str(_config(tmp_path / "m", "llama", **{field: value})), *FAST)
    assert f"model config field {field!r} must be an integer" in line and "config.json" in line
    if value == 0:
        assert "must be an integer from 1 to" in line, line
    if field == "num_attention_heads":  # and under GPT-2's name for it (attribute_map)
        line = cli_error("audit", str(_config(tmp_path / "g", "gpt2", n_head=0)), *FAST)
        assert "model config field 'n_head' must be an integer from 1 to" in line, line


def test_a_config_class_refusal_says_why_not_only_which_validator(tmp_path: Path) -> None:
    """It said "not buildable (Class validation error for validator 'validate_architecture':)" and stopped there."""
    line = cli_error("audit", str(_config(tmp_path / "m", "llama", num_attention_heads=3)), *FAST)
    assert "validate_architecture': ValueError: The hidden size (4096) is not a multiple of the number of attention " \
           "heads (3)" in line, line


def test_an_audit_that_measures_nothing_exact_ends_in_one_error_line(tmp_path: Path) -> None:
    """A `rope_type` transformers has no validator for: every run failed, the exit was 1 with no `error:` line,
    and transformers' own warnings came out on stderr ("[transformers] Missing validation function ..." twice)."""
    path = _config(tmp_path / "m", "llama", rope_scaling={"rope_type": "bogus", "factor": 2.0})
    code, out, err = cli("audit", str(path), *FAST)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "nothing could be measured" in lines[0] and str(path) in lines[0] and "--attn-implementation" in lines[0]
    assert "unsupported" in out and "[transformers]" not in err
    code, out, err = cli("audit", str(path), "--json", *FAST)  # the JSON on stdout stays one object
    assert code == 1 and json.loads(out)["recommended"] is None and err.count("\n") == 1


def test_gpt2_style_widths_shrink_too(tmp_path: Path) -> None:
    """`n_embd: 100000` (GPT-2's name for hidden_size) tried 120 GB and the verdict said "leaks"."""
    path = _config(tmp_path / "gpt2", "gpt2", n_embd=100_000, n_positions=1_000_000_000, n_head=50, n_inner=400_000)
    code, out, err = cli("audit", str(path), "--json", "--attn-implementation", "sdpa")
    assert code == 0, err
    report = json.loads(out)
    assert report["recommended"] is not None and all(r["verdict"] == "exact" for r in report["results"])
    small, _ = tiny_config_dict(json.loads((path / "config.json").read_text()), transformers.GPT2Config.attribute_map)
    assert (small["n_embd"], small["n_head"], small["n_inner"], small["n_positions"]) == (64, 4, 96, 4096)


def test_a_size_field_the_shrink_does_not_know_is_refused_before_allocating(tmp_path: Path) -> None:
    """A width under a name no attribute_map gives (CTRL's `dff`) is caught on the meta device: one line, no GBs."""
    line = cli_error("audit", str(_config(tmp_path / "ctrl", "ctrl", dff=10_000_000)), *FAST)
    assert "the tiny model of this config would still have" in line and "parameters" in line


def test_an_encoder_decoder_is_not_audited_as_leaking(tmp_path: Path) -> None:
    """T5: every style was "unsupported", yet the advice said documents leak and to install CUDA kernels."""
    line = cli_error("audit", str(save_config(tmp_path / "t5", "t5")), *FAST)
    assert "'t5' (T5Config) (an encoder-decoder) is not a causal language model" in line
    assert "leak" not in line and "CUDA" not in line


def test_nothing_measured_says_so_instead_of_leaks(tmp_path: Path) -> None:
    """Only flash_attention_2 on a CPU: every run unsupported; the advice must not claim a leak."""
    path = save_config(tmp_path / "llama", "llama")
    code, out, err = cli("audit", str(path), "--json", "--attn-implementation", "flash_attention_2")
    assert code == 1, err
    report = json.loads(out)
    assert all(r["verdict"] == "unsupported" for r in report["results"])
    assert report["advice"].startswith("nothing could be measured") and "leak" not in report["advice"]


def test_own_code_named_by_auto_map_is_said_to_be_unused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A known model_type whose auto_map names the model's own code was audited with the built-in class silently."""
    from transformers import dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))  # not ~/.cache
    auto_map = {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    path = _config(tmp_path / "m", "llama", auto_map=auto_map)
    code, out, err = cli("audit", str(path), "--attn-implementation", "sdpa")
    assert code == 0, err
    assert ("the model's own code (configuration_x.XConfig, modeling_x.XForCausalLM, named by auto_map) was NOT "
            "used: transformers' built-in LlamaForCausalLM was audited instead; pass --trust-remote-code") in out
    # with --trust-remote-code the code must be on disk: one line saying so, no download
    line = cli_error("audit", str(path), "--trust-remote-code", *FAST)
    assert "the model's own code configuration_x.py" in line and "is not beside config.json" in line
    (path / "configuration_x.py").write_text(REMOTE_CONFIG)
    (path / "modeling_x.py").write_text(REMOTE_MODEL)
    code, out, err = cli("audit", str(path), "--trust-remote-code", "--json", "--attn-implementation", "sdpa")
    assert code == 0, err
    assert json.loads(out)["code"] == ("the model's own code was audited (configuration_x.XConfig, "
                                       "modeling_x.XForCausalLM, from disk)")


def test_a_config_the_shrink_cannot_rebuild_is_one_line(tmp_path: Path) -> None:
    """Zamba's config class refuses the shrunk layer count (strict dataclass validation): was a traceback."""
    line = cli_error("audit", str(save_config(tmp_path / "zamba", "zamba")), *FAST)
    assert "cannot shrink the config to a tiny model" in line and "`num_hidden_layers` (2) must be equal" in line


@pytest.mark.parametrize(("field", "value", "kind"), [
    ("model_type", list(range(100_000)), "a string"), ("text_config", 5, "a mapping"), ("auto_map", "x.Y", "a mapping"),
])  # fmt: skip
def test_config_fields_of_the_wrong_kind_are_named(tmp_path: Path, field: str, value: object, kind: str) -> None:
    """A 100k-item model_type was quoted whole (a 689 kB error line); `text_config: 5` was "not a causal LM"."""
    d = {**transformers.AutoConfig.for_model("llama").to_dict(), field: value}
    (tmp_path / "config.json").write_text(json.dumps(d))
    line = cli_error("audit", str(tmp_path / "config.json"), *FAST)
    assert f"config.json field {field!r} must be {kind}" in line and len(line) < 400


@pytest.mark.parametrize("model_type", ["deepseek_v3", "gemma4_text", "gemma3n_text"])
def test_the_shrink_builds_mla_per_layer_overrides_and_kv_sharing(model_type: str) -> None:
    """DeepSeek V3's MLA (rotary dims are `head_dim`, queries `qk_nope + qk_rope` wide), Gemma 4's `per_layer_config`
    (global layers' own head size, keyed by layer index) and Gemma 3n's KV sharing and per-layer input embeddings
    (a vocabulary of their own): the tiny model builds small and runs (the sweep of scripts/check_hf_families.py
    found each failing: a shape error, an index outside the kept layers, a 268M-parameter table)."""
    config = transformers.AutoConfig.for_model(model_type)
    tiny_dict, kept = tiny_config_dict(config.to_dict(), dict(type(config).attribute_map))
    tiny = type(config).from_dict(tiny_dict)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(tiny, experts_implementation="eager").eval()
    assert sum(p.numel() for p in model.parameters()) < 2_000_000 and tiny.num_hidden_layers == len(kept) >= 2
    with torch.no_grad():
        assert model(input_ids=torch.arange(3, 12)[None]).logits.shape == (1, 9, 128)
