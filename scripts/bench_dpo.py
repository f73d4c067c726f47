"""DPO throughput: TRL-style padded batches vs packed pairs vs packed pairs with a shared prompt.

    PYTHONPATH=. python scripts/bench_dpo.py                  # CPU miniature (~1 min)
    PYTHONPATH=. python scripts/bench_dpo.py --device cuda    # Llama-3.2-1B shape, bf16, real pair lengths

The same model weights and the same pairs go through three layouts, one DPO step each batch (the
policy forward + backward and the reference forward, the LM head on the target rows only, as TRL's
fused head):
- padded: TRL 1.16's `DataCollatorForPreference` layout, `2B` rows (B chosen, B rejected) right-padded
  to the batch's longest sequence, the prompt held twice, sdpa with the padding mask;
- packed: pairs `[P+C][P+R]` first-fit-decreasing into packs of N tokens, one pack per step,
  attn_implementation="packtool";
- shared: `[P][C][R]`, each prompt held once, the same packing and attention.
Throughput counts REAL tokens (each sequence's prompt + completion, what the padded batch trains on:
the same number in every layout), per second of wall time over one pass of all pairs after a warm-up
step (on CPU: the process's CPU time, one thread, so a busy shared machine does not skew it; on CUDA: wall
time). Ratios are measured in the same run. Pair lengths: log-normal prompts and completions shaped
like LLaMA-Factory's dpo_en_demo under a chat template (prompt ~28% of a pair's tokens when held
twice, completions a few hundred tokens, long tails), scaled down 8x on CPU; the prompt share is
printed.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import packtool.hf  # noqa: F401  (registers attn_implementation="packtool")
from packtool.loss import pair_targets

IGNORE = -100


def pair_lengths(n: int, scale: float, cap: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    prompt = rng.lognormal(np.log(90 * scale), 0.9, n)
    chosen = rng.lognormal(np.log(250 * scale), 0.7, n)
    rejected = rng.lognormal(np.log(220 * scale), 0.8, n)
    out = np.stack([prompt, chosen, rejected], 1).round().astype(np.int64).clip(1, None)
    over = out.sum(1) - cap  # keep prompt + chosen + rejected within a pack
    for i in np.nonzero(over > 0)[0]:
        out[i, 1:] = np.maximum(1, (out[i, 1:] * (cap - out[i, 0]) / out[i, 1:].sum()).astype(np.int64) - 1)
        out[i, 0] = min(out[i, 0], cap // 2)
        while out[i].sum() + out[i, 0] > 2 * cap - 2:
            out[i, 1:] = np.maximum(1, out[i, 1:] - 1)
    return out


def make_pairs(lengths: np.ndarray, vocab: int, seed: int) -> list[tuple[list[int], list[int], list[int]]]:
    rng = np.random.default_rng(seed + 1)
    return [tuple(rng.integers(3, vocab, int(k)).tolist() for k in row) for row in lengths]  # type: ignore[misc]


def padded_batches(pairs, per_batch: int, device):
    for i in range(0, len(pairs), per_batch):
        group = pairs[i : i + per_batch]
        seqs = [p + c for p, c, _ in group] + [p + r for p, _, r in group]
        masks = [[0] * len(p) + [1] * len(c) for p, c, _ in group] + [[0] * len(p) + [1] * len(r) for p, _, r in group]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.int64)
        att = torch.zeros(len(seqs), width, dtype=torch.int64)
        comp = torch.zeros(len(seqs), width, dtype=torch.int64)
        for j, (s, m) in enumerate(zip(seqs, masks, strict=True)):
            ids[j, : len(s)] = torch.tensor(s)
            att[j, : len(s)] = 1
            comp[j, : len(m)] = torch.tensor(m)
        target = comp[:, 1:].bool()
        rows = (torch.arange(len(seqs))[:, None] * width + torch.arange(width - 1)[None]).masked_select(target)
        yield (
            {"input_ids": ids.to(device), "attention_mask": att.to(device)},
            rows.to(device),
            ids[:, 1:][target].to(device),
        )


def pack(items: list[int], size: int) -> list[list[int]]:
    """First-fit decreasing of item sizes into bins of `size`: lists of item indices."""
    order = np.argsort(-np.asarray(items), kind="stable")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        for b, room in enumerate(free):
            if room >= items[i]:
                bins[b].append(int(i))
                free[b] -= items[i]
                break
        else:
            bins.append([int(i)])
            free.append(size - items[i])
    return bins


def packed_batches(pairs, size: int, shared: bool, device):
    sizes = [len(p) + len(c) + len(r) + (0 if shared else len(p)) for p, c, r in pairs]
    for members in pack(sizes, size):
        tokens, labels, pos, lens, pair_ids, chosen, prefix = [], [], [], [], [], [], []
        for i in members:
            p, c, r = pairs[i]
            if shared:
                s_p = len(lens)
                parts = ((p, False, 0, False, -1), (c, True, len(p), True, s_p), (r, True, len(p), False, s_p))
            else:
                parts = ((p + c, None, 0, True, -1), (p + r, None, 0, False, -1))
            for seg, lab, start, role, pre in parts:
                tokens += seg
                if lab is None:  # a whole sequence: its completion is what follows the prompt
                    labels += [IGNORE] * len(p) + seg[len(p) :]
                else:
                    labels += seg if lab else [IGNORE] * len(seg)
                pos += list(range(start, start + len(seg)))
                lens.append(len(seg))
                pair_ids.append(i)
                chosen.append(role)
                prefix.append(pre)
        tail = size - len(tokens)
        if tail:
            tokens += [0] * tail
            labels += [IGNORE] * tail
            pos += list(range(tail))
            lens.append(tail)
            pair_ids.append(-1)
            chosen.append(False)
            prefix.append(-1)
        cu = torch.tensor([0, *np.cumsum(lens).tolist()], dtype=torch.int32, device=device)
        batch = {
            "input_ids": torch.tensor([tokens], device=device),
            "labels": torch.tensor([labels], device=device),
            "position_ids": torch.tensor([pos], device=device),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": max(lens),
            "max_length_k": max(lens),
            "pair_ids": torch.tensor(pair_ids, device=device),
            "chosen": torch.tensor(chosen, device=device),
        }
        if shared:
            batch["prefix_segment"] = torch.tensor(prefix, device=device)
        t = pair_targets(batch)
        model_keys = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
                      "prefix_segment")  # fmt: skip
        yield {k: batch[k] for k in model_keys if k in batch}, t.predictor, t.target


def target_logps(model, inputs, rows, targets):
    hidden = model.model(**inputs, use_cache=False).last_hidden_state
    picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, rows)
    logits = model.lm_head(picked).float()
    return torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]


def run(policy, ref, batches, sync, clock=time.perf_counter) -> float:
    start = clock()
    for inputs, rows, targets in batches:
        with torch.no_grad():
            ref_lp = target_logps(ref, inputs, rows, targets)
        lp = target_logps(policy, inputs, rows, targets)
        (lp - ref_lp).sum().backward()
    sync()
    return clock() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pairs", type=int, default=None)
    ap.add_argument("--pack-size", type=int, default=None)
    ap.add_argument("--pairs-per-batch", type=int, default=None, help="padded: pairs per step (2x rows)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (CPU runs)")
    args = ap.parse_args()
    import transformers

    dev = torch.device(args.device)
    if dev.type == "cpu":
        torch.set_num_threads(args.threads)  # one thread by default: stable timings on a shared machine
    if dev.type == "cuda":  # Llama-3.2-1B's shape (random weights), bf16
        shape = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True)  # fmt: skip
        dtype, scale, n_pairs, size, per_batch = torch.bfloat16, 1.0, 512, 8192, 4
    else:
        shape = dict(vocab_size=4096, hidden_size=128, intermediate_size=344, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=32)  # fmt: skip
        dtype, scale, n_pairs, size, per_batch = torch.float32, 0.125, 128, 1024, 4
    n_pairs = args.pairs or n_pairs
    size = args.pack_size or size
    per_batch = args.pairs_per_batch or per_batch
    config = transformers.LlamaConfig(**shape, max_position_embeddings=max(4096, size), pad_token_id=0)
    torch.manual_seed(0)
    models = {}
    for attn in ("sdpa", "packtool"):
        m = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(dev, dtype)
        if models:
            m.load_state_dict(next(iter(models.values()))[0].state_dict())
        r = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).to(dev, dtype).eval()
        r.load_state_dict(m.state_dict())
        models[attn] = (m, r)
    lengths = pair_lengths(n_pairs, scale, size, seed=0)
    pairs = make_pairs(lengths, shape["vocab_size"], seed=0)
    real = int(lengths[:, 0].sum() * 2 + lengths[:, 1:].sum())
    share = 2 * lengths[:, 0].sum() / real

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    # CPU: this process's CPU time (one thread), which neighbours on a shared machine do not inflate; CUDA: wall time
    clock = time.process_time if dev.type == "cpu" else time.perf_counter
    modes = {
        "padded (TRL)": ("sdpa", lambda: padded_batches(pairs, per_batch, dev)),
        "packed": ("packtool", lambda: packed_batches(pairs, size, False, dev)),
        "packed+shared": ("packtool", lambda: packed_batches(pairs, size, True, dev)),
    }
    computed = {}
    for name, (attn, make) in modes.items():
        batches = list(make())
        computed[name] = (len(batches), sum(int(b[0]["input_ids"].numel()) for b in batches), batches)
        policy, ref = models[attn]
        run(policy, ref, batches[:1], sync)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(args.repeats):  # interleaved, so a noisy neighbour hits every mode alike
        for name, (attn, _make) in modes.items():
            policy, ref = models[attn]
            policy.zero_grad(set_to_none=True)
            times[name].append(run(policy, ref, computed[name][2], sync, clock))
    print(f"device {dev}, {n_pairs} pairs, {real} real tokens (prompt {share:.0%} of them, held twice), "
          f"pack size {size}, padded batches of {per_batch} pairs, {dtype}")  # fmt: skip
    base = real / min(times["padded (TRL)"])
    print(f"{'layout':<15} {'steps':>6} {'tokens run':>11} {'real tok/s':>11} {'x padded':>9}")
    for name in modes:
        steps, run_tokens, _ = computed[name]
        rate = real / min(times[name])
        print(f"{name:<15} {steps:>6} {run_tokens:>11} {rate:>11.0f} {rate / base:>9.2f}")
    print(
        f"({'CPU' if dev.type == 'cpu' else 'wall'} time, best of {args.repeats} interleaved passes; median padded {real / statistics.median(times['padded (TRL)']):.0f} tok/s)"
    )


if __name__ == "__main__":
    main()
