"""`dpo_loss`: TRL 1.16's sigmoid / hinge / ipo DPO loss from policy and reference `pair_logps`, for plain loops.

Every TRL loss type runs through TRL itself: `packtool.hf.dpo.PackedDPOTrainer`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from packtool.errors import ConfigError
from packtool.loss.pairs import PairLogps

PAIR_LOSSES = ("sigmoid", "hinge", "ipo")


def dpo_loss(
    policy: PairLogps,
    reference: PairLogps,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    reduction: str = "mean",
) -> torch.Tensor:
    """DPO loss of a batch's pairs, as TRL 1.16 computes it (`loss_type` sigmoid, hinge or ipo).

    `policy` / `reference`: `pair_logps` of the same batch under the trained and the reference
    model (the reference without gradients). sigmoid: `-logsigmoid(beta * delta)`, with
    `label_smoothing` (cDPO) `-(1-e) logsigmoid(beta d) - e logsigmoid(-beta d)`; hinge:
    `relu(1 - beta * delta)`; ipo: `(delta_avg - 1/(2 beta))^2` with each log-ratio divided by
    its token count (TRL's normalisation). `reduction` "mean" (TRL's) or "none" (per pair).
    For every TRL loss type use the TRL recipe (`packtool.hf.dpo`).
    """
    if loss_type not in PAIR_LOSSES:
        raise ConfigError(
            f"unknown loss_type {loss_type!r}, dpo_loss, use one of {', '.join(PAIR_LOSSES)} "
            "(every TRL loss type: packtool.hf.dpo.PackedDPOTrainer)"
        )
    if reduction not in ("mean", "none"):
        raise ConfigError(f"unknown reduction {reduction!r}, dpo_loss, use mean or none")
    if policy.pair_ids.shape != reference.pair_ids.shape or not torch.equal(
        policy.pair_ids.cpu(), reference.pair_ids.cpu()
    ):
        raise ConfigError(
            "policy and reference pair_logps are for different pairs, dpo_loss, compute both from the same batch"
        )
    ref_c = reference.chosen.to(policy.chosen.device, policy.chosen.dtype)
    ref_r = reference.rejected.to(policy.rejected.device, policy.rejected.dtype)
    chosen_ratio = policy.chosen - ref_c
    rejected_ratio = policy.rejected - ref_r
    if loss_type == "ipo":
        c = chosen_ratio / policy.chosen_tokens.clamp(min=1).to(chosen_ratio)
        r = rejected_ratio / policy.rejected_tokens.clamp(min=1).to(rejected_ratio)
        losses = (c - r - 1 / (2 * beta)) ** 2
    else:
        delta = beta * (chosen_ratio - rejected_ratio)
        if loss_type == "hinge":
            losses = torch.relu(1 - delta)
        else:
            losses = -F.logsigmoid(delta) * (1 - label_smoothing) - F.logsigmoid(-delta) * label_smoothing
    return losses.mean() if reduction == "mean" else losses
