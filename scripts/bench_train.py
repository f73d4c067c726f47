"""Training throughput of the ways a transformers user can batch and attend (issue 25's table).

    python scripts/bench_train.py                      # CPU miniature (make bench): tiny Llama, ~1 min
    python scripts/bench_train.py --device cuda        # the real table: Llama-3.2-1B shape, 32k vocab, bf16
        [--config CONFIG.json] [--lengths TOKEN_STORE|lengths.npy] [--tokens 16384] [--pack 4096] [--seconds 10]

Every mode trains the same model (same config, seed, AdamW) on the same documents through
`model(**batch)`, forward + backward + step, and reports REAL (non-padding) tokens per second
after warm-up, peak memory, and ratios measured in the same run. On a CPU (a shared machine)
the modes run interleaved in rounds and each keeps its median round, and tokens per CPU-second
are printed too (steadier under load):

| mode | batches | attn_implementation |
|---|---|---|
| padded | 4 documents padded to the longest (`PaddedCollator`) | sdpa + attention_mask |
| padded_grouped | length-grouped padded batches under the token budget (`DynamicBatchSampler(padded=True)`) | sdpa |
| sdpa_packed | packs of `--pack` tokens, `position_ids` only (transformers' packed-sequence mask) | sdpa |
| packtool | the same packs, `PackedCollator(flatten=True, keys=HF_KEYS)` | packtool (`import packtool.hf`) |
| packtool_flex | the same packs, a `document_block_mask` BlockMask (CUDA only: compiled flex) | flex_attention |
| unmasked | the same packs as `[k, N]` rows, no document mask (documents see each other: the speed of light) | packtool |
| padding_free | documents under the token budget (`DynamicBatchSampler` + `PackedCollator(flatten=True)`) | packtool |

Lengths: a token store (its documents' lengths) or an `.npy` of lengths; by default a seeded
log-normal (median 1,700 on CUDA, 200 on CPU), documents longer than a pack cut to it. Token
ids are random: speed does not depend on them. Also printed: max |Δ| of one pack's logits under
"packtool" vs each of its documents alone (sdpa), beside sdpa vs eager alone (the noise floor).

DataLoader workers are not used (the collators cost well under a millisecond per batch); with
workers after CUDA is initialised, start them with `multiprocessing_context="spawn"`.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

import packtool
import packtool.hf  # noqa: F401  registers attn_implementation="packtool"
from packtool.attention import document_block_mask
from packtool.loader import HF_KEYS, DynamicBatchSampler, PackedCollator, PaddedCollator

GPU_MODEL = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
             "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 32000, "max_position_embeddings": 131072,
             "rope_theta": 500000.0, "tie_word_embeddings": True}
CPU_MODEL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2048, "max_position_embeddings": 4096}
Batch = tuple[dict[str, Any], int]  # (model kwargs, real tokens)


def lengths_from(spec: str | None, n: int, median: float, cap: int, seed: int) -> np.ndarray:
    if spec is None:
        rng = np.random.default_rng(seed)
        lens = np.exp(rng.normal(np.log(median), 0.9, n)).astype(np.int64)
    elif spec.endswith(".npy"):
        lens = np.load(spec).astype(np.int64)
    else:
        from packtool.loader import DocumentDataset

        lens = np.asarray(DocumentDataset(spec).lengths, dtype=np.int64)
    return np.clip(lens[lens > 1], 2, cap)


def item(length: int, rng: np.random.Generator, vocab: int) -> dict[str, torch.Tensor]:
    ids = torch.from_numpy(rng.integers(0, vocab, length))
    labels = ids.clone()
    labels[0] = -100
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(length),
            "cu_seqlens": torch.tensor([0, length], dtype=torch.int32)}


def pack_item(lens: np.ndarray, size: int, rng: np.random.Generator, vocab: int) -> dict[str, torch.Tensor]:
    """One pack: its documents back to back, the tail padding one more segment (as PackedDataset gives)."""
    parts = [item(int(n), rng, vocab) for n in lens]
    tail = size - int(lens.sum())
    if tail:
        parts.append({"input_ids": torch.zeros(tail, dtype=torch.long), "labels": torch.full((tail,), -100),
                      "position_ids": torch.arange(tail), "cu_seqlens": torch.tensor([0, tail], dtype=torch.int32)})
    seg = [int(p["input_ids"].numel()) for p in parts]
    return {"input_ids": torch.cat([p["input_ids"] for p in parts]), "labels": torch.cat([p["labels"] for p in parts]),
            "position_ids": torch.cat([p["position_ids"] for p in parts]),
            "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum(seg)]), dtype=torch.int32)}


def modes(lens: np.ndarray, args: argparse.Namespace, vocab: int) -> dict[str, tuple[str, Callable[[], Iterator[Batch]]]]:
    size, budget, rng = args.pack, args.tokens, np.random.default_rng(1)
    offsets, order = packtool.pack_lengths(lens, size, algorithm="bfd", seed=0)
    per_step = max(1, budget // size)
    packs = [lens[order[offsets[p] : offsets[p + 1]]] for p in range(len(offsets) - 1)]

    def packed(keys: tuple[str, ...] | None, flatten: bool = True, flex: bool = False) -> Iterator[Batch]:
        collate = PackedCollator(flatten=flatten, keys=keys)
        for p in range(0, len(packs) - per_step + 1, per_step):
            group = packs[p : p + per_step]
            batch = collate([pack_item(g, size, rng, vocab) for g in group])
            if flex:
                batch = {"input_ids": batch["input_ids"], "labels": batch["labels"],
                         "position_ids": batch["position_ids"],
                         "attention_mask": document_block_mask(batch["cu_seqlens"].to(args.device))}
            yield batch, int(sum(int(g.sum()) for g in group))

    def padded(grouped: bool) -> Iterator[Batch]:
        collate = PaddedCollator(pad_id=0, round_to=args.round_to if grouped else 1)
        if grouped:
            batches: Any = DynamicBatchSampler(lens, budget, padded=True, round_to=args.round_to, seed=0)
        else:
            idx = np.random.default_rng(0).permutation(len(lens))
            batches = [idx[i : i + 4] for i in range(0, len(idx) - 3, 4)]
        for b in batches:
            out = collate([item(int(lens[i]), rng, vocab) for i in b])
            yield {k: out[k] for k in ("input_ids", "labels", "attention_mask")}, int(lens[list(b)].sum())

    def padding_free() -> Iterator[Batch]:
        collate = PackedCollator(flatten=True, keys=HF_KEYS)
        for b in DynamicBatchSampler(lens, budget, seed=0):
            yield collate([item(int(lens[i]), rng, vocab) for i in b]), int(lens[list(b)].sum())

    table: dict[str, tuple[str, Callable[[], Iterator[Batch]]]] = {
        "padded": ("sdpa", lambda: padded(False)),
        "padded_grouped": ("sdpa", lambda: padded(True)),
        "sdpa_packed": ("sdpa", lambda: packed(("input_ids", "labels", "position_ids"))),
        "packtool": ("packtool", lambda: packed(HF_KEYS)),
        "packtool_flex": ("flex_attention", lambda: packed(None, flex=True)),
        "unmasked": ("packtool", lambda: packed(("input_ids", "labels"), flatten=False)),
        "padding_free": ("packtool", padding_free),
    }
    if args.device == "cpu":
        table.pop("packtool_flex")  # flex_attention has no CPU backward
    return table


def build(config: dict[str, Any], attn: str, dtype: torch.dtype, device: str) -> Any:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config, use_cache=False))
    model.set_attn_implementation(attn)
    return model.to(device=device, dtype=dtype).train()


class Mode:
    """One mode's model, optimizer and batch stream; `train(seconds)` runs steps and counts real tokens."""

    def __init__(self, name: str, attn: str, batches: Iterator[Batch], args: argparse.Namespace, config: dict,
                 dtype: torch.dtype) -> None:
        self.name, self.attn, self.args, self.batches = name, attn, args, batches
        self.model = build(config, attn, dtype, args.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-5, foreach=True)
        self.rates: list[float] = []
        self.cpu_rates: list[float] = []
        self.steps = 0
        self.peak = float("nan")

    def step(self) -> int:
        batch, real = next(self.batches)
        batch = {k: v.to(self.args.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        self.model(**batch).loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return real

    def train(self, seconds: float, warmup: int = 0) -> None:
        cuda = self.args.device == "cuda"
        for _ in range(warmup):
            self.step()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        tokens = steps = 0
        start, cpu = time.perf_counter(), time.process_time()
        while steps == 0 or time.perf_counter() - start < seconds:
            tokens, steps = tokens + self.step(), steps + 1
        if cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() / 2**30
        self.rates.append(tokens / (time.perf_counter() - start))
        self.cpu_rates.append(tokens / max(time.process_time() - cpu, 1e-9))
        self.steps += steps

    def result(self) -> dict:
        return {"mode": self.name, "attn": self.attn, "tokens_per_s": float(np.median(self.rates)),
                "tokens_per_cpu_s": float(np.median(self.cpu_rates)), "steps": self.steps, "peak_gb": self.peak}

    def close(self) -> None:
        del self.model, self.opt
        gc.collect()
        if self.args.device == "cuda":
            torch.cuda.empty_cache()


def exactness(config: dict, args: argparse.Namespace, dtype: torch.dtype, vocab: int) -> tuple[float, float]:
    """max |Δ| logits: one packed row under "packtool" vs each document alone under sdpa; sdpa vs eager alone."""
    rng = np.random.default_rng(5)
    lens = np.array([args.pack // 8, args.pack // 4, args.pack // 6, args.pack // 3])
    docs = [item(int(n), rng, vocab) for n in lens]
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(docs)
    model = build(config, "sdpa", dtype, args.device).eval()
    with torch.no_grad():
        alone = [model(input_ids=d["input_ids"][None].to(args.device)).logits[0] for d in docs]
        model.set_attn_implementation("eager")
        eager = [model(input_ids=d["input_ids"][None].to(args.device)).logits[0] for d in docs]
        model.set_attn_implementation("packtool")
        packed = model(**{k: v.to(args.device) if torch.is_tensor(v) else v for k, v in batch.items()}).logits[0]
    ref = torch.cat(alone).float()
    return float((packed.float() - ref).abs().max()), float((torch.cat(eager).float() - ref).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--config", help="a Llama-style config.json (default: Llama-3.2-1B shape on CUDA, tiny on CPU)")
    ap.add_argument("--lengths", help="a token store directory or an .npy of document lengths")
    ap.add_argument("--tokens", type=int, help="token budget per step (default 16384 CUDA, 2048 CPU)")
    ap.add_argument("--pack", type=int, help="pack size (default 4096 CUDA, 512 CPU)")
    ap.add_argument("--seconds", type=float, help="timed seconds per mode after warm-up (default 10 CUDA, 4 CPU)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="CPU: interleaved rounds over the modes (median kept)")
    ap.add_argument("--documents", type=int, default=20000)
    ap.add_argument("--only", nargs="*", help="run these modes only")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    args.tokens = args.tokens or (16384 if cuda else 2048)
    args.pack = args.pack or (4096 if cuda else 512)
    args.seconds = args.seconds or (10.0 if cuda else 6.0)
    args.round_to = 64 if cuda else 8
    if args.config:
        import json
        from pathlib import Path

        raw = json.loads(Path(args.config).read_text())
        config = {k: v for k, v in raw.items() if k in GPU_MODEL or k == "rope_scaling"}
    else:
        config = GPU_MODEL if cuda else CPU_MODEL
    dtype = torch.bfloat16 if cuda else torch.float32
    lens = lengths_from(args.lengths, args.documents, 1700 if cuda else 200, args.pack, seed=0)
    table = modes(lens, args, int(config["vocab_size"]))
    device = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"# bench_train: {device}, torch {torch.__version__}, {dtype}, {len(lens)} documents (median "
          f"{int(np.median(lens))}, {int(lens.sum())} tokens), {args.tokens} tokens/step, packs of {args.pack}, "
          f"{args.seconds:g} s per mode after {args.warmup} warm-up steps"
          + ("" if cuda else f", in {args.rounds} interleaved rounds (median)"))
    names = [n for n in table if not args.only or n in args.only]
    results = []
    if cuda:  # one mode at a time: each holds a 1B model and its optimizer state
        for name in names:
            mode = Mode(name, table[name][0], table[name][1](), args, config, dtype)
            mode.train(args.seconds, args.warmup)
            results.append(mode.result())
            mode.close()
            print(f"  {name:15} {mode.attn:15} {results[-1]['tokens_per_s']:>10,.0f} tok/s", flush=True)
    else:  # a shared CPU: rounds interleave the modes and the median round is kept, so load moves them alike
        modes_ = [Mode(name, table[name][0], table[name][1](), args, config, dtype) for name in names]
        for mode in modes_:
            mode.train(0.0, args.warmup)
            mode.rates.clear()
            mode.cpu_rates.clear()
            mode.steps = 0
        for _ in range(args.rounds):
            for mode in modes_:
                mode.train(args.seconds / args.rounds)
        results = [mode.result() for mode in modes_]
    by = {r["mode"]: r for r in results}
    base = by.get("padded", results[0])["tokens_per_s"]
    print("\n| mode | attn_implementation | real tokens/s | × padded | real tokens per CPU-s | peak GB |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        peak = f"{r['peak_gb']:.1f}" if r["peak_gb"] == r["peak_gb"] else "-"
        print(f"| {r['mode']} | {r['attn']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / base:.2f} | "
              f"{r['tokens_per_cpu_s']:,.0f} | {peak} |")
    if "packtool" in by and "unmasked" in by and "sdpa_packed" in by:
        ours = by["packtool"]["tokens_per_s"]
        print(f"\npacktool / unmasked packing: {ours / by['unmasked']['tokens_per_s']:.3f}; "
              f"packtool / sdpa packed: {ours / by['sdpa_packed']['tokens_per_s']:.2f}x")
    packed_d, noise = exactness(config, args, dtype, int(config["vocab_size"]))
    print(f"logits, one pack under packtool vs each document alone (sdpa): max |Δ| {packed_d:.3g} "
          f"(sdpa vs eager alone: {noise:.3g})")


if __name__ == "__main__":
    main()
