"""Sweep `attn_implementation="packtool"` over every causal-LM family of the installed transformers.

    python scripts/check_hf_families.py [FAMILY ...] [--timeout 240] [--json FILE] [--variant default|bite]

For each `model_type` in transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, the model is built
from its own config class, shrunk by `packtool.audit.tiny` (a few thousand parameters, the first
layer of every kind, sliding windows and chunks of 4 tokens), in float64 (float32 where float64
does not run). The reference is each document ALONE under `eager`. Under "packtool" the same
documents then run:

- packed: `[1, T]` with restarting `position_ids` only (TRL `padding_free` / `DataCollatorWithFlattening`),
  `[1, T]` with `cu_seq_lens_*` from `PackedCollator(keys=HF_KEYS)`, and `[2, N]` rows of two documents;
- padded: right and left padding with a 2-D `attention_mask`;
- plain: each document alone, and a `[2, L]` batch of equal-length rows;
- generate: a left-padded batch, greedy, a few tokens (dynamic cache), against eager's `generate` per document.

Logits and every parameter gradient must equal the reference within 1e-6 (float64; 1e-4 float32) x
its largest |value|. The variant `bite` turns on what a family's config offers and the default
leaves off (sliding windows, softcapping of 0.5, `use_bidirectional_attention` stays off), so the
features are crossed. A style that differs is cross-checked on the same batch: under eager (when
eager differs from the reference and "packtool" gives eager's result, the difference comes from
layers other than attention, e.g. Mamba or short convolutions without their CUDA kernels), and
against each document alone given the same `position_ids` (RoBERTa-style models count positions
from `padding_idx + 1`, so 0-based `position_ids` change their embeddings, not their attention).

Each family gets a verdict: `exact`; `limited` (exact wherever the model itself can be: its other
styles differ under eager the same way, or only by the model's own positions); `refused` (packtool
raised a one-line error naming the feature); `WRONG` (a silent difference: a defect); `crash`
(another exception: a defect unless eager crashes too); `n/a` (encoder-decoder, attention outside
transformers' interface, the family cannot be built tiny here). Each family runs in a worker
process with a timeout; the whole sweep takes minutes on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packtool, not whichever one the environment has installed

MARK = "@@family "
RTOL = {"float64": 1e-6, "float32": 1e-4}
LENGTHS = (9, 7, 11, 5)  # rows of two documents: 16 + 16
NEW_TOKENS = 4
#: `bite`: fields turned on where a family's config has them (a window of 4 < the documents, a small softcap)
BITE = {"use_sliding_window": True, "sliding_window": 4, "attn_logit_softcapping": 0.5, "max_window_layers": 1}
QSA = {"indexer_budget": 8, "indexer_compress_ratio": 4, "indexer_n_heads": 2, "indexer_kv_heads": 1,
       "indexer_head_dim": 16}
#: fields set after the shrink (a family that accepts only one value of a field the shrink sets)
AFTER: dict[str, dict[str, Any]] = {"zaya": {"num_experts_per_tok": 1}, "dots3_note": {"head_dim": 16},
                                    "dots3_note_text": {"head_dim": 16}}
#: fields a family's default config leaves unset (None) although its model needs them, or a layer pattern that
#: gives the tiny model an attention layer (set before the shrink; the shrink then makes them small)
FIXES: dict[str, dict[str, Any]] = {
    "deepseek_v2": {"num_experts_per_tok": 2},
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "hunyuan_v1_dense": {"head_dim": 128},
    "hunyuan_v1_moe": {"head_dim": 128},
    "ministral": {"head_dim": 128},
    "nemotron": {"num_key_value_heads": 8},
    "qwen4_exp": QSA,
    "qwen4_exp_text": QSA,
    "lfm2_moe": {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "lfm2": {"num_hidden_layers": 4, "layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
    "bamba": {"attn_layer_indices": [9, 18, 27]},
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    "recurrent_gemma": {"num_hidden_layers": 2, "block_types": ["recurrent", "attention"]},
    "blt": {"encoder_hash_byte_group_vocab": 64, "encoder_hash_byte_group_size": [3, 4]},
    "dots3_note": {"num_key_value_heads": 128},
    "dots3_note_text": {"num_key_value_heads": 128},
    "zamba": {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 1, "layers_block_type": None,
              "attention_head_dim": 32, "mamba_dt_rank": 8},
    "zamba2": {"num_hidden_layers": 2, "layers_block_type": ["linear_attention", "hybrid"], "hybrid_layer_ids": [1],
               "attention_head_dim": 32, "mamba_headdim": 16, "n_mamba_heads": 8},
    "granitemoehybrid": {"num_hidden_layers": 8, "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 2},
}


#: what mixes packed documents outside attention, per family whose packed batches differ under eager the same way
MIXES = {
    "bamba": "Mamba-2 layers (BambaMixer)",
    "falcon_h1": "Mamba-2 mixers beside attention in every layer (FalconH1Mixer)",
    "jamba": "Mamba layers (JambaMambaMixer)",
    "nemotron_h": "Mamba-2 layers (NemotronHMamba2Mixer)",
    "granitemoehybrid": "Mamba-2 layers; and it hands position_ids to neither its mask nor its attention, so "
                        "restarting position_ids alone separate no documents under any attn_implementation "
                        "(cu_seq_lens_* do, in attention)",
    "qwen3_next": "Gated DeltaNet layers",
    "qwen3_5": "Gated DeltaNet layers",
    "qwen3_5_text": "Gated DeltaNet layers",
    "qwen3_5_moe": "Gated DeltaNet layers",
    "qwen3_5_moe_text": "Gated DeltaNet layers",
    "olmo_hybrid": "Gated DeltaNet layers",
    "kimi_linear": "Kimi Delta Attention layers",
    "bailing_hybrid": "linear (delta) attention layers",
    "minimax": "lightning (linear) attention layers",
    "lfm2": "short convolution layers",
    "lfm2_moe": "short convolution layers",
    "lfm3": "short convolution layers",
    "recurrent_gemma": "RG-LRU recurrent blocks",
    "zaya": "the convolutions of its Compressed Convolutional Attention (q/k/v mixed over neighbouring tokens "
            "before attention)",
}
OUTSIDE = "the model mixes packed documents outside attention: {what}; "
AS_EAGER = "eager gives the same result on this batch (the difference is the model's, not attention's)"
POSITIONS = ("the model counts positions from padding_idx + 1 (RoBERTa style); each document alone given the same "
             "position_ids equals it")
#: an attention-only twin of a family (set before the shrink) that checks attention apart from the layers that mix
TWINS: dict[str, dict[str, Any]] = {"granitemoehybrid": {"layer_types": ["attention"] * 8}}


# ---------------------------------------------------------------- one family (runs in a worker process)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def tiny_config(model_type: str, variant: str, extra: dict[str, Any] | None = None) -> Any:
    """The family's config class, shrunk (`extra`: fields set before the shrink, over FIXES); NotApplicable when it
    is not a decoder-only causal LM."""
    import transformers

    from packtool.audit.tiny import tiny_config_dict

    config = transformers.AutoConfig.for_model(model_type)
    if getattr(config, "is_encoder_decoder", False):
        raise NotApplicable("encoder-decoder")
    text = config.get_text_config(decoder=True)
    if type(text) not in transformers.AutoModelForCausalLM._model_mapping:
        text = config
    raw = {**text.to_dict(), **FIXES.get(model_type, {}), **(extra or {})}
    if variant == "bite":
        for key, value in BITE.items():
            if key in raw:
                raw[key] = value
        if "use_sliding_window" in raw and isinstance(raw.get("layer_types"), list):
            raw["layer_types"] = None  # recomputed from use_sliding_window and max_window_layers (Qwen2 style)
    small, _ = tiny_config_dict(raw, dict(getattr(type(text), "attribute_map", {}) or {}))
    for key, value in list(small.items()):  # a multimodal config: its text, vision and audio parts shrink alike
        if key.endswith("_config") and isinstance(value, dict) and value.get("hidden_size"):
            small[key], _ = tiny_config_dict(value)
    if "is_decoder" in small:  # an encoder family's causal-LM head is a decoder
        small["is_decoder"] = True
    small.update(AFTER.get(model_type, {}))
    for key in ("use_cache",):
        small.pop(key, None)
    tiny = type(text).from_dict(small)
    tiny.use_cache = False
    return tiny


class NotApplicable(Exception):
    pass


def documents(vocab: int) -> list[Any]:
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    low = 3 if vocab > 8 else 0
    return [torch.from_numpy(rng.integers(low, vocab, n)) for n in LENGTHS]


def build(tiny: Any, dtype: Any) -> Any:
    import copy

    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(tiny), attn_implementation="eager", dtype=dtype, experts_implementation="eager"
    )
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language
        model.set_default_language(next(iter(tiny.languages)))
    return model.eval()


def _check_size(tiny: Any) -> None:
    """Refuse (before allocating anything) a model the shrink left large: its parameters counted on the meta device."""
    import copy

    import torch
    import transformers

    from packtool.audit.tiny import check_size

    with torch.device("meta"):
        shape = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(tiny))
    check_size(shape)
    large = sum(int(p.numel()) for p in shape.parameters())
    if large > 20_000_000:
        raise ValueError(f"{large:,} parameters: a nested config (vision, audio, patcher) kept its real sizes")


def uses_interface(tiny: Any) -> bool:
    """Whether the family's modeling code calls transformers' attention interface at all."""
    import inspect

    import transformers

    cls = transformers.AutoModelForCausalLM._model_mapping[type(tiny)]
    source = inspect.getsource(sys.modules[cls.__module__])
    return "ALL_ATTENTION_FUNCTIONS" in source or "AttentionInterface" in source


def _loss(logits: Any, doc: Any) -> Any:
    import torch.nn.functional as F

    return F.cross_entropy(logits[:-1].double(), doc[1:], reduction="sum")


def _grads(model: Any, loss: Any) -> list[Any]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, got, strict=True)]


def run_docs(model: Any, docs: list[Any]) -> tuple[list[Any], list[Any]]:
    """Each document alone: (logits per document, gradients of the summed losses)."""
    logits = [model(input_ids=d[None]).logits[0] for d in docs]
    loss = sum(_loss(lg, d) for lg, d in zip(logits, docs, strict=True))
    return [lg.detach() for lg in logits], _grads(model, loss)


def batches(docs: list[Any]) -> dict[str, tuple[dict[str, Any], Any]]:
    """style -> (model kwargs, logits -> each document's logits)."""
    import numpy as np
    import torch

    from packtool.loader import HF_KEYS, PackedCollator

    def items(groups: list[list[int]]) -> list[dict[str, Any]]:
        out = []
        for group in groups:
            parts = [docs[i] for i in group]
            ids = torch.cat(parts)
            lens = [len(p) for p in parts]
            out.append({"input_ids": ids, "labels": ids.clone(),
                        "position_ids": torch.cat([torch.arange(n) for n in lens]),
                        "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)})
        return out

    flat = PackedCollator(flatten=True, keys=HF_KEYS)(items([[i] for i in range(len(docs))]))
    rows = PackedCollator(keys=("input_ids", "position_ids"))(items([[0, 1], [2, 3]]))
    bounds = np.concatenate([[0], np.cumsum([len(d) for d in docs])])

    def in_order(out: Any) -> list[Any]:
        row = out.reshape(-1, out.shape[-1])
        return [row[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    width = max(len(d) for d in docs)
    right = torch.zeros(len(docs), width, dtype=torch.long)
    left = torch.zeros_like(right)
    mask_r, mask_l = torch.zeros_like(right), torch.zeros_like(right)
    for i, d in enumerate(docs):
        right[i, : len(d)], mask_r[i, : len(d)] = d, 1
        left[i, width - len(d) :], mask_l[i, width - len(d) :] = d, 1

    def unpad(mask: Any) -> Any:
        return lambda out: [out[i][mask[i].bool()] for i in range(len(docs))]

    return {
        "packed_position_ids": ({"input_ids": flat["input_ids"], "position_ids": flat["position_ids"]}, in_order),
        "packed_cu_seq_lens": ({k: flat[k] for k in HF_KEYS if k != "labels"}, in_order),
        "packed_rows": (dict(rows), in_order),
        "padded_right": ({"input_ids": right, "attention_mask": mask_r}, unpad(mask_r)),
        "padded_left": ({"input_ids": left, "attention_mask": mask_l,
                         "position_ids": (mask_l.cumsum(-1) - 1).clamp(min=0)}, unpad(mask_l)),
    }


def _worst(a: list[Any], b: list[Any]) -> tuple[float, float]:
    """(max |a - b|, max |b|) over the pairs."""
    diff = max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))
    scale = max(float(y.double().abs().max()) for y in b)
    return diff, scale


def compare(ref: tuple[list[Any], list[Any] | None], got: tuple[list[Any], list[Any] | None], rtol: float) -> dict[str, Any]:
    import math

    dl, sl = _worst(got[0], ref[0])
    out: dict[str, Any] = {"logits": dl, "tol_logits": rtol * sl}
    ok = dl <= rtol * sl
    if ref[1] is not None and got[1] is not None:
        dg, sg = _worst(got[1], ref[1])
        out.update(grads=dg, tol_grads=rtol * max(sg, 1e-30))
        ok = ok and dg <= rtol * max(sg, 1e-30)
    finite = math.isfinite(dl) and math.isfinite(out.get("grads", 0.0))
    out["ok"] = bool(ok and finite)
    return out


def run_style(model: Any, docs: list[Any], batch: dict[str, Any], pick: Any) -> tuple[list[Any], list[Any]]:
    logits = pick(model(**batch, use_cache=False).logits)
    loss = sum(_loss(lg, d) for lg, d in zip(logits, docs, strict=True))
    return [lg.detach() for lg in logits], _grads(model, loss)


def generate(model: Any, docs: list[Any], padded: bool) -> tuple[Any, list[Any]]:
    """Greedy tokens and per-step logits: the left-padded batch, or each document alone (stacked)."""
    import torch

    opts = {"max_new_tokens": NEW_TOKENS, "do_sample": False, "return_dict_in_generate": True,
            "output_logits": True, "use_cache": True, "eos_token_id": None, "pad_token_id": 0}
    if not padded:
        outs = [model.generate(input_ids=d[None], **opts) for d in docs]
        seqs = torch.stack([o.sequences[0, len(d):] for o, d in zip(outs, docs, strict=True)])
        logits = [torch.stack([o.logits[s][0] for o in outs]) for s in range(NEW_TOKENS)]
        return seqs, logits
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, width - len(d) :], mask[i, width - len(d) :] = d, 1
    out = model.generate(input_ids=ids, attention_mask=mask, **opts)
    return out.sequences[:, width:], list(out.logits)


def check_family(model_type: str, variant: str = "default", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every style of one family: {"family", "verdict", "reason", "dtype", "calls", "styles": {...}}."""
    import torch
    import transformers

    import packtool.hf
    from packtool.errors import PacktoolError

    result: dict[str, Any] = {"family": model_type, "variant": variant, "styles": {}}
    calls = [0]
    original = transformers.AttentionInterface._global_mapping[packtool.hf.NAME]

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    transformers.AttentionInterface.register(packtool.hf.NAME, counted)
    try:
        tiny = tiny_config(model_type, variant, extra)
    except NotApplicable as exc:
        return {**result, "verdict": "n/a", "reason": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the config class cannot be built or shrunk here
        return {**result, "verdict": "n/a", "reason": f"config not buildable tiny: {_first_line(exc)}"}
    try:
        if not uses_interface(tiny):
            return {**result, "verdict": "n/a", "reason": "its attention does not call transformers' attention interface"}
    except Exception:  # noqa: BLE001 - decided below by counting calls
        pass
    try:
        _check_size(tiny)
    except Exception as exc:  # noqa: BLE001 - a nested config the shrink does not reach
        return {**result, "verdict": "n/a", "reason": f"not tiny: {_first_line(exc)}"}
    model = ref = None
    reason = None
    for dtype in (torch.float64, torch.float32):
        try:
            model = build(tiny, dtype)
            docs = documents(int(model.config.get_text_config().vocab_size))
            ref = run_docs(model, docs)
            break
        except Exception as exc:  # noqa: BLE001 - eager itself fails in this dtype
            model, reason = None, _first_line(exc)
    if model is None or ref is None:
        return {**result, "verdict": "n/a", "reason": f"eager reference does not run: {reason}"}
    name = str(next(model.parameters()).dtype).removeprefix("torch.")
    rtol = RTOL[name]
    result.update(dtype=name, architecture=type(model).__name__)
    styles: dict[str, Any] = result["styles"]

    def attempt(style: str, fn: Any) -> None:
        try:
            styles[style] = fn()
        except PacktoolError as exc:
            styles[style] = {"ok": False, "refused": _first_line(exc)}
        except Exception as exc:  # noqa: BLE001 - a crash is a finding
            styles[style] = {"ok": False, "crash": _first_line(exc)}

    try:
        model.set_attn_implementation(packtool.hf.NAME)
    except Exception as exc:  # noqa: BLE001
        return {**result, "verdict": "n/a", "reason": f"set_attn_implementation refused: {_first_line(exc)}"}
    got: dict[str, Any] = {}  # packtool's outputs per style, for the cross-check under eager

    def styled(style: str, batch: dict[str, Any], pick: Any) -> dict[str, Any]:
        got[style] = run_style(model, docs, batch, pick)
        return compare(ref, got[style], rtol)

    for style, (batch, pick) in batches(docs).items():
        attempt(style, lambda style=style, batch=batch, pick=pick: styled(style, batch, pick))
    attempt("plain", lambda: compare(ref, run_docs(model, docs), rtol))
    if calls[0] == 0 and not any("refused" in out for out in styles.values()):
        return {**result, "verdict": "n/a", "reason": "attention does not go through transformers' attention interface"}
    equal = [docs[1], docs[0][: len(docs[1])]]

    def plain_rows() -> dict[str, Any]:
        model.set_attn_implementation("eager")
        want = run_docs(model, equal)
        model.set_attn_implementation(packtool.hf.NAME)
        logits = [lg for lg in model(input_ids=torch.stack(equal), use_cache=False).logits]
        loss = sum(_loss(lg, d) for lg, d in zip(logits, equal, strict=True))
        return compare(want, ([lg.detach() for lg in logits], _grads(model, loss)), rtol)

    attempt("plain_rows", plain_rows)
    gen_docs = docs[:3]
    try:
        model.set_attn_implementation("eager")
        with torch.no_grad():
            want_seqs, want_logits = generate(model, gen_docs, padded=False)
        gen_ref: Any = (want_seqs, want_logits)
    except Exception as exc:  # noqa: BLE001 - the family cannot generate under eager either
        gen_ref = _first_line(exc)
    finally:
        model.set_attn_implementation(packtool.hf.NAME)

    def gen() -> dict[str, Any]:
        if isinstance(gen_ref, str):
            return {"ok": True, "skipped": f"eager cannot generate: {gen_ref}"}
        with torch.no_grad():
            seqs, logits = generate(model, gen_docs, padded=True)
        got["generate"] = (seqs, logits)
        out = compare((gen_ref[1], None), (logits, None), rtol)
        out["tokens_equal"] = bool(torch.equal(seqs, gen_ref[0]))
        out["ok"] = out["ok"] and out["tokens_equal"]
        return out

    attempt("generate", gen)
    _cross_check(model, docs, gen_docs, (ref, gen_ref), got, styles, rtol)
    result["calls"] = calls[0]
    if extra is None and model_type in TWINS and any(not o.get("ok") and "refused" not in o for o in styles.values()):
        twin = check_family(model_type, variant, TWINS[model_type])  # the same model, attention layers only
        for style, out in styles.items():
            if not out.get("ok"):
                mine = twin["styles"].get(style) or {}
                out["twin"] = "exact" if mine.get("ok") else "as_eager" if mine.get("same_as_eager") else "differs"
    result.update(_verdict(model_type, styles))
    return result


def _cross_check(model: Any, docs: list[Any], gen_docs: list[Any], refs: tuple[Any, Any], got: dict[str, Any],
                 styles: dict[str, Any], rtol: float) -> None:
    """A style that differs (or crashes) under "packtool": does eager differ from the documents alone on the same
    batch (`eager`), and does "packtool" then give eager's result on it (`same_as_eager`: attention is right, the
    difference comes from elsewhere, e.g. Mamba layers or absolute positions)?"""
    import torch

    import packtool.hf

    ref, gen_ref = refs
    model.set_attn_implementation("eager")
    try:
        table = batches(docs)
        positioned = None  # each document alone with position_ids 0.. passed, as the batches pass them
        for style, out in styles.items():
            if out.get("ok") or "refused" in out:
                continue
            try:
                if style == "generate":
                    with torch.no_grad():
                        seqs, logits = generate(model, gen_docs, padded=True)
                    eager = compare((gen_ref[1], None), (logits, None), rtol)
                    eager["ok"] = eager["ok"] and bool(torch.equal(seqs, gen_ref[0]))
                    if style in got:
                        same = compare((logits, None), (got[style][1], None), rtol)
                        out["same_as_eager"] = same["ok"] and bool(torch.equal(seqs, got[style][0]))
                elif style in table:
                    mine = run_style(model, docs, *table[style])
                    eager = compare(ref, mine, rtol)
                    if style in got:
                        out["same_as_eager"] = compare(mine, got[style], rtol)["ok"]
                        if positioned is None:
                            logits = [model(input_ids=d[None], position_ids=torch.arange(len(d))[None]).logits[0]
                                      for d in docs]  # fmt: skip
                            loss = sum(_loss(lg, d) for lg, d in zip(logits, docs, strict=True))
                            positioned = ([lg.detach() for lg in logits], _grads(model, loss))
                        out["same_as_positioned_documents"] = compare(positioned, got[style], rtol)["ok"]
                else:
                    continue
            except Exception as exc:  # noqa: BLE001
                eager = {"ok": False, "crash": _first_line(exc)}
            out["eager"] = eager
    finally:
        model.set_attn_implementation(packtool.hf.NAME)


def _verdict(model_type: str, styles: dict[str, Any]) -> dict[str, Any]:
    """The family's verdict from its styles, and why: a `limited` style names the rule that explains it."""
    import math

    wrong, why = [], {}
    crash: dict[str, list[str]] = {}
    refused: dict[str, list[str]] = {}
    for style, out in styles.items():
        if out.get("ok"):
            continue
        eager = out.get("eager") or {}
        if "refused" in out:
            refused.setdefault(out["refused"], []).append(style)
        elif out.get("same_as_positioned_documents"):
            why.setdefault(POSITIONS, []).append(style)
        elif "crash" in out and "crash" in eager:
            why.setdefault(f"the model raises the same under eager ({out['crash']})", []).append(style)
        elif eager and not eager.get("ok") and out.get("same_as_eager"):
            mixes = OUTSIDE.format(what=MIXES[model_type]) if model_type in MIXES else ""
            why.setdefault(mixes + AS_EAGER, []).append(style)
        elif eager and not eager.get("ok") and out.get("twin") in ("exact", "as_eager"):
            mixes = OUTSIDE.format(what=MIXES.get(model_type, "its other layers"))
            why.setdefault(mixes + "packtool keeps them apart in attention where eager does not (an attention-only "
                           "twin of the model is exact on this batch)", []).append(style)
        elif out.get("logits", 1.0) <= out.get("tol_logits", 0.0) and math.isnan(eager.get("grads", 0.0)):
            why.setdefault("logits exact; eager's own gradients on this batch are NaN", []).append(style)
        elif "crash" in out:
            crash.setdefault(out["crash"], []).append(style)
        else:
            wrong.append(style)

    def grouped(by: dict[str, list[str]]) -> str:
        return "; ".join(f"{message} ({', '.join(names)})" for message, names in by.items())

    if crash:
        return {"verdict": "crash", "reason": grouped(crash)}
    if wrong:
        return {"verdict": "WRONG", "reason": ", ".join(wrong)}
    if refused:
        return {"verdict": "refused", "reason": grouped(refused)}
    if why:
        return {"verdict": "limited", "reason": grouped(why)}
    return {"verdict": "exact", "reason": ""}


def worker(variant: str) -> None:
    """Read family names from stdin, write one result line per family (MARK + JSON) to stdout."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for line in sys.stdin:
        family = line.strip()
        if not family:
            continue
        start = time.perf_counter()
        try:
            result = check_family(family, variant)
        except Exception as exc:  # noqa: BLE001 - the sweep itself failed on this family
            result = {"family": family, "verdict": "crash", "reason": f"sweep: {_first_line(exc)}", "styles": {}}
        result["seconds"] = round(time.perf_counter() - start, 1)
        result["packtool"] = sys.modules["packtool"].__file__ if "packtool" in sys.modules else None  # which checkout
        print(MARK + json.dumps(result, default=str), flush=True)


# ---------------------------------------------------------------- the sweep (parent process)


def all_families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


class Worker:
    def __init__(self, variant: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--variant", variant],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )
        self.selector = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self.selector.register(self.proc.stdout, selectors.EVENT_READ)

    def run(self, family: str, timeout: float) -> dict[str, Any] | None:
        """The family's result, or None when it ran past `timeout` or the worker died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(family + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self.selector.select(left):
                return None
            line = self.proc.stdout.readline()
            if not line:
                return None
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])  # type: ignore[no-any-return]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def sweep(families: list[str], variant: str, timeout: float, echo: bool = True) -> list[dict[str, Any]]:
    results = []
    worker_ = Worker(variant)
    try:
        for family in families:
            start = time.perf_counter()
            result = worker_.run(family, timeout)
            if result is None:
                worker_.close()
                worker_ = Worker(variant)
                result = {"family": family, "verdict": "timeout", "styles": {},
                          "reason": f"no result within {timeout:.0f} s", "seconds": round(time.perf_counter() - start)}
            results.append(result)
            if echo:
                print(row(result), flush=True)
    finally:
        worker_.close()
    return results


def row(result: dict[str, Any]) -> str:
    return (f"| {result['family']} | {result.get('architecture', '-')} | {result['verdict']} | "
            f"{result.get('dtype', '-')} | {result.get('reason') or ''} | {result.get('seconds', '-')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help="model_types (default: every causal-LM family)")
    parser.add_argument("--variant", choices=("default", "bite"), default="default")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per family")
    parser.add_argument("--json", help="write every family's full result here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.variant)
        return
    families = args.families or all_families()
    print("| family | architecture | verdict | dtype | reason | s |\n|---|---|---|---|---|---|", flush=True)
    results = sweep(families, args.variant, args.timeout)
    counts: dict[str, int] = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    print("\n" + ", ".join(f"{v}: {n}" for v, n in sorted(counts.items())), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, default=str)
    sys.exit(1 if any(r["verdict"] in ("WRONG", "crash", "timeout") for r in results) else 0)


if __name__ == "__main__":
    main()
