"""The one line each command prints about its result; `packtool run` prints the same lines per step."""

from __future__ import annotations

import json
import re
from typing import Any

from packtool.cli.stats_text import stats_text


def tokenize_line(result: Any) -> str:
    m = result.manifest
    state = "up to date" if result.up_to_date else f"{result.reused_chunks}/{result.n_chunks} chunks reused"
    from packtool.core.encoding.shapes.registry import default_field

    shape = m.get("input_shape") or {}
    field = (m.get("fields") or {}).get("messages_field")
    default = default_field(str(shape.get("name")), "messages")
    under = f" (turns under {field!r})" if default and field != default else ""
    detected = f"detected format {shape['name']}{under}, " if shape.get("detected") else ""
    if shape.get("shapes"):  # --format auto read each file as its own records decided
        detected = f"detected formats {', '.join(shape['shapes'])} (per file: see the manifest's sources), "
    reasons = m.get("rejected_by_reason") or {}
    shown = [f"{n} {kind}" for kind, n in list(reasons.items())[:4]] + (["..."] if len(reasons) > 4 else [])
    why = f" ({'; '.join(shown)}; see rejects.jsonl)" if reasons else ""
    pref = m.get("preference")
    docs = f"{m['n_documents']} documents"
    if isinstance(pref, dict) and "pairs" in pref:  # a preference store: each pair is two documents
        docs = f"{pref['pairs']} preference pairs ({m['n_documents']} documents: chosen, rejected)"
    vision = m.get("vision")
    if isinstance(vision, dict):  # a store with images: how many, held once each
        docs += (
            f" with {vision.get('n_images')} images ({vision.get('n_unique')} unique, "
            f"{vision.get('n_image_tokens')} image tokens, {vision.get('family')})"
        )
    return (
        f"tokenized {docs}, {m['n_tokens']} tokens ({m['n_target_tokens']} targets, "
        f"{m['dtype']}), {detected}{m.get('n_rejected', 0)} rejected{why}, {state} -> {result.path}"
    )


def pack_line(result: Any) -> str:
    m = result.metadata
    real = 100 * m["n_tokens"] / max(1, m["n_packs"] * m["pack_size"])
    return (
        f"packed {m['n_segments']} segments ({m['n_tokens']} tokens) into {m['n_packs']} packs of {m['pack_size']} "
        f"(lower bound {m['lower_bound_packs']}), fill {m['packing_efficiency']}% (real tokens {real:.2f}%), "
        f"{m['overlong']['count']} over-long ({m['overlong']['policy']}) -> {result.directory}"
    ) + _mixture_lines(result)


def _pair_line(m: dict[str, Any]) -> str:
    """A preference pack: pairs packed whole, the layout and what a shared prompt saved."""
    p = m.get("preference")
    if not isinstance(p, dict):
        return ""
    return (
        f"\n  {p['n_packed_pairs']} of {p['pairs']} pairs packed whole ({p['layout']}), "
        f"{p['prompt_tokens_saved']} prompt tokens held once, {p['overlong']['dropped']} over-long dropped, "
        f"{p['overlong']['truncated']} truncated, {p['n_empty_pairs']} with an empty sequence"
    )


def _mixture_lines(result: Any) -> str:
    """A mixture's sources (documents, tokens, share) and a `--validation` run's second split, one line each."""
    lines = []
    for m in [result.metadata, *([result.validation] if getattr(result, "validation", None) else [])]:
        sources = m.get("source")
        if not isinstance(sources, list):
            continue
        if m is not result.metadata:
            lines.append(
                f"{m['split']}_{m['pack_size']}: {m['n_segments']} segments ({m['n_tokens']} tokens) in {m['n_packs']} packs"
            )
        for s in sources:
            lines.append(
                f"  {m['split']} <- {s['path']} (weight {s['weight']:g}): {s['documents']} documents, "
                f"{s['tokens']} tokens, share {s['share']:.2%}"
            )
    return _pair_line(result.metadata) + "".join("\n" + line for line in lines)


def merge_line(result: Any) -> str:
    m = result.manifest
    return f"merged {result.n_shards} shards: {m['n_documents']} documents, {m['n_tokens']} tokens -> {result.path}"


def verify_line(report: Any) -> str:
    src = f"; every document of {report.source} round-trips" if report.source else ""
    return f"ok: {report.kind} store {report.path}: " + "; ".join(report.checked) + src


def export_lines(result: Any) -> list[str]:
    files = ", ".join(str(f) for f in result.files)
    if not result.files:  # the trainer reads the pack store itself (a preference store for TRL's DPO)
        return [
            f"{result.n_packs} packs of {result.size} tokens need no export for {result.target}: nothing written",
            *result.lines,
        ]
    return [f"exported {result.n_packs} packs of {result.size} tokens for {result.target} -> {files}", *result.lines]


def audit_text(report: Any, as_json: bool) -> str:
    """`packtool audit`: the report's JSON, or the table (style x implementation -> max |Δ|, verdict),
    the reasons, the checks and the setup to use, drawn from the same data."""
    d = report.to_dict()
    if as_json:
        return json.dumps(d, sort_keys=True)
    kinds = ", ".join(d["layer_kinds"]) or "uniform"
    lines = [
        f"audit {d['model']}: {d['model_type']} ({d['architecture'] or 'not buildable'}), layer kinds: {kinds}; "
        f"tiny random model {d['tiny']}; documents of {'+'.join(map(str, d['documents']))} tokens, "
        "packed vs each alone, forward and backward",
        f"{'style':26} {'attention':18} {'dtype':8} {'max|Δ| logits':>13} {'max|Δ| grads':>13}  verdict",
    ]
    reasons: list[str] = []
    for r in d["results"]:
        dl, dg = (_sci(r[k]) for k in ("max_abs_diff_logits", "max_abs_diff_grads"))
        mark = ""
        if r["reason"]:
            if r["reason"] not in reasons:
                reasons.append(r["reason"])
            mark = f" [{reasons.index(r['reason']) + 1}]"
        lines.append(
            f"{r['style']:26} {r['attn_implementation']:18} {r['dtype']:8} {dl:>13} {dg:>13}  {r['verdict']}{mark}"
        )
    lines += [f"[{i}] {reason}" for i, reason in enumerate(reasons, 1)]
    lines.append("tolerance: max |Δ| <= 1e-6 (float64 runs) / 1e-4 (float32) x the reference's largest |value|")
    c = d.get("use_cache_check")
    if c and c.get("max_abs_diff_logits") is not None:
        lines.append(
            f"with use_cache=True ({c['style']}, {c['attn_implementation']}): max |Δ| logits "
            f"{c['max_abs_diff_logits']:.2e}, {c['verdict']}"
        )
    pc = d.get("padded_check")
    if pc and pc.get("max_abs_diff_logits") is not None:
        lines.append(
            f"padded fallback (PaddedCollator, {pc['attn_implementation']}): max |Δ| logits "
            f"{pc['max_abs_diff_logits']:.2e}, grads {pc['max_abs_diff_grads']:.2e}, {pc['verdict']}"
        )
    if d.get("code"):
        lines.append(d["code"])
    rec = d["recommended"]
    if rec:
        lines.append(
            f"recommended: {rec['style']} with attn_implementation={rec['attn_implementation']!r}; "
            f"batch keys: {', '.join(d['keys'])}"
        )
    else:
        lines.append("recommended: none")
    lines.append(d["advice"])
    return "\n".join(lines)


#: a word of an error message longer than this (a path, a flag's value, a field name) is shortened
_WORD = 160
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_LONG_WORD = re.compile(rf"\S{{{_WORD + 1},}}")


def error_line(message: str) -> str:
    """`error: MESSAGE` as ONE bounded line, whatever the message quotes: a newline or another control character
    in a file name or a value (`a\nb.jsonl`) is escaped (it split the line in two), and a word longer than 160
    characters (a 100,000-character `--role-map` was quoted whole: 200 kB on one line) keeps its ends."""
    text = _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), message)
    text = _LONG_WORD.sub(lambda m: f"{m.group(0)[:100]}...({len(m.group(0)):,} characters)...{m.group(0)[-40:]}", text)
    return f"error: {text}"


def audit_failure(report: Any) -> str:
    """The one `error:` line of an audit that found no exact packed setup (the report itself is on stdout)."""
    measured = any(r.verdict != "unsupported" for r in report.results)
    if not measured:
        first = next((r.reason for r in report.results if r.reason), "no reason given")
        first = first if len(first) <= 200 else first[:197] + "..."
        return (
            f"nothing could be measured (first reason: {first}), {report.model}, fix what the reasons name or try "
            "another --attn-implementation, then re-run the audit"
        )
    return (
        f"no packed setup is exact: packed documents leak under every style and attention implementation that ran, "
        f"{report.model}, train with padded dynamic batches or install the kernels the advice names (see the report)"
    )


def _sci(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def run_lines(result: Any) -> list[str]:
    """What `packtool run` prints: each stage's own summary line, prefixed with the step name."""
    lines = []
    for step in result.steps:
        tag = f"[{step.name}]"
        if step.tokenize is not None:
            lines.append(f"{tag} {tokenize_line(step.tokenize)}")
        if step.pack is not None:
            lines.append(f"{tag} {pack_line(step.pack)}")
        if step.stats is not None:
            lines.append(stats_text(step.stats, step.stats_json))
            if step.plot is not None:
                lines.append(f"{tag} plot -> {step.plot}")
        if step.verify is not None:
            lines.append(f"{tag} verify {verify_line(step.verify)}")
        if step.export is not None:
            first, *rest = export_lines(step.export)
            lines += [f"{tag} {first}", *rest]
    return lines
