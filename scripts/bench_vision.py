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

`tokenize`: records/s of `packtool tokenize` (the CLI in a subprocess, `--workers` = cores, its whole
wall time: interpreter start, imports, model folder, writing and hashing the store) against
LLaMA-Factory 0.9.5's multimodal preprocessing called directly in its own venv (`--lf-python`,
default .venv-llamafactory/bin/python, made by `make llamafactory`): its `get_dataset_converter("sharegpt")`, `get_template_and_fix_tokenizer`
(template `qwen2_vl`, its `mm_plugin`) and `SupervisedDatasetProcessor.preprocess_dataset`, in batches of
100 records over a process pool of the same size; timed after its imports and setup. Same records (LLaMA-Factory
shape, multi-turn, 0-3 images over `--photos` 640x480 JPEGs plus the demo photos), same tiny Qwen2-VL folder
(the real Qwen2-VL image processor settings: min_pixels 3136, max_pixels 12845056). Its processor is built
as `Qwen2VLProcessor(image_processor=Qwen2VLImageProcessorPil, ...)` because here torchvision (and torchaudio,
which its mm_plugin imports) are CUDA wheels that cannot load beside the CPU torch: both are blocked before
it imports. The ids of both are compared on the first 50 records.

`padding`: the `pack` section's documents in padded batches of B (in random order, and sorted by length)
against packs of N: pad tokens (slots minus tokens), token capacity unused when every step is sized for the run's largest step (steps x max
slots per step - tokens), and patches, where a step's patch capacity is sized for
the largest step of the run (the vision tower's memory is set by its worst step): waste = steps x max
patches per step - patches. Packs with `--vision-budget` bound that maximum by construction.

`step` / `gpu`: a tiny random Qwen2-VL (float32 on CPU; bfloat16 and a larger text model on CUDA), forward +
backward on the same documents (images of several grids), as one packed row (`position_ids [4, 1, T]`,
attn_implementation="packtool") against right-padded rows (attention_mask, "sdpa"); the same tokens, time
per document batch, and tokens (real) per second.
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


# -- tokenize: packtool vs LLaMA-Factory 0.9.5 (vbench) ----------------------------------------------
LF_WORKER = r"""
import importlib.machinery, json, sys, time, types
sys.modules["torchvision"] = None  # a CUDA wheel here: it cannot load beside the CPU torch
_ta = types.ModuleType("torchaudio")  # the same; mm_plugin imports it (for audio only) at module level
_ta.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
sys.modules["torchaudio"] = _ta
from concurrent.futures import ProcessPoolExecutor
src, model_dir, media_dir, workers, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
import transformers
from llamafactory.data.converter import get_dataset_converter
from llamafactory.data.parser import DatasetAttr
from llamafactory.data.processor import SupervisedDatasetProcessor
from llamafactory.data.template import get_template_and_fix_tokenizer
from llamafactory.hparams import DataArguments, ModelArguments
from llamafactory.model.patcher import patch_processor

def build():
    data_args = DataArguments(template="qwen2_vl", cutoff_len=1 << 20, media_dir=media_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    image_processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    class NoVideo(transformers.Qwen2VLProcessor):  # AutoProcessor would build the video processor (torchvision)
        def check_argument_for_proper_class(self, name, arg):
            return None if arg is None else super().check_argument_for_proper_class(name, arg)
    processor = NoVideo(image_processor=image_processor, tokenizer=tokenizer, video_processor=None)
    processor.video_processor = types.SimpleNamespace()  # its plugin checks one exists; never called (no videos)
    patch_processor(processor, tokenizer, ModelArguments(model_name_or_path=model_dir))
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    attr = DatasetAttr("file", "bench", formatting="sharegpt")  # data/dataset_info.json's mllm_demo entry
    attr.messages, attr.images = "messages", "images"
    attr.role_tag, attr.content_tag, attr.user_tag, attr.assistant_tag = "role", "content", "user", "assistant"
    return get_dataset_converter("sharegpt", attr, data_args), SupervisedDatasetProcessor(
        template=template, tokenizer=tokenizer, processor=processor, data_args=data_args)

STATE = {}
def run(lines):
    if not STATE:
        STATE["c"], STATE["p"] = build()
    cpu = time.process_time()
    rows = [STATE["c"](json.loads(line)) for line in lines]
    got = STATE["p"].preprocess_dataset({k: [r[k] for r in rows] for k in rows[0]})
    return got["input_ids"], time.process_time() - cpu

lines = open(src).read().splitlines()
batches = [lines[i:i + 100] for i in range(0, len(lines), 100)]
if workers > 1:
    pool = ProcessPoolExecutor(workers)
    list(pool.map(run, [batches[0][:1]] * workers))  # imports and setup in every worker, outside the timing
    t0 = time.perf_counter()
    res = list(pool.map(run, batches))
else:
    run(batches[0][:1])
    t0 = time.perf_counter()
    res = [run(b) for b in batches]
dt = time.perf_counter() - t0
ids = [x for r in res for x in r[0]]
json.dump({"seconds": dt, "cpu": sum(r[1] for r in res), "records": len(ids), "tokens": sum(map(len, ids)),
           "ids": ids[:50]}, open(out, "w"))
"""

QUESTIONS = ["What is in the picture?", "Describe the colours in detail.", "How many objects can you see?",
             "Compare the two images.", "Is it day or night, and why?", "What might happen next?"]
ANSWERS = ["A soft gradient with a few coloured shapes scattered over it.",
           "Mostly blue and green, with a warm orange patch near the top left corner.",
           "I can see three: one large shape in the middle and two smaller ones beside it.",
           "The first is brighter and warmer; the second is darker, with more contrast.", "Day: the light is even."]


def photo(seed: int, w: int = 640, h: int = 480) -> bytes:
    """A real-sized photo-like JPEG: smooth random colour fields (bicubic upsampling) plus grain."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    arr = np.clip(np.asarray(small, np.int16) + rng.integers(-12, 13, (h, w, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def lf_records(n: int, photos: list[str], seed: int = 0) -> list[dict[str, Any]]:
    """LLaMA-Factory-shaped multi-turn records (messages + images), 1-3 turns, 0-3 images."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        messages: list[dict[str, str]] = []
        images: list[str] = []
        for _ in range(int(rng.integers(1, 4))):
            q = QUESTIONS[int(rng.integers(len(QUESTIONS)))]
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):
                q = "<image>" + q if rng.random() < 0.7 else q + "<image>"
                images.append(photos[int(rng.integers(len(photos)))])
            a = " ".join(ANSWERS[int(i)] for i in rng.integers(0, len(ANSWERS), int(rng.integers(1, 4))))
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        out.append({"messages": messages, "images": images})
    return out


def bench_tokenize(args: argparse.Namespace) -> None:
    import json
    import resource
    import shutil
    import subprocess
    import tempfile

    from packtool.formats.token_store import open_token_store

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "tests"))
    from test_vision_families import build_qwen_folder  # type: ignore[import-not-found]

    lf_python = Path(args.lf_python)
    if not lf_python.exists():
        print(f"tokenize: skipped, no LLaMA-Factory venv at {lf_python} (--lf-python)")
        return
    tmp = Path(tempfile.mkdtemp(prefix="bench_vision_"))
    folder = build_qwen_folder(tmp / "model", "qwen2_vl")
    pre = json.loads((folder / "preprocessor_config.json").read_text())
    pre.update(min_pixels=3136, max_pixels=12845056)  # Qwen2-VL-*-Instruct's own settings
    (folder / "preprocessor_config.json").write_text(json.dumps(pre))
    data = tmp / "data"
    shutil.copytree(root / "data" / "sample" / "vision" / "mllm_demo_data", data / "mllm_demo_data")
    (data / "photos").mkdir()
    names = [f"mllm_demo_data/{i}.jpg" for i in (1, 2, 3)]
    for i in range(args.photos):
        (data / "photos" / f"{i}.jpg").write_bytes(photo(i))
        names.append(f"photos/{i}.jpg")
    records = lf_records(args.records, names, args.seed)
    src = data / "records.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    cores = os.cpu_count() or 1
    n_img = sum(len(r["images"]) for r in records)
    print(f"{len(records)} records ({n_img} images over {len(names)} JPEGs, 640x480 + the demo's), {cores} cores", flush=True)
    env = {**os.environ, "PYTHONPATH": str(root)}
    best_pt, best_lf, cpu_pt, cpu_lf = float("inf"), float("inf"), float("inf"), float("inf")
    lf: dict[str, Any] = {}
    for r in range(args.rounds):  # interleaved: the machine is shared
        out = tmp / f"store{r}"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "packtool", "tokenize", str(src), "--tokenizer", str(folder), "--output",
                        str(out), "--format", "auto", "--workers", str(cores), "-q"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        best_pt = min(best_pt, time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_pt = min(cpu_pt, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        subprocess.run([str(lf_python), "-c", LF_WORKER, str(src), str(folder), str(data), str(cores),
                        str(tmp / "lf.json")], check=True, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                       stderr=subprocess.DEVNULL)
        lf = json.loads((tmp / "lf.json").read_text())
        best_lf, cpu_lf = min(best_lf, lf["seconds"]), min(cpu_lf, lf["cpu"])
        print(f"round {r}: packtool {best_pt:.1f} s wall, {cpu_pt:.1f} CPU s (the whole CLI process and its workers); "
              f"LLaMA-Factory {lf['seconds']:.1f} s wall, {lf['cpu']:.1f} CPU s (processing calls only); "
              f"load average {os.getloadavg()[0]:.1f}", flush=True)
    store = open_token_store(tmp / "store0")
    ids, ends = np.asarray(store.tokens), np.asarray(store.boundaries)
    ends = ends[1:] if ends[0] == 0 else ends
    starts = np.r_[0, ends[:-1]]
    same = all(ids[a:b].tolist() == w for a, b, w in zip(starts, ends, lf["ids"], strict=False))
    print(f"ids equal on the first {len(lf['ids'])} records: {same}; tokens packtool {ids.size}, LLaMA-Factory {lf['tokens']}")
    print(f"tokenize: packtool {len(records) / best_pt:.0f} records/s, LLaMA-Factory 0.9.5 {lf['records'] / best_lf:.0f} "
          f"records/s: {best_lf / best_pt:.2f}x wall (best of {args.rounds} each); CPU seconds per record "
          f"{cpu_pt / len(records) * 1e3:.1f} ms vs {cpu_lf / len(records) * 1e3:.1f} ms: {cpu_lf / cpu_pt:.2f}x")
    shutil.rmtree(tmp, ignore_errors=True)


# -- padding: pad tokens and patches, padded batches vs packs (vbench) ------------------------------
def bench_padding(args: argparse.Namespace) -> None:
    lengths, spans = vision_documents(args.docs, args.seed)
    n, size = lengths.size, args.size
    doc_patches = np.bincount(spans.doc, spans.n_patches, minlength=n).astype(np.int64)
    tokens, patches = int(lengths.sum()), int(doc_patches.sum())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    natural = patches * size // tokens
    print(f"{n} documents, {tokens} tokens, {patches} patches, packs of N={size}; padded batches of B documents "
          f"(B = documents per pack on average, the same steps)")

    def line(name: str, steps: int, step_slots: np.ndarray, step_patches: np.ndarray) -> None:
        slots = int(step_slots.sum())
        cap = steps * int(step_slots.max())
        waste = steps * int(step_patches.max()) - patches
        print(f"{name:>32}: {steps:>6} steps, pad tokens {(slots - tokens) / slots:6.1%} of slots, token capacity unused "
              f"{(cap - tokens) / cap:6.1%} (max slots/step {int(step_slots.max())}), max patches/step "
              f"{int(step_patches.max()):>6}, patch capacity unused {waste / (waste + patches):6.1%}")

    rows = {}
    for budget in (None, int(1.2 * natural)):
        v = build_vision_segments(starts, lengths, spans, size, Overlong.SPLIT, 1, budget)
        offsets, order = pack_with_budget(v.segments.lengths, v.patches, size, budget, "bfd", seed=0)
        packs = offsets.size - 1
        per = np.add.reduceat(v.patches[order], offsets[:-1]) if packs else np.zeros(0, np.int64)
        rows[budget] = packs
        line(f"packed bfd, budget {budget}", packs, np.full(packs, size), per)
    b = max(1, round(n / rows[None]))
    rng = np.random.default_rng(args.seed)
    for name, order in (("padded random", rng.permutation(n)), ("padded sorted by length", np.argsort(lengths, kind="stable"))):
        cut = np.arange(0, n, b)
        longest = np.maximum.reduceat(lengths[order], cut)
        count = np.diff(np.r_[cut, n])
        line(f"{name}, B={b}", cut.size, longest * count, np.add.reduceat(doc_patches[order], cut))


# -- step: tiny Qwen2-VL, packed vs padded (vbench) ---------------------------------------------------
def vl_step_batches(n_docs: int, seed: int, pad: int, img: int, start: int, end: int, vocab: int, row: int,
                    long: bool) -> tuple[list[dict[str, Any]], int]:
    """Documents (ids, grid list) with images of several grids; text lengths lognormal."""
    import torch

    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        ids: list[int] = []
        grids = []
        for _ in range(int(rng.choice([0, 1, 1, 2]))):
            ids += rng.integers(10, vocab - 10, int(rng.integers(5, 60))).tolist()
            g = (1, 2 * int(rng.integers(2, 9 if not long else 17)), 2 * int(rng.integers(2, 9 if not long else 17)))
            grids.append(g)
            ids += [start] + [img] * (g[1] * g[2] // 4) + [end]
        ids += rng.integers(10, vocab - 10, int(np.clip(rng.lognormal(4.8 if not long else 5.8, 0.8), 8, 2000))).tolist()
        doc: dict[str, Any] = {"ids": torch.tensor(ids), "grids": torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)}
        doc["pixels"] = torch.randn(int(doc["grids"].prod(-1).sum()), row)
        docs.append(doc)
    return docs, sum(len(d["ids"]) for d in docs)


def vl_model(device: str, dtype: Any, big: bool) -> Any:
    import torch
    import transformers

    import packtool.hf  # noqa: F401  (registers "packtool")

    if big:
        text = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
                "num_key_value_heads": 4, "vocab_size": 8192, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
        vision = {"depth": 4, "embed_dim": 256, "num_heads": 4, "hidden_size": 1024, "mlp_ratio": 2, "spatial_merge_size": 2}
    else:
        text = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 2048, "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]}}
        vision = {"depth": 1, "embed_dim": 32, "num_heads": 2, "hidden_size": 128, "mlp_ratio": 2, "spatial_merge_size": 2}
    vocab = text["vocab_size"]
    config = transformers.Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=vocab - 3,
                                        vision_start_token_id=vocab - 2, vision_end_token_id=vocab - 1)
    torch.manual_seed(0)
    return transformers.Qwen2VLForConditionalGeneration(config).to(device=device, dtype=dtype)


def vl_inputs(model: Any, docs: list[dict[str, Any]], device: str, dtype: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(packed batch, padded batch) of the same documents."""
    import torch

    cfg = model.config
    img, pad = cfg.image_token_id, 0
    rows = []
    for d in docs:
        ids = d["ids"][None]
        rope, _ = model.model.get_rope_index(ids, mm_token_type_ids=(ids == img).int(),
                                             image_grid_thw=d["grids"] if len(d["grids"]) else None)
        rows.append(torch.cat([torch.arange(ids.shape[1]).view(1, 1, -1), rope.cpu()], 0))
    ids = torch.cat([d["ids"] for d in docs])[None]
    pixels = torch.cat([d["pixels"] for d in docs]).to(device, dtype)
    grids = torch.cat([d["grids"] for d in docs]).to(device)
    packed = {"input_ids": ids.to(device), "position_ids": torch.cat(rows, -1).to(device), "labels": ids.to(device),
              "pixel_values": pixels, "image_grid_thw": grids}
    longest = max(len(d["ids"]) for d in docs)
    padded_ids = torch.full((len(docs), longest), pad)
    mask = torch.zeros((len(docs), longest), dtype=torch.int64)
    for i, d in enumerate(docs):
        padded_ids[i, : len(d["ids"])] = d["ids"]
        mask[i, : len(d["ids"])] = 1
    labels = padded_ids.masked_fill(mask == 0, -100)
    padded = {"input_ids": padded_ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device),
              "mm_token_type_ids": (padded_ids == img).int().to(device), "pixel_values": pixels, "image_grid_thw": grids}
    return packed, padded


def time_steps(model: Any, batch: dict[str, Any], attn: str, steps: int, sync: Any) -> float:
    model.set_attn_implementation(attn)
    times = []
    for _ in range(steps + 1):
        model.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        model(**batch, use_cache=False).loss.backward()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times[1:]))  # the first is warm-up


def bench_step(args: argparse.Namespace, device: str = "cpu") -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        print("gpu: skipped, no CUDA device here (run this section on a GPU machine)")
        return
    big = device == "cuda"
    dtype = torch.bfloat16 if big else torch.float32
    model = vl_model(device, dtype, big)
    cfg = model.config
    row = 3 * 2 * 14 * 14
    sync = torch.cuda.synchronize if big else (lambda: None)
    name = torch.cuda.get_device_name() if big else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}: Qwen2-VL hidden {cfg.text_config.hidden_size} x {cfg.text_config.num_hidden_layers} layers, {dtype}")
    for n_docs, seed in ((args.step_docs, 0), (args.step_docs, 1)):
        docs, n_tokens = vl_step_batches(n_docs, seed, 0, cfg.image_token_id, cfg.vision_start_token_id,
                                         cfg.vision_end_token_id, cfg.text_config.vocab_size, row, big)
        packed, padded = vl_inputs(model, docs, device, dtype)
        slots = padded["input_ids"].numel()
        t_pad = time_steps(model, padded, "sdpa", args.steps, sync)
        t_pack = time_steps(model, packed, "packtool", args.steps, sync)
        print(f"{n_docs} documents, {n_tokens} tokens ({slots} padded slots, {1 - n_tokens / slots:.0%} padding), "
              f"{len(packed['image_grid_thw'])} images: padded {t_pad * 1e3:.0f} ms ({n_tokens / t_pad:.0f} tokens/s), "
              f"packed {t_pack * 1e3:.0f} ms ({n_tokens / t_pack:.0f} tokens/s): {t_pad / t_pack:.2f}x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = ["pack", "loader", "tokenize", "padding", "step", "gpu"]
    parser.add_argument("section", nargs="*", choices=names, help="sections to run (default: all, as `make bench` runs it)")
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--photos", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lf-python", default=".venv-llamafactory/bin/python")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--step-docs", type=int, default=16)
    args: Any = parser.parse_args(argv)
    sections = {"pack": bench_pack, "loader": bench_loader, "tokenize": bench_tokenize, "padding": bench_padding,
                "step": bench_step, "gpu": lambda a: bench_step(a, "cuda")}
    for name in args.section or names:
        print(f"== {name}", flush=True)
        sections[name](args)


if __name__ == "__main__":
    main()
