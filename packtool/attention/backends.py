"""The kernels behind `varlen_attention`, imported lazily, and what each needs to run.

| backend  | function                                              | runs on                              |
|----------|-------------------------------------------------------|--------------------------------------|
| flash3   | `flash_attn_interface.flash_attn_varlen_func` (FA3)   | CUDA sm90 (Hopper), fp16/bf16        |
| flash4   | `flash_attn.cute.flash_attn_varlen_func` (FA4)        | CUDA sm90+, fp16/bf16                |
| flash2   | `flash_attn.flash_attn_varlen_func` (FA2)             | CUDA sm80+, fp16/bf16                |
| native   | `torch.nn.attention.varlen.varlen_attn` (torch≥2.10)  | CUDA sm80+, fp16/bf16, head_dim%8==0 ≤256 |
| fallback | exact SDPA per segment length (`fallback.py`)         | anything                             |

`auto` takes the first usable row. Importing packtool never imports any of them; a kernel that
fails to import (absent, or built against another torch or CUDA) counts as absent.

torch's `varlen_attn` changed between releases: 2.10 takes `is_causal`, 2.11 `window_size`
(`(-1, 0)` = causal) and `scale`, 2.13 also `enable_gqa`. The adapter reads the installed
signature: what it lacks is done around it (GQA by repeating k/v heads, a scale by rescaling q).
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable
from functools import cache
from typing import Any

import torch

FLASH = ("flash3", "flash4", "flash2")
"""flash-attn generations in `auto`'s order of preference."""

_IMPORTS = {
    "flash2": ("flash_attn", "flash_attn_varlen_func"),
    "flash3": ("flash_attn_interface", "flash_attn_varlen_func"),
    "flash4": ("flash_attn.cute", "flash_attn_varlen_func"),
    "native": ("torch.nn.attention.varlen", "varlen_attn"),
}
_MAJOR = {"flash2": (8, 99), "flash3": (9, 9), "flash4": (9, 99), "native": (8, 99)}  # compute capability


@cache
def load(name: str) -> Callable[..., Any] | None:
    """The backend's function, or None when it cannot be imported here."""
    module, attr = _IMPORTS[name]
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except Exception:  # not installed, or built against another torch/CUDA
        return None


def capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of `device`, None off CUDA."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def unusable(name: str, q: torch.Tensor) -> str | None:
    """Why backend `name` cannot run on `q` (None when it can)."""
    if name == "fallback":
        return None
    if load(name) is None:
        return f"{_IMPORTS[name][0]}.{_IMPORTS[name][1]} is not importable"
    cap = capability(q.device)
    if cap is None:
        return f"needs CUDA tensors, got {q.device.type}"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"needs float16 or bfloat16, got {q.dtype}"
    low, high = _MAJOR[name]
    if not low <= cap[0] <= high:
        return f"not built for compute capability {cap[0]}.{cap[1]}"
    if name == "native" and (q.shape[-1] % 8 or q.shape[-1] > 256):
        return f"head_dim {q.shape[-1]} is not a multiple of 8 up to 256"
    return None


@cache
def parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Names `fn` accepts, or None when it takes **kwargs (anything goes)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


def run(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """Call backend `name` (usable, see `unusable`) with int32 `cu` on q's device."""
    fn = load(name)
    if fn is None:
        raise RuntimeError(f"attention backend {name} vanished after it was selected")
    out = (_native if name == "native" else _flash)(fn, q, k, v, cu, max_seqlen, causal, scale)
    return out[0] if isinstance(out, tuple) else out  # some flash-attn versions also return the LSE


def _flash(
    fn: Callable[..., Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float | None,
) -> Any:
    """FA2/FA3/FA4 share these keyword names; GQA is native to all three."""
    kwargs: dict[str, Any] = {
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": max_seqlen,
        "max_seqlen_k": max_seqlen,
        "softmax_scale": scale,
        "causal": causal,
    }
    accepted = parameters(fn)
    if accepted is not None:
        kwargs = {key: val for key, val in kwargs.items() if key in accepted}
    return fn(q, k, v, **kwargs)


def _native(
    fn: Callable[..., Any],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: torch.Tensor,
    max_seqlen: int,
    causal: bool,
    scale: float | None,
) -> Any:
    accepted = parameters(fn)
    if accepted is None:  # a wrapper taking **kwargs: assume the current (2.13) keywords
        accepted = frozenset({"window_size", "scale", "enable_gqa"})
    kwargs: dict[str, Any] = {}
    if "window_size" in accepted:  # torch >= 2.11: (-1, 0) is causal, (-1, -1) full
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    elif "is_causal" in accepted:  # torch 2.10
        kwargs["is_causal"] = causal
    elif causal:
        raise RuntimeError("this torch's varlen_attn takes neither window_size nor is_causal")
    if scale is not None:
        if "scale" in accepted:
            kwargs["scale"] = scale
        else:  # the kernel's own scale is 1/sqrt(head_dim)
            q = q * (scale * math.sqrt(q.shape[-1]))
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in accepted:
            kwargs["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return fn(q, k, v, cu, cu, max_seqlen, max_seqlen, **kwargs)
