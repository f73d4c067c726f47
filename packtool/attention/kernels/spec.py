"""The contract every attention kernel behind `varlen_attention` fills: import, capability, checks, adapter.

A kernel is one `KernelSpec`: where its function is imported from (nothing is imported until a
call needs it), the CUDA compute capabilities and dtypes it runs, an extra check of the loaded
function against one call (a head_dim limit, a keyword this release lacks), and the adapter that
turns a `Call` into the kernel's own arguments. `registry.KERNELS` orders them; `auto` takes the
first whose `unusable` is None. Adding a kernel = one module with its SPEC + one registry line.

Model features a kernel may lack are named in `FEATURES`, so a refusal names what the model
asked for (a sliding window, Gemma 2's softcapping, gpt-oss's sinks) rather than a keyword.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import torch

HALF = (torch.float16, torch.bfloat16)

#: feature -> how a user recognises it in a model
FEATURES = {
    "window": "sliding-window attention (config.sliding_window: Mistral, Qwen2/3, Gemma 2/3 local layers, gpt-oss)",
    "softcap": "attention logit softcapping (config.attn_logit_softcapping: Gemma 2)",
    "sinks": "attention sinks (gpt-oss)",
    "dropout": "attention dropout (config.attention_dropout > 0 while training)",
    "shared_prompt": "the shared-prompt layout (pack --share-prompt: a completion's queries against its prompt's "
    "keys and its own, causal aligned to the bottom right)",
    "varlen_kv": "keys of other lengths than the queries (a KV cache while generating)",
}


@dataclass(frozen=True)
class Needs:
    """What a call asks of a kernel, known before any kernel runs (`select_backend` decides on it)."""

    device: torch.device
    dtype: torch.dtype
    head_dim: int
    gqa: bool = False
    window: bool = False
    softcap: bool = False
    sinks: bool = False
    dropout: bool = False
    varlen_kv: bool = False
    shared_prompt: bool = False

    @classmethod
    def of(cls, q: torch.Tensor, **features: bool) -> Needs:
        return cls(q.device, q.dtype, int(q.shape[-1]), **features)

    def features(self) -> list[str]:
        """The model features this call uses, in `FEATURES` order."""
        return [name for name in FEATURES if getattr(self, name)]


@dataclass(frozen=True)
class Call:
    """One varlen attention call: `(tokens, heads, head_dim)` q/k/v and int32 `cu_*` on q's device.

    `window` is flash-attn's `(left, right)` (-1 = unbounded); causal attention is aligned to the
    bottom right when a segment has more keys than queries (the newest query sees every key).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    causal: bool = True
    scale: float | None = None
    window: tuple[int, int] = (-1, -1)
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    dropout: float = 0.0
    shared_prompt: bool = False  # the keys are a shared-prompt layout's (causal from the bottom right is vital)

    def needs(self) -> Needs:
        return Needs.of(
            self.q,
            gqa=self.k.shape[1] != self.q.shape[1],
            window=self.window != (-1, -1),
            softcap=self.softcap is not None,
            sinks=self.sinks is not None,
            dropout=self.dropout > 0,
            varlen_kv=self.cu_k is not self.cu_q,
            shared_prompt=self.shared_prompt,
        )


def _no_check(fn: Callable[..., Any], needs: Needs) -> str | None:
    return None


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: its name (an `AttentionBackend` value), import, capability, check and adapter.

    module/attr: where the kernel function is imported from; None for packtool's own code.
    compute: the CUDA major compute capabilities it runs on, (lowest, highest); None: any device.
    dtypes: the dtypes it takes; None: any.
    check: why the loaded function cannot serve `needs` (a feature this release lacks), or None.
    adapter: runs the call on the loaded function (a placeholder for packtool's own code).
    """

    name: str
    summary: str
    adapter: Callable[[Callable[..., Any], Call], Any]
    module: str | None = None
    attr: str | None = None
    compute: tuple[int, int] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    check: Callable[[Callable[..., Any], Needs], str | None] = _no_check

    @property
    def source(self) -> str:
        return f"{self.module}.{self.attr}" if self.module else "packtool"


@cache
def _import(module: str, attr: str) -> Callable[..., Any] | None:
    try:
        return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]
    except Exception:  # not installed, or built against another torch/CUDA
        return None


def load(spec: KernelSpec) -> Callable[..., Any] | None:
    """The kernel's function, or None when it cannot be imported here (packtool's own: a placeholder)."""
    if spec.module is None or spec.attr is None:
        return _no_check
    return _import(spec.module, spec.attr)


def capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of `device`, None off CUDA."""
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def unusable(spec: KernelSpec, needs: Needs) -> str | None:
    """Why `spec` cannot run a call with these needs (None when it can)."""
    fn = load(spec)
    if fn is None:
        return f"{spec.source} is not importable"
    if spec.compute is not None:
        cap = capability(needs.device)
        if cap is None:
            return f"needs CUDA tensors, got {needs.device.type}"
        low, high = spec.compute
        if not low <= cap[0] <= high:
            return f"not built for compute capability {cap[0]}.{cap[1]}"
    if spec.dtypes is not None and needs.dtype not in spec.dtypes:
        return f"needs {' or '.join(str(d).removeprefix('torch.') for d in spec.dtypes)}, got {needs.dtype}"
    return spec.check(fn, needs)


def run(spec: KernelSpec, call: Call) -> torch.Tensor:
    """Run a usable kernel (see `unusable`) on `call`."""
    fn = load(spec)
    if fn is None:
        raise RuntimeError(f"attention backend {spec.name} vanished after it was selected")
    out = spec.adapter(fn, call)
    return out[0] if isinstance(out, tuple) else out  # some flash-attn versions also return the LSE


@cache
def parameters(fn: Callable[..., Any]) -> frozenset[str] | None:
    """Names `fn` accepts, or None when it takes **kwargs (anything goes)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params)


def lacking(feature: str, why: str) -> str:
    """A refusal naming the model feature: '<kernel detail> (needed for <feature>)'."""
    return f"{why} (needed for {FEATURES[feature]})"
