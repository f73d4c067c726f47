"""Tokenize throughput: --backend hf|fast x --workers 1|2 x --executor local|ray, vs the raw tokenizer ceiling.

Usage: python scripts/bench_scale.py [--tokenizer DIR] [--mb 8] [--no-ray]

The corpus is real text (Python sources and docs from the installed packages, plus Zipf-length
prose) written to a temp jsonl. The ceilings are `tokenizers.encode_batch_fast` and
`fastokens.encode_batch_flat` on the same texts in this process; every pipeline row is printed
as tokens/s and as a ratio to the hf ceiling measured in the same run. Output bytes are
checked identical across all rows.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def corpus(mb: float) -> list[str]:
    from support import zipf_texts

    files = sorted(glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "**", "*.py"), recursive=True))
    random.Random(1).shuffle(files)
    texts, size = zipf_texts(4000, seed=7), 0
    for f in files:
        try:
            text = Path(f).read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        size += len(text.encode())
        if size > mb * 2**20:
            break
    return texts


def ceiling(name: str, path: str, texts: list[str]) -> tuple[int, float]:
    import numpy as np

    if name == "hf":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        t0 = time.perf_counter()
        n = sum(len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=True))
        return n, time.perf_counter() - t0
    import fastokens

    ftok = fastokens.Tokenizer.from_file(path)
    t0 = time.perf_counter()
    ids, _ = ftok.encode_batch_flat(texts, add_special_tokens=True)
    return int(np.frombuffer(ids, np.uint32).size), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default=str(ROOT / "data" / "sample" / "tokenizer"))
    ap.add_argument("--mb", type=float, default=8.0)
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()

    from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus
    from packtool.stages.tokenize.engine.tokenizer import locate

    tok_json = str(locate(args.tokenizer)[0])
    texts = corpus(args.mb)
    work = Path(tempfile.mkdtemp(prefix="bench_scale_"))
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    mb = data.stat().st_size / 2**20
    print(f"corpus: {len(texts)} documents, {mb:.1f} MiB jsonl, tokenizer {tok_json}, {os.cpu_count()} cores")

    rows: list[tuple[str, int, float]] = []
    for name in ("hf", "fast"):
        n, s = ceiling(name, tok_json, texts)
        rows.append((f"ceiling {name} (in-process, all threads)", n, s))
    base = rows[0][1] / rows[0][2]

    executors = ["local"] + ([] if args.no_ray else ["ray"])
    if "ray" in executors:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    digests = set()
    try:
        for executor in executors:
            for backend in ("hf", "fast"):
                for workers in (1, 2):
                    out = work / f"{executor}_{backend}_{workers}"
                    t0 = time.perf_counter()
                    result = tokenize_corpus(TokenizeConfig((str(data),), args.tokenizer, str(out), workers=workers,
                                                            backend=backend, executor=executor, chunk_bytes=1 << 20))
                    rows.append((f"tokenize --backend {backend} --workers {workers} --executor {executor}",
                                 int(result.manifest["n_tokens"]), time.perf_counter() - t0))
                    digests.add(hashlib.sha256((out / "tokens.bin").read_bytes()).hexdigest())
    finally:
        if "ray" in executors:
            ray.shutdown()
    print(f"{'run':58s} {'tokens':>10s} {'s':>7s} {'Mtok/s':>7s} {'MiB/s':>6s} {'x hf ceiling':>12s}")
    for label, n, s in rows:
        print(f"{label:58s} {n:10d} {s:7.2f} {n / s / 1e6:7.2f} {mb / s:6.1f} {n / s / base:12.2f}")
    print(f"tokens.bin identical across all {len(rows) - 2} pipeline runs: {len(digests) == 1}")


if __name__ == "__main__":
    main()
