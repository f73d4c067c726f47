"""packed_cross_entropy against its per-sequence definitions (values and gradients), on packed rows of
Zipf-length documents from a real token store, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from packtool.errors import ConfigError, FormatError
from packtool.loader import DocumentDataset, PackedCollator
from packtool.loss import count_targets, packed_cross_entropy

VOCAB = 600


def alone(logits: torch.Tensor, labels: torch.Tensor, cu: list[int]) -> tuple[list[torch.Tensor], list[int]]:
    """Each sequence on its own, HF style: summed loss of logits[:-1] vs labels[1:], and its target count."""
    sums, counts = [], []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        lg, lb = logits[a:b], labels[a:b]
        sums.append(F.cross_entropy(lg[:-1], lb[1:], ignore_index=-100, reduction="sum") if b - a > 1 else logits.sum() * 0)
        counts.append(int((lb[1:] != -100).sum()))
    return sums, counts


@pytest.fixture(scope="module")
def packed_row(document_stores):
    ds = DocumentDataset(document_stores["pc"])
    idx = [0, 1, 2, 3, 40, 41, 150, 151, 152]
    return PackedCollator(flatten=True)(ds.__getitems__(idx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_each_sequence_alone_values_and_gradients(packed_row, dtype):
    labels, cu = packed_row["labels"][0], packed_row["cu_seqlens"]
    total = labels.numel()
    torch.manual_seed(0)
    logits = torch.randn(total, VOCAB, dtype=dtype, requires_grad=True)
    sums, counts = alone(logits, labels, cu.tolist())
    assert sum(counts) == packed_row["n_target_tokens"] and min(counts) >= 1
    definitions = {
        "token": torch.stack(sums).sum() / sum(counts),
        "sequence": torch.stack([s / n for s, n in zip(sums, counts, strict=True)]).mean(),
        "sum": torch.stack(sums).sum(),
        "sequence_sum": torch.stack([s / n for s, n in zip(sums, counts, strict=True)]).sum(),
    }
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for reduction, want in definitions.items():
        got = packed_cross_entropy(logits, labels, cu, reduction)
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=reduction)
        g_got, = torch.autograd.grad(got, logits)
        g_want, = torch.autograd.grad(want, logits, retain_graph=True)
        torch.testing.assert_close(g_got, g_want, rtol=tol, atol=tol, msg=f"{reduction} gradient")
    per_pos = packed_cross_entropy(logits[None], labels[None], cu, "none")
    assert per_pos.shape == (total,)
    torch.testing.assert_close(per_pos.sum(), definitions["sum"], rtol=tol, atol=tol)
    assert count_targets(labels, cu) == (sum(counts), len(counts))


def test_boundaries_come_from_cu_seqlens_not_from_labels():
    """Labels without -100 at segment starts (not from packtool) still never cross a boundary; empty
    segments and target-less segments are allowed and do not count as sequences."""
    torch.manual_seed(1)
    cu = [0, 5, 5, 9, 10, 16]
    labels = torch.randint(0, 20, (16,))
    labels[10:16] = -100  # a sequence without targets (padding)
    logits = torch.randn(16, 20, dtype=torch.float64)
    sums, counts = alone(logits, labels, cu)
    means = [s / n for s, n in zip(sums, counts, strict=True) if n]
    torch.testing.assert_close(packed_cross_entropy(logits, labels, torch.tensor(cu), "token"), sum(sums) / sum(counts))
    torch.testing.assert_close(packed_cross_entropy(logits, labels, np.array(cu), "sequence"), sum(means) / len(means))
    assert count_targets(labels, cu) == (sum(counts), len(means)) == (4 + 3, 2)


def test_no_target_gives_zero_not_nan_and_bad_input_is_refused():
    logits = torch.randn(4, 7, requires_grad=True)
    labels = torch.full((4,), -100)
    for reduction in ("token", "sequence"):
        loss = packed_cross_entropy(logits, labels, [0, 4], reduction)
        assert float(loss.detach()) == 0.0
        loss.backward()
    with pytest.raises(ConfigError, match="reduction"):
        packed_cross_entropy(logits, labels, [0, 4], "mean")
    with pytest.raises(FormatError, match="cu_seqlens"):
        packed_cross_entropy(logits, labels, [0, 3], "token")
    with pytest.raises(ConfigError, match="logits"):
        packed_cross_entropy(logits[:3], labels, [0, 4], "token")


def test_global_normalisation_is_invariant_to_micro_batching(packed_row):
    """Sum per micro-batch / global count over the step == the loss of the whole step at once."""
    labels, cu = packed_row["labels"][0], packed_row["cu_seqlens"].tolist()
    torch.manual_seed(2)
    logits = torch.randn(labels.numel(), VOCAB, dtype=torch.float64)
    whole_tok = packed_cross_entropy(logits, labels, cu, "token")
    whole_seq = packed_cross_entropy(logits, labels, cu, "sequence")
    cut = cu[4]  # two micro-batches: sequences 0-3 and 4-
    parts = [(logits[:cut], labels[:cut], cu[:5]), (logits[cut:], labels[cut:], [x - cut for x in cu[4:]])]
    n_tok = sum(count_targets(lb, c)[0] for _, lb, c in parts)
    n_seq = sum(count_targets(lb, c)[1] for _, lb, c in parts)
    tok = sum(packed_cross_entropy(lg, lb, c, "sum") for lg, lb, c in parts) / n_tok
    seq = sum(packed_cross_entropy(lg, lb, c, "sequence_sum") for lg, lb, c in parts) / n_seq
    torch.testing.assert_close(tok, whole_tok)
    torch.testing.assert_close(seq, whole_seq)
    naive = sum(packed_cross_entropy(lg, lb, c, "token") for lg, lb, c in parts) / 2  # mean of means
    assert abs(float(naive - whole_tok)) > 1e-6
