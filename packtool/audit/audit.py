"""`audit_model`: is packing exact for THIS architecture, under which batch style and attention kernel?

Packing is exact only when every layer keeps documents apart: attention through a document mask
(transformers derives it from restarting `position_ids`, or flash kernels from `cu_seq_lens_*`),
convolutions, linear attention and state-space scans through `seq_idx`/`cu_seqlens`, which their
pure-PyTorch fallbacks may not honour. Nothing in a config says which case a model is in, so the
audit measures it: the model's architecture, tiny and with random weights, runs the same documents
packed and each alone, forward and backward, for every batch style packtool emits and every
attention implementation present (float64 where it runs, float32 for flex_attention).
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from packtool.audit import probe
from packtool.audit.source import code_note, load_model, offline, require_transformers, transformers_quiet
from packtool.audit.tiny import check_size, tiny_config_dict
from packtool.errors import InputError, UsageError

#: simplest keys first: the recommendation is the first exact (style, implementation)
STYLE_ORDER = tuple(probe.STYLES)
IMPL_ORDER = ("flash_attention_3", "flash_attention_2", "packtool", "sdpa", "flex_attention", "eager")
#: a config field that marks a mixer -> the CUDA kernels that keep packed documents apart in it
KERNELS = {
    "linear_num_key_heads": "flash-linear-attention and causal-conv1d",  # gated delta net
    "mamba_d_state": "mamba-ssm and causal-conv1d",
    "ssm_state_size": "mamba-ssm and causal-conv1d",
    "state_size": "mamba-ssm and causal-conv1d",
    "conv_L_cache": "causal-conv1d",  # LFM2 short convolutions
}


@dataclass(frozen=True)
class AuditConfig:
    """What `packtool audit` runs.

    model: a transformers model directory, a config.json, or an `org/name` in the local hub cache.
    trust_remote_code: allow a config whose model_type the installed transformers does not know to
        load its own code (from disk only); off unless the user passes it.
    implementations: attention implementations to try (empty: every one packtool knows; those not
        present here are reported `unsupported`).
    seed: random weights and documents.
    """

    model: str
    trust_remote_code: bool = False
    implementations: tuple[str, ...] = ()
    seed: int = 0

    def validate(self) -> AuditConfig:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise UsageError(f"--seed must be an integer from 0 to 2**63-1, got {self.seed!r}, pass e.g. --seed 0")
        unknown = sorted(set(self.implementations) - set(probe.IMPLEMENTATIONS))
        if unknown:
            raise UsageError(
                f"--attn-implementation {unknown[0]!r} is not an attention implementation packtool audits, "
                f"use some of {', '.join(probe.IMPLEMENTATIONS)}"
            )
        return self


@dataclass(frozen=True)
class AuditReport:
    model: str
    model_type: str
    architecture: str
    layer_kinds: list[str]
    tiny: dict[str, Any]
    results: list[probe.Measurement]
    recommended: dict[str, Any] | None
    needs_seq_idx: bool
    advice: str
    keys: list[str] = field(default_factory=list)
    #: the recommended setup re-run with `use_cache=True` (forward): transformers skips packed-sequence
    #: detection when it builds a KV cache, so a config left at `use_cache: true` leaks
    use_cache_check: dict[str, Any] | None = None
    #: the fallback measured: `PaddedCollator` batches (right padding + attention_mask), first implementation
    padded_check: dict[str, Any] | None = None
    #: whose code was audited when config.json's `auto_map` names the model's own (None: no auto_map)
    code: str | None = None
    #: the probe's document lengths when they are not probe.DOC_LENGTHS (a vision-language audit's documents)
    lengths: list[int] | None = None

    @property
    def exact(self) -> bool:
        return self.recommended is not None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["results"] = [asdict(r) for r in self.results]
        out["documents"] = list(self.lengths or probe.DOC_LENGTHS)
        out.pop("lengths")
        return out


def audit_model(config: AuditConfig) -> AuditReport:
    """Measure packed vs separate documents on `config.model`'s architecture (tiny, CPU), never reaching the network."""
    config.validate()
    with offline(), transformers_quiet():
        return _measure(config)


def _measure(config: AuditConfig) -> AuditReport:
    transformers = require_transformers()
    source = load_model(config.model, config.trust_remote_code)
    if source.vision:
        return _measure_vision(transformers, source, config)
    text_config = source.config
    tiny, tiny_dict, kept = _tiny(transformers, text_config, source, config)
    docs = probe.documents(int(tiny.vocab_size), config.seed)
    results: list[probe.Measurement] = []
    models: dict[str, Any] = {}
    impls = tuple(dict.fromkeys(config.implementations)) or tuple(probe.IMPLEMENTATIONS)  # each once
    with _flex_mask_reference() if "flex_attention" in impls else contextlib.nullcontext():
        for impl in impls:
            _run_implementation(transformers, tiny, impl, docs, config, results, models)
    kinds = sorted(
        {str(k) for k in getattr(tiny, "layer_types", None) or getattr(tiny, "layers_block_type", None) or []}
    )
    recommended = _recommend(results)
    needs = _needs_seq_idx(results)
    cache = _use_cache_check(models, docs, recommended)
    padded = _padded_check(models, docs)
    summary: dict[str, Any] = {
        k: tiny_dict.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in tiny_dict
    }
    return AuditReport(
        model=config.model,
        model_type=str(text_config.model_type),
        architecture=type(next(iter(models.values()))).__name__ if models else "",
        layer_kinds=kinds,
        tiny={**summary, "kept_layers": kept},
        results=results,
        recommended=recommended,
        needs_seq_idx=needs,
        advice=_advice(recommended, needs, results, tiny_dict, cache, padded),
        keys=list(probe.STYLES[recommended["style"]][1]) if recommended else [],
        use_cache_check=cache,
        padded_check=padded,
        code=code_note(source, type(next(iter(models.values()))) if models else None),
    )


def _measure_vision(transformers: Any, source: Any, config: AuditConfig) -> AuditReport:
    """A vision-language model (`vision.py`): its documents hold images; packed vs alone per implementation."""
    from packtool.audit import vision

    impls = tuple(dict.fromkeys(config.implementations)) or tuple(probe.IMPLEMENTATIONS)
    got = vision.measure(transformers, source.config, impls, config.seed, _flex_mask_reference)
    results, text = got["results"], got["text"]
    kinds = sorted({str(k) for k in text.get("layer_types") or []})
    recommended = _recommend(results)
    summary = {k: text.get(k) for k in ("hidden_size", "num_hidden_layers", "vocab_size") if k in text}
    return AuditReport(
        model=config.model,
        model_type=str(source.config.model_type),
        architecture=got["architecture"],
        layer_kinds=kinds,
        tiny={**summary, "kept_layers": got["kept"], "images": got["images"]},
        results=results,
        recommended=recommended,
        needs_seq_idx=False,
        advice=vision.advice(recommended, results, vision.batch_keys(source.config)),
        keys=[*probe.STYLES[recommended["style"]][1], *vision.batch_keys(source.config)] if recommended else [],
        lengths=got["lengths"],
    )


def _tiny(
    transformers: Any, text_config: Any, source: Any, config: AuditConfig
) -> tuple[Any, dict[str, Any], list[int]]:
    """The shrunk config (`tiny.py`), its dict and kept layers; refused when its model (counted on the meta
    device, nothing allocated) is still large."""
    try:
        tiny_dict, kept = tiny_config_dict(text_config.to_dict(), dict(getattr(type(text_config), "attribute_map", {})))
        tiny = type(text_config).from_dict(tiny_dict)
        tiny.name_or_path = text_config.name_or_path  # where the model's own code (auto_map) is found
    except Exception as exc:  # noqa: BLE001 - the config class validating the shrunk dict (strict dataclasses)
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())  # strict dataclasses put the reason on line 2
        raise InputError(
            f"cannot shrink the config to a tiny model ({detail[:240]})",
            str(source.path),
            hint="check config.json's per-layer fields (layer types, index lists); if they are right, the audit "
            "does not support this architecture's layout yet",
        ) from None
    try:
        with torch.device("meta"):
            shape = transformers.AutoModelForCausalLM.from_config(tiny, trust_remote_code=config.trust_remote_code)
    except Exception:  # noqa: BLE001 - a model that cannot be built is reported per implementation below
        shape = None
    if shape is not None:
        check_size(shape)
    return tiny, tiny_dict, kept


def _padded_check(models: dict[str, Any], docs: list[torch.Tensor]) -> dict[str, Any] | None:
    """The padded fallback under the first implementation that ran (sdpa before eager)."""
    impl = next((i for i in IMPL_ORDER if i in models and i not in probe.FORWARD_ONLY), None)
    if impl is None:
        return None
    model = models[impl]
    dtype = next(model.parameters()).dtype
    out: dict[str, Any] = {"style": "padded", "attn_implementation": impl}
    try:
        ref = probe.reference(model, docs)
        got = probe.packed(model, docs, probe.build_padded(docs))
    except Exception as exc:  # noqa: BLE001
        return {**out, "verdict": "unsupported", "reason": probe.first_line(exc)}
    dl, dg, _, _, verdict, _ = probe.compare(ref, got, dtype)
    return {**out, "max_abs_diff_logits": dl, "max_abs_diff_grads": dg, "verdict": verdict}


def _use_cache_check(
    models: dict[str, Any], docs: list[torch.Tensor], recommended: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The recommended setup with `use_cache=True` passed, forward only: exact or leaking?"""
    if recommended is None or recommended["attn_implementation"] not in models:
        return None
    style, impl = recommended["style"], recommended["attn_implementation"]
    model = models[impl]
    dtype = next(model.parameters()).dtype
    out: dict[str, Any] = {"use_cache": True, "style": style, "attn_implementation": impl}
    try:
        ref = probe.reference(model, docs, backward=False)
        got = probe.packed(model, docs, {**probe.build_batch(docs, style), "use_cache": True}, backward=False)
    except Exception as exc:  # noqa: BLE001
        return {**out, "max_abs_diff_logits": None, "verdict": "unsupported", "reason": probe.first_line(exc)}
    d_logits, _, _, _, verdict, _ = probe.compare(ref, got, dtype)
    return {**out, "max_abs_diff_logits": d_logits, "verdict": verdict}


def _run_implementation(
    transformers: Any,
    tiny: Any,
    impl: str,
    docs: list[torch.Tensor],
    config: AuditConfig,
    results: list[probe.Measurement],
    models: dict[str, Any],
) -> None:
    """Every batch style under one attention implementation, appended to `results`."""
    dtype = probe.IMPLEMENTATIONS[impl]
    backward = impl not in probe.FORWARD_ONLY
    missing = probe.unavailable_reason(impl)
    model = None
    # float64 where the implementation runs in it, else float32 (e.g. a kernel that has no float64)
    candidates = [] if missing is not None else [dtype, torch.float32] if dtype == torch.float64 else [dtype]
    for candidate in candidates:
        try:
            torch.manual_seed(config.seed)
            model = transformers.AutoModelForCausalLM.from_config(
                copy.deepcopy(tiny),  # the model keeps its config: a shared one would take the next impl's name
                attn_implementation=impl,
                experts_implementation="eager",  # grouped_mm kernels have no float64
                dtype=candidate,
                trust_remote_code=config.trust_remote_code,
            ).eval()
            ref = probe.reference(model, docs, backward)
            models[impl], dtype, missing = model, candidate, None
            break
        except Exception as exc:  # noqa: BLE001 - any failure of a third-party kernel is a verdict
            model, missing = None, probe.first_line(exc)
    for style in probe.STYLES:
        if model is None:
            results.append(probe.Measurement(style, impl, _name(dtype), None, None, None, None, "unsupported", missing))
            continue
        try:
            got = probe.packed(model, docs, probe.build_batch(docs, style), backward)
        except Exception as exc:  # noqa: BLE001
            results.append(
                probe.Measurement(
                    style, impl, _name(dtype), None, None, None, None, "unsupported", probe.first_line(exc)
                )
            )
            continue
        dl, dg, tl, tg, verdict, reason = probe.compare(ref, got, dtype)
        results.append(probe.Measurement(style, impl, _name(dtype), dl, dg, tl, tg, verdict, reason))


@contextlib.contextmanager
def _flex_mask_reference() -> Iterator[None]:
    """Run transformers' flex_attention path (its real BlockMask) through the reference flex math.

    transformers compiles `flex_attention` with inductor on first use: about a minute of C++ builds on
    a CPU, per shape, for a kernel that is not the GPU one anyway. What decides packing is the mask,
    so during the audit its compiled singleton is the `aot_eager` build (the reference math), and
    the previous state is restored afterwards. Without that singleton the default path runs.
    """
    try:
        from torch.nn.attention.flex_attention import flex_attention
        from transformers.integrations import flex_attention as hf_flex
    except ImportError:
        yield
        return
    wrapper_cls = getattr(hf_flex, "WrappedFlexAttention", None)
    if wrapper_cls is None or not hasattr(wrapper_cls, "_compiled_flex_attention"):
        yield
        return
    wrapper = wrapper_cls(False)
    saved = {
        k: wrapper.__dict__[k]
        for k in ("_compiled_flex_attention", "_is_flex_compiled", "training")
        if k in wrapper.__dict__
    }
    wrapper._compiled_flex_attention = torch.compile(flex_attention, backend="aot_eager")
    wrapper._is_flex_compiled, wrapper.training = True, False
    try:
        yield
    finally:
        for key in ("_compiled_flex_attention", "_is_flex_compiled", "training"):
            wrapper.__dict__.pop(key, None)
        wrapper.__dict__.update(saved)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _recommend(results: list[probe.Measurement]) -> dict[str, Any] | None:
    exact = {(r.style, r.attn_implementation) for r in results if r.verdict == "exact"}
    for style in STYLE_ORDER:
        for impl in IMPL_ORDER:
            if (style, impl) in exact:
                return {"style": style, "attn_implementation": impl}
    return None


def _needs_seq_idx(results: list[probe.Measurement]) -> bool:
    """True when some implementation is exact only with `seq_idx` in the batch."""
    by = {(r.style, r.attn_implementation): r.verdict for r in results}
    impls = {r.attn_implementation for r in results}
    for impl in impls:
        with_idx = any(by.get((s, impl)) == "exact" for s in probe.STYLES if "seq_idx" in s)
        without = any(by.get((s, impl)) == "exact" for s in probe.STYLES if "seq_idx" not in s)
        if with_idx and not without:
            return True
    return False


def _advice(
    recommended: dict[str, Any] | None,
    needs: bool,
    results: list[probe.Measurement],
    tiny_config: dict[str, Any],
    cache: dict[str, Any] | None = None,
    padded: dict[str, Any] | None = None,
) -> str:
    if recommended is not None:
        style, impl = recommended["style"], recommended["attn_implementation"]
        flat = probe.STYLES[style][0]
        keys = probe.STYLES[style][1]
        call = f"PackedCollator(flatten={flat}{', seq_idx=True' if 'seq_idx' in keys else ''}, keys={keys})"
        extra = " (this model needs seq_idx)" if needs else ""
        text = f"packing is exact with {style} under attn_implementation={impl!r}{extra}: build batches with {call}"
        if impl == "packtool":
            text += " (`import packtool.hf` registers it: varlen kernels, no T×T mask, exact with use_cache too)"
        if cache is not None and cache["verdict"] == "leaks":
            text += (
                f"; and turn the KV cache off (model.config.use_cache = False, or model(**batch, use_cache=False)): "
                f"with use_cache=True transformers skips packed-sequence detection and the documents leak "
                f"(max |Δ| logits {cache['max_abs_diff_logits']:.1e})"
            )
        return text
    if not any(r.verdict == "leaks" for r in results):  # nothing ran: no evidence of a leak either
        reason = next((r.reason for r in results if r.reason), "no reason given")
        return (
            "nothing could be measured: no batch style ran under the attention implementations present "
            f"(first reason: {reason}), so the audit cannot tell whether packing is exact for this model; "
            "fix what the reasons name or try another --attn-implementation, and re-run the audit"
        )
    named = sorted({m.group(1) for r in results if r.reason for m in [re.search(r"without `([^`]+)`", r.reason)] if m})
    kernels = sorted({v for k, v in KERNELS.items() if tiny_config.get(k) is not None})
    need = " / ".join(kernels) or ", ".join(named) or "kernels that honour cu_seqlens or seq_idx"
    measured = ""
    if padded is not None and padded.get("max_abs_diff_logits") is not None:
        measured = f" ({padded['verdict']} under {padded['attn_implementation']}: max |Δ| logits {padded['max_abs_diff_logits']:.1e})"
    return (
        "this model cannot be packed exactly on the kernels present (packed documents leak into each other): "
        "train with padded dynamic batches, packtool.loader.DynamicBatchSampler(ds, max_tokens, padded=True) + "
        f"PaddedCollator{measured}, or install the CUDA kernels it needs ({need}) and re-run the audit"
    )
