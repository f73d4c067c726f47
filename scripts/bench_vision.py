"""Vision benchmarks (issue 37, section 8): same-run ratios only.

    PYTHONPATH=$PWD python scripts/bench_vision.py pack   [--docs 200000] [--size 8192]
    PYTHONPATH=$PWD python scripts/bench_vision.py loader [--images 256] [--workers 0 1 2] [--size 4096]

`pack`: documents shaped like LLaVA/Qwen2-VL SFT data (lognormal text around a median of ~180 tokens;
0-4 images per document, 60% with one or more; photos of 224..1344 pixels a side, Qwen2-VL's rule:
patches = (h/14)(w/14), tokens = patches/4) segmented with images whole (`build_vision_segments`)
and packed by every algorithm (`pack_with_budget`) at N, without a budget and with budgets that bind.
Reports packs / lower bound: the token bound ceil(tokens / N) and, with a budget, the two-capacity
bound max(ceil(tokens / N), ceil(patches / budget)).

`loader`: `PackedDataset` items of a vision pack store (pixels decoded and processed in the workers)
against a bare loop of the same processor's `pixel_rows` over the same images, images per second, in
the same run; per DataLoader worker (images/s divided by the workers).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from packtool.choices import Overlong  # noqa: E402
from packtool.core.packing import ALGORITHMS  # noqa: E402
from packtool.core.packing.budget import budget_lower_bound, pack_with_budget  # noqa: E402
from packtool.core.packing.vision_segments import ImageSpans, build_vision_segments  # noqa: E402


def vision_documents(n: int, seed: int = 0) -> tuple[np.ndarray, ImageSpans]:
    """(document lengths, image spans) of `n` synthetic VL SFT documents (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_img = np.where(rng.random(n) < 0.6, rng.choice([1, 1, 1, 2, 3, 4], n), 0)
    k = int(n_img.sum())
    side = lambda: rng.integers(16, 97, k) * 14  # noqa: E731 - 224..1344 pixels, multiples of 14
    h, w = side(), side()
    patches = (h // 14) * (w // 14)
    patches -= patches % 4  # a 2x2 merge: tokens = patches / 4
    tokens = np.maximum(patches // 4, 1)
    doc = np.repeat(np.arange(n, dtype=np.int64), n_img)
    text = np.clip(rng.lognormal(5.2, 0.9, n + k), 8, 6000).astype(np.int64)
    # a document: text, then per image [start] image tokens [end] text
    lengths = text[:n].copy()
    offset = np.empty(k, np.int64)
    first = np.cumsum(n_img) - n_img
    for j in range(int(n_img.max(initial=0))):  # per image slot, vectorised over documents
        has = n_img > j
        idx = first[has] + j
        offset[idx] = lengths[has] + 1
        lengths[has] += tokens[idx] + 2 + text[n + idx]
    spans = ImageSpans(doc, offset, tokens.astype(np.int64), patches.astype(np.int64), np.arange(k, dtype=np.int64))
    return lengths, spans


def bench_pack(args: argparse.Namespace) -> None:
    lengths, spans = vision_documents(args.docs, args.seed)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    size = args.size
    print(
        f"{args.docs} documents, {spans.doc.size} images, {int(lengths.sum())} tokens "
        f"({int(spans.n_tokens.sum()) / lengths.sum():.1%} image tokens), {int(spans.n_patches.sum())} patches, N={size}"
    )
    total_patches = int(spans.n_patches.sum())
    natural = total_patches * size // int(lengths.sum())  # patches per pack if images spread evenly
    for budget in (None, 2 * natural, int(1.4 * natural), int(1.2 * natural)):
        v = build_vision_segments(starts, lengths, spans, size, Overlong.SPLIT, 1, budget)
        seg = v.segments
        token_bound = budget_lower_bound(seg.lengths, v.patches, size, None)
        bound = budget_lower_bound(seg.lengths, v.patches, size, budget)
        for name in ALGORITHMS:
            t0 = time.perf_counter()
            offsets, order = pack_with_budget(seg.lengths, v.patches, size, budget, name, seed=0)
            dt = time.perf_counter() - t0
            packs = offsets.size - 1
            pack = np.repeat(np.arange(packs), np.diff(offsets))
            most = int(np.bincount(pack, v.patches[order]).max())
            print(
                f"budget {str(budget):>8} {name:>6}: {packs} packs, {packs / token_bound - 1:+.3%} vs token bound "
                f"{token_bound}, {packs / bound - 1:+.3%} vs both-capacity bound {bound}, max patches/pack {most}, {dt:.2f}s"
            )


def bench_loader(args: argparse.Namespace) -> None:
    import tempfile

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from vision_support import PROCESSOR_CONFIG, make_vision_store, random_docs  # type: ignore[import-not-found]

    from packtool.loader import PackedDataset
    from packtool.loader.collator import HF_KEYS, PackedCollator
    from packtool.stages.pack import PackConfig, pack_store
    from packtool.vision import VisionProcessor

    tmp = Path(tempfile.mkdtemp())
    docs = random_docs(args.images // 2, seed=1, p_image=1.0, pool=args.images, side=224, fmt="JPEG")
    store = make_vision_store(tmp / "s", docs)
    res = pack_store(PackConfig(store, args.size, tmp / "p"))
    ds = PackedDataset(res.directory, size=args.size)
    ds._open()
    images = [data for d in docs for _, data in d.images]
    n_images = int(ds.metadata["vision"]["n_images"])
    proc = VisionProcessor.from_config(PROCESSOR_CONFIG)
    print(f"{len(images)} JPEG images of 224..672 pixels a side in {len(ds)} packs of {args.size} (Qwen2-VL rules)")
    per_pack = [[images_of(ds, p)] for p in range(len(ds))]
    collate = PackedCollator(flatten=True, keys=HF_KEYS)  # tensors: a worker ships them in shared memory
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for data in images:
            proc.pixel_rows([data])
        bare = len(images) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for (batch,) in per_pack:
            proc.pixel_rows(batch)
        bare_packs = n_images / (time.perf_counter() - t0)
        print(f"  bare processor loop: {bare:.1f} images/s one image a call, {bare_packs:.1f} one pack's images a call")
        for workers in args.workers:
            loader = torch.utils.data.DataLoader(
                ds, batch_size=1, num_workers=workers, collate_fn=collate, persistent_workers=workers > 0
            )
            for _ in loader:  # a first epoch: workers started, maps and media tables opened
                pass
            t0 = time.perf_counter()
            for _ in loader:
                pass
            rate = n_images / (time.perf_counter() - t0)
            per = rate / max(workers, 1)
            print(
                f"  PackedDataset + PackedCollator, {workers} worker(s), second epoch: {rate:.1f} images/s, {per:.1f} per worker "
                f"= {per / bare_packs:.2f}x the bare loop on the same packs"
            )


def images_of(ds: Any, p: int) -> list[bytes]:
    """Pack p's image bytes, as the loader resolves them (its `img_row` over the sources' tables)."""
    views = ds._vis
    a, b = int(views.pack_img[p]), int(views.pack_img[p + 1])
    return [table.data(i) for table, i in (views._image(k) for k in range(a, b))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("section", choices=["pack", "loader"])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    args: Any = parser.parse_args(argv)
    bench_pack(args) if args.section == "pack" else bench_loader(args)


if __name__ == "__main__":
    main()
