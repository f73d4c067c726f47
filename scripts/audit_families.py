"""Run `packtool audit` on the default configs of real model families (transformers' own config classes).

    python scripts/audit_families.py [--flex] [FAMILY ...]

Prints one markdown row per family (worst max |Δ| of logits over the packed styles, verdicts per
implementation, recommended setup): the table in docs/AUDIT.md. CPU only, no network, no weights.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

#: family -> (model_type, config overrides): defaults, plus the layer pattern of a released checkpoint
#: where the default config has a single layer kind
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "Llama": ("llama", {}),
    "Qwen3": ("qwen3", {}),
    "Gemma 3 (sliding window)": ("gemma3_text", {}),
    "Mistral (sliding window)": ("mistral", {}),
    "OLMo 3": ("olmo3", {}),
    "LFM2 (default: attention only)": ("lfm2", {}),
    "LFM2 (conv + attention, as LFM2-1.2B)": ("lfm2", {"num_hidden_layers": 16, "full_attn_idxs": [2, 5, 8, 10, 12, 14]}),
    "Mixtral (MoE)": ("mixtral", {}),
    "Qwen3-MoE": ("qwen3_moe", {}),
    "Qwen3.5 (gated delta net)": ("qwen3_5_text", {}),
    "Qwen3-Next (gated delta net + MoE)": ("qwen3_next", {}),
    "OLMo hybrid (gated delta net)": ("olmo_hybrid", {}),
    "Bamba (Mamba-2 + attention)": ("bamba", {"attn_layer_indices": [9, 18, 27]}),
    "Jamba (Mamba + attention + MoE)": ("jamba", {}),
    "Falcon-H1 (parallel Mamba-2 + attention)": ("falcon_h1", {}),
    "GraniteMoeHybrid (Mamba-2 + attention)": (
        "granitemoehybrid",
        {"num_hidden_layers": 8, "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 2},
    ),
    "NemotronH (Mamba-2 + attention + MoE)": ("nemotron_h", {}),
    "Mamba-2": ("mamba2", {}),
}


def main() -> None:
    from transformers import AutoConfig

    from packtool.audit import AuditConfig, audit_model

    parser = argparse.ArgumentParser()
    parser.add_argument("families", nargs="*")
    parser.add_argument("--flex", action="store_true", help="also flex_attention (slower: torch.compile)")
    args = parser.parse_args()
    impls = ("eager", "sdpa", "flex_attention") if args.flex else ("eager", "sdpa")
    print("| family | model_type | kept layers | eager | sdpa |" + (" flex (fwd) |" if args.flex else "") + " max |Δ| logits | needs seq_idx | recommended | s |")
    print("|---|---|---|---|---|" + ("---|" if args.flex else "") + "---|---|---|---|")
    for name, (model_type, overrides) in FAMILIES.items():
        if args.families and not any(f.lower() in name.lower() or f == model_type for f in args.families):
            continue
        with tempfile.TemporaryDirectory() as d:
            AutoConfig.for_model(model_type, **overrides).save_pretrained(d)
            t = time.perf_counter()
            report = audit_model(AuditConfig(d, implementations=impls))
            seconds = time.perf_counter() - t
        cells = []
        for impl in impls:
            verdicts: dict[str, list[str]] = {}
            for r in report.results:
                if r.attn_implementation == impl:
                    verdicts.setdefault(r.verdict, []).append(r.style)
            cells.append("; ".join(f"{v} ({len(s)})" for v, s in sorted(verdicts.items())))
        worst = max((r.max_abs_diff_logits for r in report.results if r.max_abs_diff_logits is not None), default=None)
        rec = "none" if not report.recommended else f"{report.recommended['style']} / {report.recommended['attn_implementation']}"
        kinds = ", ".join(report.layer_kinds) or "-"
        print(
            f"| {name} | {model_type} | {kinds} {report.tiny['kept_layers']} | " + " | ".join(cells)
            + f" | {'-' if worst is None else f'{worst:.1e}'} | {report.needs_seq_idx} | {rec} | {seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
