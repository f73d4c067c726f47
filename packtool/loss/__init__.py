"""Losses over packed rows, each equal to computing every sequence alone (up to float rounding).

- `cross_entropy`: `packed_cross_entropy` / `count_targets`, next-token cross-entropy over a packed row
  (labels unshifted, segment boundaries masked from `cu_seqlens`; reductions token, sequence, sum,
  sequence_sum, none);
- `targets`: `IGNORE_INDEX`, `pair_targets` / `PairTargets` (which row predicts which target, both
  preference layouts);
- `pairs`: `pair_logps` / `PairLogps` (each pair's chosen and rejected log-prob sums), `pair_groups`;
- `dpo`: `dpo_loss` (TRL's sigmoid / hinge / ipo) for plain loops;
- `reward`: `pair_scores` / `PairScores` (a reward model's score at each sequence's last token, paired),
  `reward_loss` (TRL's `RewardTrainer` loss) for plain loops.

The import graph inside is one way: targets <- cross_entropy, targets <- pairs <- {dpo, reward}.
"""

from packtool.loss.cross_entropy import REDUCTIONS, count_targets, packed_cross_entropy
from packtool.loss.dpo import PAIR_LOSSES, dpo_loss
from packtool.loss.pairs import PairLogps, pair_groups, pair_logps
from packtool.loss.reward import PairScores, pair_scores, reward_loss
from packtool.loss.targets import IGNORE_INDEX, PairTargets, pair_targets

__all__ = [
    "IGNORE_INDEX",
    "PAIR_LOSSES",
    "REDUCTIONS",
    "PairLogps",
    "PairScores",
    "PairTargets",
    "count_targets",
    "dpo_loss",
    "packed_cross_entropy",
    "pair_groups",
    "pair_logps",
    "pair_scores",
    "pair_targets",
    "reward_loss",
]
