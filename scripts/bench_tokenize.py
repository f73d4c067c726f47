"""Tokenize throughput: the `tokenize_corpus` library call vs the Rust tokenizer's own ceiling.

Builds its own corpus (CPython standard-library sources cut into Zipf-length documents, written
to a temporary .jsonl) and uses the shipped 8k byte-level BPE (data/sample/tokenizer), then reports
tokens/s of
  (a) `packtool.tokenize_corpus` end to end (read + parse + encode + write + hash), all cores,
  (b) the ceiling: `Tokenizer.encode_batch_fast` over the same texts already in memory, same threads,
  (c) a per-document `Tokenizer.encode` loop (on a sample, extrapolated),
and prints a/b (target >= 0.9) and b/c, plus peak RSS of the coordinator and of the worker processes.

Run: python scripts/bench_tokenize.py [--mb 60] [--workers N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "data" / "sample" / "tokenizer"


def build_corpus(path: Path, target_bytes: int, seed: int = 0) -> list[str]:
    """Standard-library source text cut into documents with Zipf-like lengths (many short, a long tail)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text("utf-8", errors="replace") for p in sorted(stdlib.glob("*.py")))
    rng = np.random.default_rng(seed)
    docs: list[str] = []
    size = 0
    with open(path, "w", encoding="utf-8") as fh:
        while size < target_bytes:
            length = int(min(rng.zipf(1.5) * 60, 200_000))
            start = int(rng.integers(0, max(1, len(text) - length)))
            doc = text[start : start + length]
            fh.write(json.dumps({"text": doc}) + "\n")
            docs.append(doc)
            size += len(doc)
    return docs


def ceiling(tok: object, texts: list[str], batch: int = 4096) -> tuple[int, float]:
    """encode_batch_fast over in-memory texts, batched like the pipeline batches."""
    n = 0
    start = time.perf_counter()
    for i in range(0, len(texts), batch):
        for enc in tok.encode_batch_fast(texts[i : i + batch]):  # type: ignore[attr-defined]
            n += len(enc)
    return n, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=60.0, help="corpus size in MB of text")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved (a)/(b) pairs; best of each is reported")
    parser.add_argument("--loop-share", type=float, default=0.05, help="share of documents for the per-document loop")
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.workers > 1 else "false"
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))

    from tokenizers import Tokenizer

    import packtool
    from packtool.exec.local import process_executor as local_executor
    from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus

    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    with tempfile.TemporaryDirectory(prefix="bench_tokenize_") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        texts = build_corpus(corpus, int(args.mb * 1e6))
        print(f"corpus: {len(texts)} documents, {corpus.stat().st_size / 1e6:.1f} MB jsonl, {args.workers} workers, "
              f"packtool {packtool.__version__}, tokenizer {TOKENIZER.name} (vocab {tok.get_vocab_size()})")

        extra = {"backend": "hf"} if "backend" in {f.name for f in dataclasses.fields(TokenizeConfig)} else {}
        config = TokenizeConfig(inputs=(str(corpus),), tokenizer=str(TOKENIZER), output=str(Path(tmp) / "store"),
                                workers=args.workers, **extra)  # type: ignore[arg-type]
        # (a) and (b) alternate, so that noise from other jobs on a shared machine hits both alike
        runs_a: list[float] = []
        runs_b: list[float] = []
        for i in range(max(1, args.repeat)):
            start = time.perf_counter()
            result = tokenize_corpus(dataclasses.replace(config, output=str(Path(tmp) / f"store{i}")))
            runs_a.append(time.perf_counter() - start)
            n_b, t = ceiling(tok, texts)
            runs_b.append(t)
        t_a, t_b = min(runs_a), min(runs_b)
        n_a = int(result.manifest["n_tokens"]) - int(result.manifest["n_documents"])  # minus the appended EOS
        print(f"(a) tokenize_corpus end to end : {n_a / t_a / 1e6:7.3f} M tokens/s  ({n_a} tokens in {t_a:.2f}s, "
              f"{result.n_chunks} chunks, best of {len(runs_a)})")
        print(f"(b) encode_batch_fast ceiling  : {n_b / t_b / 1e6:7.3f} M tokens/s  ({n_b} tokens in {t_b:.2f}s, "
              f"best of {len(runs_b)})")
        pairs = sorted(tb / ta for ta, tb in zip(runs_a, runs_b, strict=True))
        print(f"    a/b of each interleaved pair: {', '.join(f'{r:.3f}' for r in pairs)}")

        # the alternative design: one process, chunks in order, the Rust tokenizer's own threads per batch
        threads_config = dataclasses.replace(config, output=str(Path(tmp) / "store_threads"))
        start = time.perf_counter()
        tokenize_corpus(threads_config, executor=lambda tasks: (task.run() for task in tasks))
        t_t = time.perf_counter() - start
        print(f"(a') same, one process + tokenizer threads: {n_a / t_t / 1e6:7.3f} M tokens/s  ({t_t:.2f}s)")

        # and the process pool, given enough chunks to balance (2 per worker)
        pool_config = dataclasses.replace(config, output=str(Path(tmp) / "store_pool"),
                                          chunk_bytes=max(1 << 20, corpus.stat().st_size // (4 * args.workers)))
        start = time.perf_counter()
        tokenize_corpus(pool_config, executor=local_executor(args.workers))
        t_p = time.perf_counter() - start
        print(f"(a'') same, {args.workers} processes over {4 * args.workers} chunks: {n_a / t_p / 1e6:7.3f} M tokens/s  ({t_p:.2f}s)")

        rng = np.random.default_rng(1)
        sample = [texts[i] for i in rng.choice(len(texts), max(1, int(len(texts) * args.loop_share)), replace=False)]
        start = time.perf_counter()
        n_c = sum(len(tok.encode(t)) for t in sample)
        t_c = time.perf_counter() - start
        print(f"(c) per-document encode loop   : {n_c / t_c / 1e6:7.3f} M tokens/s  (sample of {len(sample)} documents)")
        if n_a != n_b:
            print(f"WARNING: token counts differ: pipeline {n_a} vs ceiling {n_b}", file=sys.stderr)
        print(f"a/b = {(n_a / t_a) / (n_b / t_b):.3f}   (best vs best; target >= 0.9)")
        print(f"a'/b = {(n_a / t_t) / (n_b / t_b):.3f}   (one process, tokenizer threads)")
        print(f"a''/b = {(n_a / t_p) / (n_b / t_b):.3f}  (process pool, 4 chunks per worker)")
        print(f"b/c = {(n_b / t_b) / (n_c / t_c):.3f}")
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(f"peak RSS: coordinator {own:.0f} MiB (includes the in-memory texts of (b)), largest worker {kids:.0f} MiB")


if __name__ == "__main__":
    main()
