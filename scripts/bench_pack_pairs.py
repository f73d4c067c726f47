"""Benchmark `packtool pack` on a preference token store: both layouts, pack time and packs vs the lower bound.

Writes a synthetic preference store (random ids; prompt, chosen and rejected completion lengths lognormal with
UltraFeedback-like medians, prompt ~120 and completions ~220 tokens, a Zipf tail of long completions, clipped),
then packs it with and without `--share-prompt` (best of R runs, numba compile time excluded by a warm-up) and
reports packs / lower bound (ceil(sum of pair item lengths / N)), fill, and the prompt tokens a shared prompt
saves. The store is written through the library's token-store writer, so the pair contract holds.

    python scripts/bench_pack_pairs.py [--pairs 100000] [--size 4096] [--repeat 2] [--workers 1]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from packtool.formats.token_store import TokenStoreWriter
from packtool.stages.pack import PackConfig, pack_store


def pair_lengths(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = np.clip(rng.lognormal(np.log(120), 1.0, n), 1, 3000).astype(np.int64)
    c = np.clip(rng.lognormal(np.log(220), 0.8, n), 1, 2000).astype(np.int64)
    r = np.clip(rng.lognormal(np.log(220), 0.8, n), 1, 2000).astype(np.int64)
    tail = rng.random(n) < 0.02
    c[tail] = np.minimum(rng.zipf(1.3, int(tail.sum())) * 100, 2000)
    return p, c, r


def write_store(path: Path, n: int, seed: int = 0, vocab: int = 32000) -> dict[str, int]:
    """A preference store of n pairs, vectorised: doc 2i = prompt + chosen, 2i+1 = prompt + rejected."""
    p, c, r = pair_lengths(n, seed)
    rng = np.random.default_rng(seed + 1)
    lengths = np.stack([p + c, p + r], axis=1).reshape(-1)
    total = int(lengths.sum())
    ids = rng.integers(3, vocab, total).astype(np.uint32)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    # the rejected sequence repeats the chosen's prompt; completions diverge at their first token
    pos = np.arange(total) - np.repeat(starts, lengths)
    plen = np.repeat(np.repeat(p, 2), lengths)
    prompt_of = np.repeat(np.repeat(starts[0::2], 2), lengths) + pos  # the chosen's prompt token
    in_prompt = pos < plen
    ids[in_prompt] = ids[prompt_of[in_prompt]]
    rej_first = starts[1::2] + p
    ids[rej_first] = np.where(ids[starts[0::2] + p] == 3, 4, 3)
    ids[starts[0::2] + p] = np.maximum(ids[starts[0::2] + p], 5)
    loss = (~in_prompt).astype(np.uint8)
    path.mkdir(parents=True)
    writer = TokenStoreWriter(path, np.dtype("<u4"))
    writer.append(ids, lengths, loss)
    writer.finish(
        {
            "packtool_version": "bench",
            "input_format": "preference",
            "tokenizer": {"name": "bench/tok", "sha256": "0" * 64, "vocab_size": vocab, "eos_id": 2, "pad_id": 0},
            "preference": {"pairs": n, "layout": "chosen,rejected"},
        }
    )
    return {"tokens": total, "prompt_tokens": int(2 * p.sum())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_pairs_"))
    try:
        t = time.perf_counter()
        info = write_store(root / "tok", args.pairs)
        print(f"store: {args.pairs} pairs, {info['tokens']} tokens ({time.perf_counter() - t:.1f} s to write)")
        warm = root / "warm"
        write_store(warm, 200, seed=9)
        for share in (False, True):
            pack_store(PackConfig(warm, args.size, root / "w", share_prompt=share, overlong="drop", workers=1))
            best, meta = float("inf"), {}
            for i in range(args.repeat):
                out = root / f"out{share}{i}"
                t = time.perf_counter()
                meta = pack_store(
                    PackConfig(root / "tok", args.size, out, share_prompt=share, overlong="drop", workers=args.workers)
                ).metadata
                best = min(best, time.perf_counter() - t)
                shutil.rmtree(out)
            pref = meta["preference"]
            over = meta["n_packs"] / meta["lower_bound_packs"] - 1
            print(
                f"{pref['layout']:>13}: {best:.2f} s, {meta['n_packs']} packs, lower bound {meta['lower_bound_packs']} "
                f"(+{over:.3%}), fill {meta['packing_efficiency']}%, {pref['n_packed_pairs']} pairs packed, "
                f"{pref['overlong']['dropped']} over-long dropped, prompt tokens saved {pref['prompt_tokens_saved']} "
                f"({pref['prompt_tokens_saved'] / pref['sequence_tokens']:.2%} of the pairs' tokens)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
