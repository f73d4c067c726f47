"""A packed preference batch seen as TRL 1.16's padded `[2B, L]` DPO batch, and the forward that fills it.

`PaddedView(batch)` says where each target of a packed batch (`PreferencePackCollator`) sits in TRL's
padded batch (chosen rows first, then rejected, pairs in order of first appearance), and what TRL's
`attention_mask` / `completion_mask` would be. Lengths are the REAL ones: `--pad-multiple` padding inside a
segment (`cu_seqlens_unpadded`) is no token of TRL's batch, so `num_tokens` counts what TRL counts. It also
weighs each packed token as TRL's batch holds it (`token_weight`): 1 per sequence that holds it, so a
shared prompt (`pack --share-prompt`) weighs 2 and padding 0; the router's load-balancing loss of a
mixture-of-experts model is computed with those weights (`packtool.hf.router_aux`).

`Scorer(model, batch, view)` stands in for the model inside TRL's `_compute_loss`: it runs the real one on
the packed row once and returns the per-token numbers scattered into the padded layout.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from packtool.errors import ConfigError
from packtool.hf.router_aux import router_aux_loss
from packtool.hf.shared_prompt import KEY, SEEN
from packtool.loss import IGNORE_INDEX, PairTargets, pair_groups, pair_targets

WHERE = "packtool.hf.dpo"
#: what `model(**batch)` gets of a collated batch
MODEL_KEYS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
              "prefix_segment")  # fmt: skip
UNPADDED = "cu_seqlens_unpadded"
FIRST = "first_target"


def real_lengths(batch: dict[str, Any], cu: torch.Tensor, labels: torch.Tensor, seqs: torch.Tensor) -> torch.Tensor:
    """Each segment's length without its `--pad-multiple` padding (`cu_seqlens_unpadded`). A batch without that
    key is taken as unpadded, unless a sequence segment ends on an unlabelled token: then the padding cannot be
    told from the sequence, and the batch is refused."""
    lens = torch.diff(cu)
    unpadded = batch.get(UNPADDED)
    if unpadded is not None:
        cu_real = torch.as_tensor(unpadded).reshape(-1).to(device=cu.device, dtype=torch.int64)
        real = torch.diff(cu_real) if cu_real.shape == cu.shape else lens.new_full(lens.shape, -1)
        if bool(((real < 0) | (real > lens)).any()):
            raise ConfigError(
                f"{UNPADDED} {cu_real.tolist()[:8]} does not fit cu_seqlens {cu.tolist()[:8]}, {WHERE}, pass "
                "PackedDataset items (packs_dataset) to PreferencePackCollator"
            )
        return real
    last = (cu.index_select(0, seqs + 1) - 1).clamp(min=0)
    ends_unlabelled = (labels.index_select(0, last) == IGNORE_INDEX) & (lens.index_select(0, seqs) > 0)
    if bool(ends_unlabelled.any()):
        raise ConfigError(
            f"a pair's sequence ends on an unlabelled token and the batch has no {UNPADDED}, {WHERE}, the "
            "--pad-multiple padding inside segments cannot be told apart from the sequence: make the dataset "
            "with packs_dataset (it keeps cu_seqlens_unpadded) from the pack store"
        )
    return lens


class PaddedView:
    """Where each target of a packed batch sits in TRL's padded `[2B, L]` batch (chosen rows, then rejected)."""

    def __init__(self, batch: dict[str, Any]) -> None:
        targets: PairTargets = pair_targets(batch)
        labels = batch["labels"].reshape(-1)
        dev = labels.device
        cu = batch["cu_seqlens"].to(device=dev, dtype=torch.int64)
        pair_ids = batch["pair_ids"].to(dev)
        chosen = batch["chosen"].to(dev)
        n = cu.numel() - 1
        lens = torch.diff(cu)
        prefix = batch.get("prefix_segment")
        pre = (
            torch.full((n,), -1, dtype=torch.int64, device=dev)
            if prefix is None
            else prefix.to(device=dev, dtype=torch.int64)
        )
        prompt = targets.prompt.to(dev)
        real_seq = (pair_ids >= 0) & ~prompt
        idx = real_seq.nonzero().reshape(-1)
        uniq, inverse = pair_groups(pair_ids.index_select(0, idx), chosen.index_select(0, idx))  # per occurrence
        first = torch.full((uniq.numel(),), n, dtype=torch.int64, device=dev).scatter_reduce(
            0, inverse, idx, reduce="amin"
        )
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.numel(), device=dev)
        b = uniq.numel()
        row_of_seg = torch.full((n,), -1, dtype=torch.int64, device=dev)
        row_of_seg[idx] = rank.index_select(0, inverse) + torch.where(chosen.index_select(0, idx), 0, b)
        if int(torch.bincount(row_of_seg[idx], minlength=2 * b).max()) != 1 or int(row_of_seg[idx].numel()) != 2 * b:
            raise ConfigError(
                f"a pair without exactly one chosen and one rejected sequence, {WHERE}, batch whole packs"
            )
        real = real_lengths(batch, cu, labels, idx)
        pre_len = torch.where(pre >= 0, real.index_select(0, pre.clamp(min=0)), 0)
        seq_len = torch.zeros(2 * b, dtype=torch.int64, device=dev)
        seq_len[row_of_seg[idx]] = real.index_select(0, idx) + pre_len.index_select(0, idx)
        length = int(seq_len.max()) if b else 1
        # every labelled token of a sequence (TRL's completion_mask, its first position included)
        seg = torch.repeat_interleave(torch.arange(n, device=dev), lens)
        offset = torch.arange(labels.numel(), device=dev) - cu.index_select(0, seg)
        pos = offset + pre_len.index_select(0, seg)
        labelled = (labels != IGNORE_INDEX) & (row_of_seg.index_select(0, seg) >= 0)
        completion = torch.zeros(2 * b, length, dtype=torch.int64, device=dev)
        completion[row_of_seg.index_select(0, seg)[labelled], pos[labelled]] = 1
        # a sequence's first token is never predicted (no label), but TRL's completion_mask holds it when the
        # pair's prompt is empty (ipo and sigmoid_norm count it): the pack store's flag says so
        opens = idx[(pre_len.index_select(0, idx) == 0) & (real.index_select(0, idx) > 0)]
        flags = batch.get(FIRST)
        if flags is not None:
            opens = opens[torch.as_tensor(flags).reshape(-1).to(dev, torch.bool).index_select(0, opens)]
            completion[row_of_seg.index_select(0, opens), 0] = 1
            self.unsure_first = False
        else:  # labels from offset 1: a 1-token prompt, or an empty one whose first token the loader unlabelled
            second = (cu.index_select(0, opens) + 1).clamp(max=max(labels.numel() - 1, 0))
            self.unsure_first = bool(
                ((real.index_select(0, opens) > 1) & (labels.index_select(0, second) != IGNORE_INDEX)).any()
            )
        self.completion_mask = completion
        self.attention_mask = (torch.arange(length, device=dev)[None] < seq_len[:, None]).to(torch.int64)
        self.longest = length if b else 0  # the longest sequence (prompt + completion), TRL's `max_length` measure
        # how many of TRL's rows hold each token: its sequence, plus each sequence that continues a shared prompt
        held = (row_of_seg >= 0).to(torch.int64)
        refs = pre.index_select(0, idx)
        held = held.index_add(0, refs[refs >= 0], torch.ones_like(refs[refs >= 0]))
        self.token_weight = torch.where(offset < real.index_select(0, seg), held.index_select(0, seg), 0)
        # each target (pair_targets' order: token order) is predicted at column (its position in its sequence) - 1
        start = offset == 0
        predicted = ~start | (start & (pre.index_select(0, seg) >= 0) & (pre_len.index_select(0, seg) > 0))
        keep = ((labels != IGNORE_INDEX) & predicted).nonzero().reshape(-1)
        self.rows = row_of_seg.index_select(0, seg.index_select(0, keep))
        self.cols = pos.index_select(0, keep) - 1
        self.shape = (2 * b, max(length - 1, 0))
        self.targets = targets
        self.pairs = b
        #: the pair id of each padded row pair, in TRL's row order (pair k: rows k and B + k)
        self.pair_ids = uniq.index_select(0, order)
        if keep.numel() != targets.predictor.numel():
            raise RuntimeError("packtool.hf.dpo: the padded view and pair_targets disagree")

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), values)


class Scorer:
    """Stands in for a model inside TRL's `_compute_loss`: runs the real one on the packed batch."""

    def __init__(self, model: Any, batch: dict[str, Any], view: PaddedView) -> None:
        self.model, self.batch, self.view = model, batch, view

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        p = self.view
        model_kwargs = {k: self.batch[k] for k in MODEL_KEYS if self.batch.get(k) is not None}
        router = bool(kwargs.get("output_router_logits"))
        if router:
            model_kwargs["output_router_logits"] = True
        rows = p.targets.predictor.to(self.batch["input_ids"].device)
        prefix = model_kwargs.get(KEY)
        shared = isinstance(prefix, torch.Tensor) and bool((prefix >= 0).any())
        if shared:
            setattr(prefix, SEEN, False)  # this forward must attend with it (the policy and the reference alike)
        out = self.model(**model_kwargs, use_cache=False, logits_to_keep=rows)
        if shared and not getattr(prefix, SEEN, False):
            raise ConfigError(
                "a shared-prompt pack whose prefix_segment no attn_implementation='packtool' layer attended with "
                "(eager, sdpa and flash_attention_2 ignore it: the rejected completion would not see its prompt), "
                f"{WHERE}, load the model and the reference model with attn_implementation='packtool' "
                "(import packtool.hf; model.set_attn_implementation('packtool'))"
            )
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        logp_all = torch.log_softmax(logits, -1)
        target = p.targets.target.to(logits.device)[:, None]
        log_probs = logp_all.gather(1, target).reshape(-1)
        with torch.no_grad():
            probs = logp_all.exp()
            entropy = -(probs * logp_all).sum(-1)
            mean_logits = logits.mean(-1)
            is_top1 = logits.argmax(-1) == target.reshape(-1)
            log_sum_sq = torch.logsumexp(2 * logp_all, -1)
        return SimpleNamespace(
            log_probs=p.scatter(log_probs),
            entropy=p.scatter(entropy),
            mean_logits=p.scatter(mean_logits),
            is_top1=p.scatter(is_top1),
            log_sum_sq_probs=p.scatter(log_sum_sq),
            aux_loss=router_aux_loss(self.model, out, p.token_weight) if router else getattr(out, "aux_loss", None),
            logits=out.logits,
        )
