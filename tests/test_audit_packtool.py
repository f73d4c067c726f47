"""`packtool audit` measures attn_implementation="packtool" beside eager/sdpa and recommends it when exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import cli

transformers = pytest.importorskip("transformers")

from packtool.audit import AuditConfig, audit_model  # noqa: E402


def test_audit_recommends_packtool_when_exact_and_checks_its_cache_and_padding(tmp_path: Path) -> None:
    transformers.AutoConfig.for_model("mistral", sliding_window=4).save_pretrained(tmp_path)
    report = audit_model(AuditConfig(str(tmp_path), implementations=("sdpa", "packtool")))
    ours = [r for r in report.results if r.attn_implementation == "packtool"]
    assert {r.style for r in ours} == {r.style for r in report.results} and all(r.verdict == "exact" for r in ours)
    assert report.recommended == {"style": "flat_position_ids", "attn_implementation": "packtool"}
    assert report.use_cache_check["verdict"] == "exact"  # sdpa leaks here with use_cache=True (docs/AUDIT.md)
    assert report.padded_check["attn_implementation"] == "packtool" and report.padded_check["verdict"] == "exact"
    assert "import packtool.hf" in report.advice
    code, _, err = cli("audit", str(tmp_path), "--attn-implementation", "cudnn")  # refused before any work
    assert code == 2 and "use some of packtool, eager, sdpa" in err, err  # a usage error
