"""A mixture-of-experts model's router load-balancing loss over a packed row, as over the padded batch it stands for.

transformers' MoE causal LMs (Mixtral, Qwen2/3-MoE, OLMoE, gpt-oss, ...) return `aux_loss =
load_balancing_loss_func(router_logits, num_experts, num_experts_per_tok, attention_mask)`: the expert load
and router probability of each token averaged over the tokens the mask keeps (as weights), their product
summed. Over a packed row the model has no mask: the padding tail counts, and a shared prompt (`pack
--share-prompt`) counts once where a padded batch holds it in the chosen AND the rejected row. The loss is
not a sum over tokens (a product of two averages), so it cannot be corrected afterwards; it is computed again
from the row's router logits with the family's own function and the per-token weights of the padded batch
(`PaddedView.token_weight`: 0, 1 or 2), which is what the padded batch's mask gives, token for token.

Before trusting the family's function, the row's own `aux_loss` (no mask) is recomputed with it; a model whose
loss is something else is refused by name rather than approximated.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from packtool.errors import ConfigError

WHERE = "packtool.hf.dpo (router aux loss)"


def _core(model: Any) -> Any:
    """The transformers model under DDP / accelerate / PEFT wrappers."""
    seen = 0
    while seen < 8:
        seen += 1
        if hasattr(model, "get_base_model"):
            model = model.get_base_model()
        elif hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
            model = model.module
        else:
            break
    return model


def _refuse(model: Any, why: str) -> ConfigError:
    return ConfigError(
        f"{type(model).__name__}: {why}, {WHERE}, the router load-balancing loss of a packed row cannot be made "
        "equal to the padded batch's: set router_aux_loss_coef=0.0 in DPOConfig (or train on unpacked pairs)"
    )


def router_aux_loss(model: Any, out: Any, weights: torch.Tensor) -> torch.Tensor:
    """The padded batch's router load-balancing loss from a packed forward `out` (run with
    `output_router_logits=True`): `weights` `[T]` is how many padded rows hold each packed token."""
    core = _core(model)
    logits = getattr(out, "router_logits", None)
    if not isinstance(logits, tuple) or not logits:
        raise _refuse(core, "the forward returned no router_logits (a tuple per layer)")
    # the model's own class, or the one a wrapper subclassed (FSDP2's fully_shard makes `FSDP<Name>`)
    found = (getattr(sys.modules.get(cls.__module__), "load_balancing_loss_func", None) for cls in type(core).__mro__)
    balance = next((f for f in found if f is not None), None)
    experts = getattr(core, "num_experts", None)
    top_k = getattr(core, "num_experts_per_tok", None)
    if not callable(balance) or not isinstance(experts, int) or not isinstance(top_k, int):
        raise _refuse(
            core, "its module has no load_balancing_loss_func(router_logits, num_experts, num_experts_per_tok)"
        )
    total = weights.numel()
    for layer in logits:
        if not isinstance(layer, torch.Tensor) or layer.numel() != total * experts:
            shape = tuple(layer.shape) if isinstance(layer, torch.Tensor) else type(layer).__name__
            raise _refuse(core, f"a layer's router_logits {shape} is not one row of {experts} per token ({total})")
    own = getattr(out, "aux_loss", None)
    check = balance(logits, experts, top_k, None)
    if not isinstance(own, torch.Tensor) or not torch.allclose(
        torch.as_tensor(check, dtype=own.dtype, device=own.device), own, rtol=1e-5, atol=1e-7
    ):
        raise _refuse(core, "its aux_loss is not load_balancing_loss_func(router_logits, ...) of its module")
    mask = weights.to(device=logits[0].device, dtype=torch.float32).reshape(1, total)
    loss = balance(logits, experts, top_k, mask)
    return loss if isinstance(loss, torch.Tensor) else torch.as_tensor(loss, device=logits[0].device)
