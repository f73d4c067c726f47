"""Benchmark: `document_block_mask` (tiles from cu_seqlens) vs torch's eager `create_block_mask` (dense T×T scan).

For each flattened batch length T, Zipf-like document lengths (capped at 4096) are cut into
`cu_seqlens`; in the same run the script times, best of --repeat each:
  create_block_mask   torch's eager builder over a document-causal mask_mod (evaluates T² pairs;
                      skipped above --dense-max tokens);
  document_block_mask packtool's builder (O((T/128)²) tiles, no T×T tensor);
  cache refresh       `DocumentMaskCache` refreshing its one mask for the shape in place.
Prints milliseconds and the ratio create_block_mask / document_block_mask, and checks that both
builders give the same tiles. No assertions beyond that equality.

    python scripts/bench_flex_mask.py [--lengths 4096,16384,131072] [--repeat 3] [--dense-max 16384]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from packtool.attention import DocumentMaskCache, document_block_mask, document_ids  # noqa: E402

TILES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def cu_for(total: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    lens = np.minimum(rng.zipf(1.3, size=total), 4096)
    lens = lens[np.cumsum(lens) <= total]
    lens = np.append(lens, total - lens.sum())
    lens = lens[lens > 0]
    return torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32)


def best(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="4096,16384,131072")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dense-max", type=int, default=16384)
    args = ap.parse_args()
    from torch.nn.attention.flex_attention import create_block_mask

    warnings.simplefilter("ignore")
    document_block_mask(cu_for(1024, 0))  # warm up imports
    print(f"{'T':>8} {'docs':>5} {'create_block_mask':>18} {'document_block_mask':>20} {'cache refresh':>14} {'ratio':>7}")
    for total in (int(x) for x in args.lengths.split(",")):
        cu = cu_for(total, total)
        ours, mask = best(lambda cu=cu: document_block_mask(cu), args.repeat)
        cache = DocumentMaskCache()
        cache(cu)
        refresh, _ = best(lambda cu=cu, cache=cache: cache(cu), args.repeat)
        dense = float("nan")
        if total <= args.dense_max:
            doc = document_ids(cu)

            def mask_mod(b, h, q, kv, doc=doc):  # noqa: ANN001, ANN202
                return (doc[q] == doc[kv]) & (q >= kv)

            def dense_build(t: int = total) -> object:
                return create_block_mask(mask_mod, None, None, t, t, device="cpu")

            dense, ref = best(dense_build, args.repeat)
            same = all(torch.equal(getattr(mask, n), getattr(ref, n)) for n in TILES)  # type: ignore[arg-type]
            if not same:
                raise SystemExit(f"tiles differ at T={total}")
        measured = dense == dense  # NaN: the dense scan was not run (it would not fit in memory)
        dense_text = f"{dense * 1e3:>16.1f}ms" if measured else f"{'not run':>18}"
        ratio_text = f"{dense / ours:>6.0f}x" if measured else f"{'-':>7}"
        print(
            f"{total:>8} {cu.numel() - 1:>5} {dense_text} {ours * 1e3:>18.1f}ms {refresh * 1e3:>12.1f}ms {ratio_text}"
        )


if __name__ == "__main__":
    main()
