"""What `packtool stats` prints: a token store's waste table, a pack store's fill and step balance.

Drawn from the result's dict, the same one `--json` prints, so the two never disagree and the stats
stage only measures.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any


def stats_text(result: Any, as_json: bool) -> str:
    data = result.to_dict()
    if as_json:
        return json.dumps(data, sort_keys=True)
    if data["kind"] == "blend":
        return "\n".join(blend_lines(data))
    return "\n".join(_token_lines(data) if data["kind"] == "tokens" else _pack_lines(data))


def _token_lines(s: dict[str, Any]) -> list[str]:
    strategy = f"strategy (N={s['size']}, B={s['batch_size']})"
    notes, strategies = s.get("notes") or {}, s.get("strategies") or {}
    short = {name: note.get("short", "") for name, note in strategies.items()}
    return [
        f"token store {s['path']}",
        f"  documents {s['n_documents']} ({s['n_empty_documents']} empty), tokens {s['n_tokens']}",
        "  length p50 {p50}  p90 {p90}  p99 {p99}  max {max}".format(**s["lengths"]),
        *(_wrapped(f"  N={s['size']}: ", notes.get("size", "")) if s.get("size_source") == "default" else []),
        f"  over-long (> {s['size']}): {s['n_overlong']} documents, counted as fragments -> {s['n_items']} items",
        f"  {strategy:<24}{'rows':>7}{'waste':>9}  {'keeps / gives up' if short else ''}".rstrip(),
        *(
            f"  {name:<24}{s['rows'][name]:>7}{waste:>9.2%}  {short.get(name, '')}".rstrip()
            for name, waste in s["waste"].items()
        ),
        *_wrapped("  rows: ", notes.get("rows", "")),
        *_wrapped("  waste: ", notes.get("waste", "")),
        *_wrapped("  note: ", notes.get("sorting", "")),
        *_wrapped("  pairs: ", notes.get("pairs", "")),
        *_pair_token_lines(s.get("preference")),
        *_vision_lines(s.get("vision")),
    ]


def _wrapped(head: str, text: str, width: int = 80) -> list[str]:
    """`head` + `text` wrapped at 80 columns between words, the next lines indented under the text."""
    return textwrap.wrap(text, width, initial_indent=head, subsequent_indent=" " * len(head), break_on_hyphens=False)


def _pair_token_lines(p: dict[str, Any] | None) -> list[str]:
    """A preference token store: pair-atomic packing in both layouts and the shared prompt's savings."""
    if not p:
        return []
    lines = [
        f"  preference pairs {p['pairs']} ({p['n_empty_pairs']} with an empty sequence), a shared prompt saves "
        f"{p['prompt_tokens_saved']} tokens ({p['prompt_saved_share']:.2%})"
    ]
    for name, r in p["layouts"].items():
        lines.append(
            f"  pair-atomic {name:<14} packs {r['packs']} (lower bound {r['lower_bound']}), waste {r['waste']:.2%}, "
            f"{r['overlong_pairs']} over-long pairs left out"
        )
    return lines


def _pack_lines(s: dict[str, Any]) -> list[str]:
    return [
        f"pack store {s['path']} split {s['split']} size {s['size']} ({s['algorithm']})",
        f"  packs {s['n_packs']} (lower bound {s['lower_bound_packs']}), segments {s['n_segments']}, "
        f"documents {s['n_documents']} ({s['n_empty_documents']} empty)",
        f"  tokens {s['n_tokens']}, efficiency {s['efficiency']:.2%}, pad share {s['pad_share']:.2%}",
        f"  docs per pack mean {s['docs_per_pack_mean']:.2f}, max {s['docs_per_pack_max']}",
        f"  over-long: {s['overlong']['count']} ({s['overlong']['policy']})",
        *(
            f"  source {src.get('path')} (weight {src.get('weight', 1):g}): {src.get('documents')} documents, "
            f"{src.get('tokens')} tokens, share {float(src.get('share', 0)):.2%}"
            for src in s["sources"]
        ),
        *(_step_lines(s["step_efficiency"]) if s.get("step_efficiency") else []),
        *_pair_pack_lines(s.get("preference")),
        *_vision_lines(s.get("vision")),
    ]


def _vision_lines(v: dict[str, Any] | None) -> list[str]:
    """Images of a token store (per document) or of a pack split (per pack)."""
    if not v:
        return []
    per = "pack" if "images_per_pack" in v else "document"
    images, patches = v[f"images_per_{per}"], v[f"patches_per_{per}"]
    budget = f" (budget {v['budget']})" if v.get("budget") else ""
    return [
        f"  images {v['n_images']}, image tokens {v['n_image_tokens']} ({v['image_token_share']:.2%} of tokens), "
        f"images per {per} mean {images['mean']:.2f} max {images['max']:.0f}, patches per {per} mean "
        f"{patches['mean']:.1f} p99 {patches['p99']:.0f} max {patches['max']:.0f}{budget}"
    ]


def _pair_pack_lines(p: dict[str, Any] | None) -> list[str]:
    """A preference split: its layout, pairs and what the over-long policy did."""
    if not p:
        return []
    o = p.get("overlong") or {}
    return [
        f"  pairs {p.get('n_packed_pairs')} of {p.get('pairs')} packed, layout {p.get('layout')}, "
        f"prompt tokens saved {p.get('prompt_tokens_saved')}, over-long pairs {o.get('count')} ({o.get('policy')}: "
        f"{o.get('truncated')} truncated, {o.get('dropped')} dropped), {p.get('n_empty_pairs')} with an empty sequence"
    ]


def _step_lines(s: dict[str, Any]) -> list[str]:
    """The step-balance summary of `--world-size` (plain vs balanced pack order)."""
    p, b = s["plain"], s["balanced"]
    return [
        f"  step efficiency (W={s['world_size']}, B={s['micro_batches']}, {s['steps']} steps; "
        f"cost: {s['cost_model']['source']}; mean rank cost / max rank cost)",
        f"    plain     mean {p['mean']:.2%}  p5 {p['p5']:.2%}  min {p['min']:.2%}",
        f"    balanced  mean {b['mean']:.2%}  p5 {b['p5']:.2%}  min {b['min']:.2%}  "
        f"(window {s['window']} steps: a pack moves <= {s['max_moved_steps']} steps)",
        f"    step time saved by balancing: {s['time_saved']:.2%}",
    ]


def blend_lines(s: dict[str, Any]) -> list[str]:
    """A load-time blend (`packtool stats STORE:W ...`): each store's share of samples and tokens, its epochs."""
    head = (
        f"  {'store':<40}{'weight':>8}{'packs':>10}{'samples':>12}{'share':>9}{'tokens':>14}{'share':>9}{'epochs':>9}"
    )
    return [
        f"blend of {s['n_stores']} pack stores, {s['n_samples']} samples per epoch, {s['n_tokens']} tokens "
        f"(split {s['split']}, size {s['size']}, seed {s['seed']})",
        head,
        *(
            f"  {str(r['path'])[-40:]:<40}{r['weight']:>8g}{r['n_packs']:>10}{r['samples']:>12}{r['sample_share']:>9.2%}"
            f"{r['tokens']:>14}{r['token_share']:>9.2%}{r['epochs']:>9.4g}"
            for r in s["stores"]
        ),
        "  samples: k full passes over a store of weight k + f, plus floor(f * packs + 1/2) distinct seeded packs;",
        "  every prefix of the blend holds each store within 2 samples of its share (packtool.loader.BlendedDataset)",
    ]
