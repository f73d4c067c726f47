"""Run the same documents packed and each alone through a tiny model: max |Δ| of logits and gradients.

The batches are the ones packtool emits (`PackedCollator` over one-document items, or two-document
rows), so the audit checks the keys a training loop will really pass. Gradients are those of the
sum of the per-document losses (summed next-token cross-entropy inside each document), packed vs
each document alone, over every parameter. Packed batches run with `use_cache=False` (what a
training step needs: transformers detects packed `position_ids` only without a KV cache); the audit
re-runs its recommendation with `use_cache=True` to show what a config left at its default does.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packtool.loader.collator import PackedCollator
from packtool.loader.padded import PaddedCollator

#: the probe's documents: longer than the tiny sliding window (4) and straddling SSM chunks (8)
DOC_LENGTHS = (9, 7, 12, 4)
#: `[B, N]` rows: documents 0+1 and 2+3 (16 tokens each)
ROWS = ((0, 1), (2, 3))

FLAT_KEYS = ("input_ids", "position_ids")
CU_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
#: style -> (flattened?, keys passed to model(**batch))
STYLES: dict[str, tuple[bool, tuple[str, ...]]] = {
    "flat_position_ids": (True, FLAT_KEYS),
    "flat_cu_seq_lens": (True, FLAT_KEYS + CU_KEYS),
    "flat_seq_idx": (True, (*FLAT_KEYS, "seq_idx")),
    "flat_cu_seq_lens_seq_idx": (True, (*FLAT_KEYS, *CU_KEYS, "seq_idx")),
    "rows_position_ids": (False, FLAT_KEYS),
}
#: implementation -> dtype it runs in on CPU (flex_attention fails in float64 on CPU)
IMPLEMENTATIONS: dict[str, torch.dtype] = {
    "packtool": torch.float64,  # `import packtool.hf`: varlen_attention (the exact fallback on CPU)
    "eager": torch.float64,
    "sdpa": torch.float64,
    "flex_attention": torch.float32,
    "flash_attention_2": torch.bfloat16,
    "flash_attention_3": torch.bfloat16,
}
#: implementations without a CPU backward: checked forward only (logits), gradients reported as None
FORWARD_ONLY = frozenset({"flex_attention"})
#: relative tolerance (of the reference's largest |value|) per run dtype. float64 runs allow 1e-6, about
#: ten float32 roundings, because some kernels compute in float32 inside a float64 model (eager's
#: softmax, some norms); every leak measured on the families in docs/AUDIT.md is >= 1e-2 relative.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Measurement:
    style: str
    attn_implementation: str
    dtype: str
    max_abs_diff_logits: float | None
    max_abs_diff_grads: float | None
    tolerance_logits: float | None
    tolerance_grads: float | None
    verdict: str  # exact | leaks | unsupported
    reason: str | None = None


def unavailable_reason(impl: str) -> str | None:
    """Why `impl` cannot run here, or None when it can ("packtool" is registered with transformers here)."""
    if impl == "packtool":
        try:
            importlib.import_module("packtool.hf")
        except Exception as exc:  # noqa: BLE001 - a transformers too old for the interfaces, say
            return f"packtool.hf cannot register with this transformers: {first_line(exc)}"
        return None
    if impl == "flex_attention" and importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return f"torch {torch.__version__} has no flex_attention"
    if impl.startswith("flash_attention"):
        package = "flash_attn" if impl == "flash_attention_2" else "flash_attn_interface"
        if importlib.util.find_spec(package) is None:
            return f"{package} is not installed (needs CUDA)"
        return "flash kernels run on CUDA in half precision only; this audit runs on CPU"
    return None


def documents(vocab: int, seed: int) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(0, vocab, n, dtype=np.int64)) for n in DOC_LENGTHS]


def build_batch(docs: Sequence[torch.Tensor], style: str) -> dict[str, Any]:
    """The batch `PackedCollator` emits for this style, filtered to the keys the style passes."""
    flat, keys = STYLES[style]
    groups = [(i,) for i in range(len(docs))] if flat else list(ROWS)
    items = []
    for group in groups:
        parts = [docs[i] for i in group]
        lens = [int(p.numel()) for p in parts]
        ids = torch.cat(parts)
        items.append(
            {
                "input_ids": ids,
                "labels": ids.clone(),
                "position_ids": torch.cat([torch.arange(n) for n in lens]),
                "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32),
            }
        )
    return PackedCollator(flatten=flat, seq_idx=True, keys=keys)(items)


def build_padded(docs: Sequence[torch.Tensor]) -> dict[str, Any]:
    """The fallback: `PaddedCollator`'s right-padded `[B, L]` batch (one document per row, attention_mask)."""
    items = [{"input_ids": d, "labels": d.clone()} for d in docs]
    batch = PaddedCollator(pad_id=0)(items)
    return {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}


def _doc_loss(logits: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1].to(torch.float64), doc[1:], reduction="sum")


def _params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _grads(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


Outputs = tuple[torch.Tensor, list[torch.Tensor] | None]


def reference(model: torch.nn.Module, docs: Sequence[torch.Tensor], backward: bool = True) -> Outputs:
    """Each document alone: concatenated logits `[T, V]` and the gradients of the summed losses."""
    with torch.set_grad_enabled(backward):
        logits = [model(input_ids=d[None]).logits[0] for d in docs]
    if not backward:
        return torch.cat(logits), None
    loss = sum((_doc_loss(lg, d) for lg, d in zip(logits, docs, strict=True)), torch.zeros((), dtype=torch.float64))
    return torch.cat(logits).detach(), _grads(loss, _params(model))


def packed(
    model: torch.nn.Module, docs: Sequence[torch.Tensor], batch: dict[str, Any], backward: bool = True
) -> Outputs:
    """The packed batch: logits `[T, V]` in document order and the gradients of the same summed losses."""
    with torch.set_grad_enabled(backward):
        logits = model(**{"use_cache": False, **batch}).logits  # a KV cache turns packed detection off
    logits = logits.reshape(-1, logits.shape[-1])
    if "attention_mask" in batch:  # padded rows: the real tokens, in document order
        logits = logits[batch["attention_mask"].reshape(-1).bool()]
    if not backward:
        return logits, None
    bounds = np.concatenate([[0], np.cumsum([int(d.numel()) for d in docs])])
    loss = sum(
        (_doc_loss(logits[a:b], d) for a, b, d in zip(bounds[:-1], bounds[1:], docs, strict=True)),
        torch.zeros((), dtype=torch.float64),
    )
    return logits.detach(), _grads(loss, _params(model))


def compare(
    ref: Outputs, got: Outputs, dtype: torch.dtype
) -> tuple[float, float | None, float, float | None, str, str | None]:
    """(Δ logits, Δ grads, tolerance logits, tolerance grads, verdict, reason); grads None when forward only."""
    (ref_logits, ref_grads), (logits, grads) = ref, got
    d_logits = float((logits.to(torch.float64) - ref_logits.to(torch.float64)).abs().max())
    tol_l = TOLERANCE[dtype] * max(float(ref_logits.abs().max()), 1e-30)
    d_grads = tol_g = None
    ok = d_logits <= tol_l
    if grads is not None and ref_grads is not None:
        pairs = zip(grads, ref_grads, strict=True)
        d_grads = max(float((g.to(torch.float64) - r.to(torch.float64)).abs().max()) for g, r in pairs)
        tol_g = TOLERANCE[dtype] * max(max(float(r.abs().max()) for r in ref_grads), 1e-30)
        ok = ok and d_grads <= tol_g
    if not np.isfinite(d_logits) or (d_grads is not None and not np.isfinite(d_grads)):
        return d_logits, d_grads, tol_l, tol_g, "unsupported", "non-finite outputs"
    reason = None if grads is not None else "forward only: no backward for this implementation on CPU"
    return d_logits, d_grads, tol_l, tol_g, "exact" if ok else "leaks", reason


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:240] if text else ''}"
