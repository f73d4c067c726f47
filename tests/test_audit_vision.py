"""`packtool audit` on vision-language configs: documents with images, packed (as PackedDataset + PackedCollator
give them) vs each alone, per attention implementation.

Gemma 3 is the case that tells implementations apart: transformers' eager and sdpa read the sliding layers'
bidirectional image blocks at document-local indices when documents are packed, so they leak; "packtool"
is exact. The Qwen families (M-RoPE rows [4, 1, T]) are exact under packtool.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli

transformers = pytest.importorskip("transformers")

from packtool.audit import AuditConfig, audit_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "data" / "sample" / "vision_model" / "qwen2_vl_tiny"


def save(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    getattr(transformers, name)().save_pretrained(folder)
    return folder


def verdicts(report) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    return {(r.style, r.attn_implementation): r.verdict for r in report.results}


def test_gemma3_with_images_leaks_under_eager_and_sdpa_and_is_exact_under_packtool(tmp_path: Path) -> None:
    report = audit_model(
        AuditConfig(str(save(tmp_path, "Gemma3Config")), implementations=("packtool", "eager", "sdpa"))
    )
    got = verdicts(report)
    assert report.architecture == "Gemma3ForConditionalGeneration"
    for style in ("flat_position_ids", "flat_cu_seq_lens"):
        assert got[(style, "packtool")] == "exact"
        assert got[(style, "eager")] == "leaks"
        assert got[(style, "sdpa")] == "leaks"
    leak = next(r for r in report.results if r.attn_implementation == "eager")
    assert leak.max_abs_diff_logits > 1e-3  # a real leak, far above the tolerance
    assert report.recommended == {"style": "flat_position_ids", "attn_implementation": "packtool"}
    assert "token_type_ids" in report.keys and "pixel_values" in report.keys
    assert "eager, sdpa leak" in report.advice
    assert "sliding_attention" in report.layer_kinds and "images" in report.tiny


def test_the_shipped_tiny_qwen2_vl_audits_exact_from_the_cli(tmp_path: Path) -> None:
    code, out, err = cli("audit", str(SHIPPED), "--attn-implementation", "packtool", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model_type"] == "qwen2_vl" and report["architecture"] == "Qwen2VLForConditionalGeneration"
    assert {r["verdict"] for r in report["results"]} == {"exact"}
    assert [r["style"] for r in report["results"]] == ["flat_position_ids", "flat_cu_seq_lens"]
    assert report["keys"] == ["input_ids", "position_ids", "pixel_values", "image_grid_thw"]
    assert len(report["documents"]) == 4 and report["tiny"]["images"].startswith("4 images")


def test_a_qwen_batch_without_its_mrope_rows_is_caught(tmp_path: Path) -> None:
    """The check can fail: the same packed batch with plain restarting positions (no M-RoPE rows) leaks."""
    import torch

    from packtool.audit import probe, vision

    config = transformers.AutoConfig.from_pretrained(SHIPPED)
    tiny, _, _ = vision.tiny_vision_config(config)
    model = vision.build(transformers, tiny, "packtool", torch.float64, 0)
    docs = vision.documents(tiny, 0)
    ref = vision.reference("qwen", model, docs, backward=False)
    batch = vision.packed_batch("qwen", model, docs, "flat_position_ids")
    assert batch["position_ids"].shape == (4, 1, sum(int(d.ids.numel()) for d in docs))
    good = vision.packed(model, docs, batch, backward=False)
    assert probe.compare(ref, good, torch.float64)[4] == "exact"
    wrong = vision.packed(model, docs, {**batch, "position_ids": batch["position_ids"][0]}, backward=False)
    assert probe.compare(ref, wrong, torch.float64)[4] == "leaks"


@pytest.mark.parametrize("name", ["Qwen2_5_VLConfig", "Qwen3VLConfig", "Qwen3VLMoeConfig"])
def test_qwen_families_with_images_are_exact_under_packtool(tmp_path: Path, name: str) -> None:
    report = audit_model(AuditConfig(str(save(tmp_path, name)), implementations=("packtool",)))
    assert set(verdicts(report).values()) == {"exact"}
    assert all(r.dtype == "float64" for r in report.results)  # MoE experts run eager, in float64


def test_a_text_only_gemma3_config_is_still_audited_as_text(tmp_path: Path) -> None:
    folder = tmp_path / "g"
    transformers.Gemma3TextConfig().save_pretrained(folder)
    report = audit_model(AuditConfig(str(folder), implementations=("packtool",)))
    assert report.architecture == "Gemma3ForCausalLM" and "images" not in report.tiny
