"""Reference log-probs saved beside preference packs (`precompute_ref_log_probs=True`, then `save_to_disk`).

`PackedDPOTrainer` adds four columns to a packs dataset, one entry per pack: `ref_chosen_logps` and
`ref_rejected_logps` (a list per pack, its pairs in order of first appearance), `ref_pair_ids` (the pair id
of each entry, so a batch can check that the numbers are its pairs') and `ref_ld_alpha` (the `ld_alpha` the
sums were weighted with; TRL weights the reference as the policy). A later run on the saved dataset with no
`ref_model` uses them as they are: the model it is given then is a trained policy, not the reference.

Refused by name: columns that do not match the packs (another count or other pair ids in a pack), sums made
with another `ld_alpha`, half the columns, and saved columns with `precompute_ref_log_probs=False` and no
`ref_model` (TRL would take the policy as the reference and ignore them).
"""

from __future__ import annotations

from typing import Any

import torch

from packtool.errors import ConfigError

#: columns PackedDPOTrainer adds with precompute_ref_log_probs=True (one list per pack, its pairs in order)
REF_KEYS = ("ref_chosen_logps", "ref_rejected_logps")
#: what says which pairs (and which ld_alpha) the saved sums belong to
MATCH_KEYS = ("ref_pair_ids", "ref_ld_alpha")
WHERE = "packtool.hf.dpo (reference log-probs)"


def columns(dataset: Any) -> list[str]:
    names = getattr(dataset, "column_names", None)
    return list(names) if isinstance(names, list) else []


def has_saved(dataset: Any, name: str) -> bool:
    """Whether `dataset` carries saved reference log-probs (both columns); half of them is refused."""
    present = [k for k in REF_KEYS if k in columns(dataset)]
    if present and len(present) != len(REF_KEYS):
        raise ConfigError(
            f"the {name} dataset has {present[0]} but not {[k for k in REF_KEYS if k not in present][0]}, {WHERE}, "
            f"keep both columns of precompute_ref_log_probs=True or remove them (dataset.remove_columns)"
        )
    return bool(present)


def check_saved(dataset: Any, name: str, ld_alpha: float | None) -> None:
    """Refuse saved sums made with another `ld_alpha` (sums saved before `ref_ld_alpha` existed are plain sums)."""
    names = columns(dataset)
    saved = [None] if "ref_ld_alpha" not in names else list(dataset.unique("ref_ld_alpha"))
    if any(a != ld_alpha for a in saved):
        raise ConfigError(
            f"the {name} dataset's saved reference log-probs were weighted with ld_alpha={saved[0]}, this run has "
            f"ld_alpha={ld_alpha}, {WHERE}, run with ld_alpha={saved[0]}, or remove the columns "
            f"(dataset.remove_columns({list(REF_KEYS + MATCH_KEYS)!r})) and precompute them again with the "
            "reference model (ref_model=)"
        )


def with_columns(dataset: Any, chosen: list[list[float]], rejected: list[list[float]], pair_ids: list[list[int]],
                 ld_alpha: float | None) -> Any:  # fmt: skip
    """`dataset` with the four columns (replacing any it had)."""
    old = [k for k in REF_KEYS + MATCH_KEYS if k in columns(dataset)]
    if old:
        dataset = dataset.remove_columns(old)
    alpha = [ld_alpha] * len(chosen)
    for key, values in zip(REF_KEYS + MATCH_KEYS, (chosen, rejected, pair_ids, alpha), strict=True):
        dataset = dataset.add_column(key, values)
    return dataset


def pack_pairs(pack: dict[str, Any]) -> tuple[int, int]:
    """`(chosen, rejected)` sequence counts of one pack (shared-layout prompts and padding left out)."""
    pair_ids = torch.as_tensor(pack["pair_ids"], dtype=torch.int64).reshape(-1)
    chosen = torch.as_tensor(pack["chosen"], dtype=torch.bool).reshape(-1)
    seq = pair_ids >= 0
    prefix = pack.get("prefix_segment")
    if prefix is not None:
        pre = torch.as_tensor(prefix, dtype=torch.int64).reshape(-1)
        seq[pre[pre >= 0]] = False
    return int((seq & chosen).sum()), int((seq & ~chosen).sum())


def check_pack(pack: dict[str, Any], index: int) -> None:
    """Refuse a pack whose saved reference lists are not one entry per pair."""
    want = pack_pairs(pack)
    got = tuple(len(torch.as_tensor(pack[k]).reshape(-1)) for k in REF_KEYS)
    ids = pack.get("ref_pair_ids")
    if got != want or (ids is not None and len(torch.as_tensor(ids).reshape(-1)) != want[0]):
        raise ConfigError(
            f"pack {index} of the batch holds {want[0]} pairs but its saved reference log-probs have "
            f"{got[0]} chosen / {got[1]} rejected entries, {WHERE}, they belong to other packs: precompute them "
            "on this dataset (precompute_ref_log_probs=True with ref_model=) or remove the columns"
        )


def batch_ref(inputs: dict[str, Any], pair_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The batch's saved reference sums for TRL's `_compute_loss`, checked against the batch's pairs
    (`pair_ids`: TRL's row order)."""
    pairs = pair_ids.numel()
    out = {}
    for key in REF_KEYS:
        value = inputs.get(key)
        if value is None or value.numel() != pairs:
            raise ConfigError(
                f"the batch has no {key} for its {pairs} pairs, {WHERE}, let PackedDPOTrainer precompute them "
                "(precompute_ref_log_probs=True) on this dataset"
            )
        out[key] = value
    saved = inputs.get("ref_pair_ids")
    if saved is not None and not torch.equal(saved.reshape(-1).to(pair_ids), pair_ids):
        raise ConfigError(
            f"the saved reference log-probs are for pairs {saved.reshape(-1).tolist()[:8]}, the batch holds pairs "
            f"{pair_ids.tolist()[:8]}, {WHERE}, precompute them on this dataset (precompute_ref_log_probs=True with "
            "ref_model=) or remove the columns"
        )
    return out
