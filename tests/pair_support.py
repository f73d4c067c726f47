"""Hand-built preference batches (contract section 3) for the pair_logps / shared-prompt tests."""

from __future__ import annotations

import torch

IGNORE = -100


def make_pairs(
    seed: int, n: int, vocab: int, prompt=(5, 10), completion=(2, 8)
) -> list[tuple[list[int], list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return torch.randint(3, vocab, (k,), generator=g).tolist()

    return [(ids(*prompt), ids(*completion), ids(*completion)) for _ in range(n)]


def batch(pairs, shared: bool, pad: int = 3, first_pair: int = 0) -> dict[str, torch.Tensor]:
    """A collator-style `[1, T]` batch: per pair [P+C][P+R] (or [P][C][R] when shared), then `pad` pad tokens."""
    tokens, labels, positions, lens, pair_ids, chosen, prefix = [], [], [], [], [], [], []
    for i, (p, c, r) in enumerate(pairs):
        pid = first_pair + i
        if shared:
            s_p = len(lens)
            for seg, lab, start, role, pre in (
                (p, False, 0, False, -1),
                (c, True, len(p), True, s_p),
                (r, True, len(p), False, s_p),
            ):
                tokens += seg
                labels += seg if lab else [IGNORE] * len(seg)
                positions += list(range(start, start + len(seg)))
                lens.append(len(seg))
                pair_ids.append(pid)
                chosen.append(role)
                prefix.append(pre)
        else:
            for comp, role in ((c, True), (r, False)):
                seq = p + comp
                tokens += seq
                labels += [IGNORE] * len(p) + comp
                positions += list(range(len(seq)))
                lens.append(len(seq))
                pair_ids.append(pid)
                chosen.append(role)
                prefix.append(-1)
    if pad:
        tokens += [0] * pad
        labels += [IGNORE] * pad
        positions += list(range(pad))
        lens.append(pad)
        pair_ids.append(-1)
        chosen.append(False)
        prefix.append(-1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out = {
        "input_ids": torch.tensor([tokens]),
        "labels": torch.tensor([labels]),
        "position_ids": torch.tensor([positions]),
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max(lens),
        "max_length_k": max(lens),
        "pair_ids": torch.tensor(pair_ids, dtype=torch.int64),
        "chosen": torch.tensor(chosen),
    }
    if shared:
        out["prefix_segment"] = torch.tensor(prefix, dtype=torch.int64)
    return out


def alone_logps(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """TRL's logps of one sequence run alone: the sum of its completion tokens' log-probs."""
    seq = torch.tensor([prompt + completion])
    logits = model(input_ids=seq, use_cache=False).logits[0]
    logp = torch.log_softmax(logits[:-1], -1).gather(1, seq[0, 1:, None])[:, 0]
    return logp[len(prompt) - 1 :].sum()
