"""`import packtool.hf` registers `attn_implementation="packtool"` with transformers.

    import packtool.hf
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="packtool")

Every decoder that takes an attention function then attends through `varlen_attention`: packed
batches (`cu_seq_lens_q/_k` from `PackedCollator(keys=HF_KEYS)` or TRL's `padding_free`, or
restarting `position_ids` alone), padded batches (a 2-D `attention_mask`: unpad, attend, re-pad),
plain batches and generation with a KV cache; GQA, sliding windows, softcapping, sinks and
attention dropout each on a kernel that has them (flash-attn, torch's native varlen kernel, the
exact fallback), equal to eager attention per document (tests/test_hf.py). `register(name,
backend)` adds another name bound to one kernel, e.g. `register("packtool_fallback", "fallback")`.

Torch side, needs transformers; `import packtool` never imports it.
"""

from __future__ import annotations

import functools
from typing import Any

from packtool.choices import AttentionBackend
from packtool.errors import ConfigError
from packtool.hf.attention import attention_forward
from packtool.hf.mask import padding_mask
from packtool.hf.shared_prompt import guard_causal_lm_loss

NAME = "packtool"
"""The `attn_implementation` name `import packtool.hf` registers (backend `auto`)."""


def register(name: str = NAME, backend: str | AttentionBackend = "auto") -> str:
    """Register `attn_implementation=name` (its attention function and its mask) with transformers; returns name."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as exc:
        raise ConfigError(
            f"packtool.hf needs transformers ({exc}), packtool.hf.register, pip install 'packtool[audit]'"
        ) from exc
    _check_name(name, AttentionInterface)
    try:
        choice = AttentionBackend("fallback" if backend == "torch" else backend)
    except ValueError:
        names = ", ".join(b.value for b in AttentionBackend)
        raise ConfigError(f"unknown attention backend {backend!r}, packtool.hf.register, use one of {names}") from None

    @functools.wraps(attention_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return attention_forward(*args, backend=choice, **kwargs)

    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, padding_mask)
    return name


def _check_name(name: str, interface: Any) -> None:
    """Refuse a name transformers would read as something else (its rules in 5.23: `"flash" in name` asks for
    flash-attention's checks and kernels, `org/repo` a hub kernel, a `paged|` prefix is stripped), or one of its own."""
    why = None
    if not isinstance(name, str) or not name:
        why = "is not a non-empty string"
    elif "flash" in name:
        why = "holds 'flash', which transformers reads as a request for flash-attention"
    elif "/" in name or ":" in name:
        why = "looks like a hub kernel ('org/repo'), which transformers downloads"
    elif name.startswith("paged|"):
        why = "starts with 'paged|', which transformers strips"
    elif name in ("eager", "sdpa", "flex_attention") or name in getattr(interface, "_global_mapping", {}):
        ours = getattr(interface._global_mapping.get(name), "__wrapped__", None) is attention_forward
        why = None if ours else "is one of transformers' own attention implementations"
    if why is not None:
        raise ConfigError(
            f"attention name {name!r} {why}, packtool.hf.register, pick another name, e.g. 'packtool_fallback'"
        )


register()
guard_causal_lm_loss()

__all__ = ["NAME", "attention_forward", "padding_mask", "register"]
