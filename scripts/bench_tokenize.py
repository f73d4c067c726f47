"""Tokenize speed: `packtool tokenize` against a bare script doing the same work, in the same run.

The bare script is what a user would write by hand with the same library: load the tokenizer,
read the file, orjson-parse every line, `fastokens.encode_batch_flat` everything, `tofile` the
ids and the document ends. It promises nothing: no EOS, no verification against `tokenizers`,
no hashes, no resume, no atomic rename. Both run as fresh processes (start-up, imports and the
tokenizer load included), alternately, so noise from other jobs on a shared machine hits both alike.

Inputs, built once and cached under bench_out/ (reused while their parameters match):
- a byte-level BPE with a 131,072-token vocabulary (Qwen2's pre-tokenizer regex), trained with
  `tokenizers` on this interpreter's standard library;
- a >= 128 MB jsonl corpus of real Python source: every `.py` file of the packages installed
  beside this interpreter, one document per file, in sorted order;
- a >= 1 GB jsonl corpus: the same files, cycled (skip it with PACKTOOL_BENCH_SKIP_1GB=1).

Parts: (1) packtool `--backend fast` vs the bare script on 128 MB: every pair's ratio and best vs
best (target >= 0.8), with the ids checked equal; (2) `--backend hf` end to end vs
`Tokenizer.encode_batch_fast` over the same texts already in memory (target >= 0.9), in-process;
(3) tokens/s and peak RSS on 1 GB (target >= 20M tokens/s on 2 cores, < 1 GB); (4) readers:
the same records as a `.json` array, an Arrow stream and a CSV file, planned and read (no tokenizing) vs jsonl
(`--sources-only` runs just this part; it needs no tokenizer).

Run: python scripts/bench_tokenize.py [--mb 128] [--gb 1] [--repeat 3] [--workers N]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench_out"
VOCAB = 131_072
#: Qwen2's pre-tokenizer split (digits one by one, letters with one leading non-letter, ...)
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BARE = '''\
import sys, numpy as np, orjson, fastokens
tok = fastokens.Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], "rb") as fh, open(sys.argv[3] + ".bin", "wb") as ids_out, open(sys.argv[3] + ".ends", "wb") as ends_out:
    base = 0
    while lines := fh.readlines(1 << 28):  # 256 MB of lines per call (one call for the 128 MB corpus)
        ids, offsets = tok.encode_batch_flat([orjson.loads(line)["text"] for line in lines], add_special_tokens=True)
        ids_out.write(ids)
        (np.frombuffer(offsets, "<u8")[1:].astype("<i8") + base).tofile(ends_out)
        base += len(ids) // 4
'''


def build_tokenizer(directory: Path) -> Path:
    """A 131k byte-level BPE trained on the standard library's sources (cached)."""
    if (directory / "tokenizer.json").is_file():
        return directory
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((p.read_text("utf-8", errors="replace") for p in files), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "name_or_path": "bench/python-bpe-131k"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    print(f"built {directory} (vocab {tok.get_vocab_size()})")
    return directory


def build_corpus(path: Path, target: int) -> Path:
    """Python sources installed beside this interpreter, one document per file, cycled up to `target` bytes."""
    import orjson

    if path.is_file() and path.stat().st_size >= target:
        return path
    roots = {Path(p) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])}
    files = sorted({f for root in roots for f in root.rglob("*.py")}, key=str)
    size = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        while size < target:
            for f in files:
                text = f.read_text("utf-8", errors="replace")
                if text.strip():
                    line = orjson.dumps({"text": text}) + b"\n"
                    out.write(line)
                    size += len(line)
                    if size >= target:
                        break
    tmp.replace(path)
    return path


#: runs argv[1:] and prints its wall, CPU and peak RSS. A small launcher because Linux carries the
#: parent's RSS high-water mark across fork + exec into the child's ru_maxrss: measured from this
#: (large, after the in-process part) process, a child would report this process's peak instead.
_LAUNCH = """
import os, subprocess, sys, time
start = time.perf_counter()
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = proc.stderr.read().decode()
_, status, usage = os.wait4(proc.pid, 0)
code = os.waitstatus_to_exitcode(status)
print(time.perf_counter() - start, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, code)
sys.stderr.write(err)
"""


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system, all threads) and peak RSS (MiB) of one child process."""
    done = subprocess.run([sys.executable, "-c", _LAUNCH, *cmd], capture_output=True, text=True, env=env)
    seconds, cpu, rss, code = done.stdout.split()
    if int(code) != 0 or done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    return float(seconds), float(cpu), float(rss)


def packtool_cmd(corpus: Path, tok: Path, out: Path, workers: int, backend: str = "fast") -> list[str]:
    return [sys.executable, "-m", "packtool", "tokenize", str(corpus), "--tokenizer", str(tok), "--output", str(out),
            "--backend", backend, "--workers", str(workers), "-q"]


def check_same_ids(store: Path, bare: Path) -> int:
    """packtool's ids minus its appended EOS == the bare script's ids; returns the bare token count."""
    ids = np.fromfile(store / "tokens.bin", np.uint32)
    ends = np.fromfile(store / "tokens.boundaries", np.int64)
    keep = np.ones(ids.size, bool)
    keep[ends - 1] = False
    bare_ids = np.fromfile(str(bare) + ".bin", np.uint32)
    bare_ends = np.fromfile(str(bare) + ".ends", np.int64)
    if not (np.array_equal(ids[keep], bare_ids) and np.array_equal(ends - np.arange(1, ends.size + 1), bare_ends)):
        raise SystemExit(f"packtool's ids differ from the bare script's ({store})")
    return int(bare_ids.size)


def part_bare(corpus: Path, tok: Path, args: argparse.Namespace, env: dict[str, str]) -> None:
    bare_py = OUT / "bare_tokenize.py"
    bare_py.write_text(BARE)
    bare_cmd = [sys.executable, str(bare_py), str(tok / "tokenizer.json"), str(corpus), str(OUT / "bare")]
    store = OUT / "store_fast"
    pairs: list[tuple[float, float]] = []
    cpu: list[tuple[float, float]] = []
    rss = 0.0
    for _ in range(args.repeat):
        t_bare, c_bare, _ = timed(bare_cmd, env)
        shutil.rmtree(store, ignore_errors=True)
        t_pack, c_pack, rss = timed(packtool_cmd(corpus, tok, store, args.workers), env)
        pairs.append((t_bare, t_pack))
        cpu.append((c_bare, c_pack))
    n = check_same_ids(store, OUT / "bare")
    best_bare, best_pack = min(p[0] for p in pairs), min(p[1] for p in pairs)
    cpu_bare, cpu_pack = min(c[0] for c in cpu), min(c[1] for c in cpu)
    print(f"(1) {corpus.stat().st_size / 1e6:.0f} MB, {n / 1e6:.1f}M tokens (+EOS), --backend fast, {args.workers} workers:")
    print(f"    bare script : best {best_bare:.2f} s  {n / best_bare / 1e6:6.1f}M tokens/s  CPU {cpu_bare:.2f} s")
    print(f"    packtool    : best {best_pack:.2f} s  {n / best_pack / 1e6:6.1f}M tokens/s  CPU {cpu_pack:.2f} s"
          f"  peak RSS {rss:.0f} MiB")
    print(f"    ratio bare/packtool per pair: {', '.join(f'{b / p:.2f}' for b, p in pairs)};"
          f" best vs best {best_bare / best_pack:.2f} (target >= 0.8); CPU {cpu_bare / cpu_pack:.2f}; ids equal")


def part_hf(corpus: Path, tok: Path, args: argparse.Namespace) -> None:
    import orjson
    from tokenizers import Tokenizer

    import packtool

    slice_path = OUT / f"corpus-{args.hf_mb}mb.jsonl"
    if not slice_path.is_file():
        with open(corpus, "rb") as src, open(slice_path, "wb") as dst:
            dst.writelines(src.readlines(args.hf_mb * 1_000_000))
    texts = [orjson.loads(line)["text"] for line in slice_path.read_bytes().splitlines()]
    config = packtool.TokenizeConfig(inputs=(str(slice_path),), tokenizer=str(tok), output=str(OUT / "store_hf"),
                                     backend="hf", workers=args.workers)  # type: ignore[arg-type]
    runs_a, runs_b, cpu_a, cpu_b = [], [], [], []
    n_b = 0
    for _ in range(args.repeat):
        shutil.rmtree(OUT / "store_hf", ignore_errors=True)
        start, cpu = time.perf_counter(), time.process_time()
        result = packtool.tokenize_corpus(dataclasses.replace(config))
        runs_a.append(time.perf_counter() - start)
        cpu_a.append(time.process_time() - cpu)
        hf = Tokenizer.from_file(str(tok / "tokenizer.json"))  # fresh, as in the pipeline: a cold word cache
        start, cpu = time.perf_counter(), time.process_time()
        n_b = sum(len(e) for i in range(0, len(texts), 4096) for e in hf.encode_batch_fast(texts[i : i + 4096]))
        runs_b.append(time.perf_counter() - start)
        cpu_b.append(time.process_time() - cpu)
    n_a = int(result.manifest["n_tokens"]) - int(result.manifest["n_documents"])  # minus the appended EOS
    if n_a != n_b:
        raise SystemExit(f"hf backend: {n_a} tokens vs encode_batch_fast {n_b}")
    print(f"(2) {slice_path.stat().st_size / 1e6:.0f} MB, {n_a / 1e6:.1f}M tokens, --backend hf, in-process:")
    print(f"    tokenize_corpus end to end (tokenizer load included): best {min(runs_a):.2f} s, CPU {min(cpu_a):.2f} s")
    print(f"    encode_batch_fast, texts in memory                    : best {min(runs_b):.2f} s, CPU {min(cpu_b):.2f} s")
    print(f"    ratio per pair: {', '.join(f'{b / a:.2f}' for a, b in zip(runs_a, runs_b, strict=True))};"
          f" best vs best {min(runs_b) / min(runs_a):.2f} (target >= 0.9); CPU {min(cpu_b) / min(cpu_a):.2f}")


def part_large(corpus: Path, tok: Path, args: argparse.Namespace, env: dict[str, str]) -> None:
    store = OUT / "store_1gb"
    shutil.rmtree(store, ignore_errors=True)
    seconds, cpu, rss = timed(packtool_cmd(corpus, tok, store, args.workers), env)
    manifest = json.loads((store / "manifest.json").read_text())
    n = int(manifest["n_tokens"])
    print(f"(3) {corpus.stat().st_size / 1e9:.2f} GB, {n / 1e6:.0f}M tokens, --backend fast, {args.workers} workers:")
    print(f"    packtool: {seconds:.2f} s, {n / seconds / 1e6:.1f}M tokens/s (target >= 20M on 2 cores), "
          f"peak RSS {rss:.0f} MiB (target < 1024)")
    print(f"    CPU {cpu:.1f} s (user + system): {n / cpu / 1e6:.1f}M tokens per CPU-second")
    shutil.rmtree(store, ignore_errors=True)


def part_profile(corpus: Path, tok: Path) -> None:
    """Each step of the work alone, in this process: CPU seconds (what a busy machine pays)."""
    import hashlib

    import fastokens
    import orjson
    from tokenizers import Tokenizer

    from packtool.core.encoding.encode import SpecialPolicy, frame
    from packtool.stages.tokenize.backend_choice import VERIFY_CHARS, verification_sample
    from packtool.stages.tokenize.engine.tokenizer import load_tokenizer
    from packtool.stages.tokenize.inputs.plan import plan_chunks

    path = str(tok / "tokenizer.json")
    steps: list[tuple[str, float]] = []

    def step(name: str, fn: object) -> object:
        start = time.process_time()
        out = fn()  # type: ignore[operator]
        steps.append((name, time.process_time() - start))
        return out

    os.environ["RAYON_NUM_THREADS"] = "1"  # CPU of the encode itself, not of idle Rayon workers
    fast = step("fastokens.Tokenizer.from_file (both)", lambda: fastokens.Tokenizer.from_file(path))
    step("tokenizers.Tokenizer.from_file (packtool: reference)", lambda: Tokenizer.from_file(path))
    hf, _ = step("load_tokenizer: reference + its description (packtool)", lambda: load_tokenizer(str(tok)))  # type: ignore[misc]
    step("plan chunks: read + count newlines (packtool)", lambda: plan_chunks([corpus], 16 << 20))
    data = step("read the file (both)", corpus.read_bytes)
    step("sha256 of the input (packtool)", lambda: hashlib.sha256(data).hexdigest())  # type: ignore[arg-type]
    lines = step("split into lines (bare)", data.splitlines)  # type: ignore[union-attr]
    texts = step("orjson.loads every line (both)", lambda: [orjson.loads(x)["text"] for x in lines])  # type: ignore[union-attr]
    sample = verification_sample(texts)  # type: ignore[arg-type]
    step(f"verification: tokenizers on the first {len(sample)} docs / {VERIFY_CHARS >> 10} KiB (packtool)",
         lambda: hf.encode_batch_fast(sample))  # type: ignore[union-attr]
    batches: list[list[str]] = [[]]
    chars = 0
    for text in texts:  # type: ignore[union-attr]
        batches[-1].append(text)
        chars += len(text)
        if chars >= 2_000_000:
            batches.append([])
            chars = 0
    pieces = step("fastokens.encode_batch_flat, 2 MB batches (both)",
                  lambda: [fast.encode_batch_flat(b, add_special_tokens=True) for b in batches])  # type: ignore[union-attr]
    arrays = [(np.frombuffer(a, "<u4"), np.diff(np.frombuffer(b, "<u8")).astype(np.int64)) for a, b in pieces]  # type: ignore[union-attr]
    policy = SpecialPolicy(add_special_tokens=True, append=0)  # EOS appended, as packtool does by default
    framed = step("append EOS (frame, packtool)", lambda: [frame(ids, n, None, policy) for ids, n in arrays])
    step("sha256 of the output ids (packtool)", lambda: [hashlib.sha256(f[0]).digest() for f in framed])  # type: ignore[union-attr]
    with open(OUT / "profile.bin", "wb") as fh:
        step("write the ids (both)", lambda: [fh.write(f[0]) for f in framed])  # type: ignore[union-attr]
    (OUT / "profile.bin").unlink()
    print(f"(0) CPU seconds of each step alone ({corpus.stat().st_size / 1e6:.0f} MB):")
    for name, seconds in steps:
        print(f"    {seconds:6.3f}  {name}")


def part_sources(corpus: Path, repeat: int) -> None:
    """Reader throughput, in this process: plan + read every record of the same corpus per source kind."""
    import orjson
    import pyarrow as pa

    from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk

    array = corpus.with_suffix(".json")
    arrow = corpus.with_suffix(".arrow")
    table_csv = corpus.with_suffix(".csv")
    if not array.is_file() or array.stat().st_mtime < corpus.stat().st_mtime:
        with open(corpus, "rb") as src, open(array.with_suffix(".tmp"), "wb") as out:
            out.write(b"[")
            for i, line in enumerate(src):
                out.write((b",\n" if i else b"") + line.rstrip(b"\n"))
            out.write(b"]")
        array.with_suffix(".tmp").replace(array)
    if not arrow.is_file() or arrow.stat().st_mtime < corpus.stat().st_mtime:
        texts = [orjson.loads(line)["text"] for line in corpus.read_bytes().splitlines()]
        table = pa.table({"text": texts})
        with pa.OSFile(str(arrow.with_suffix(".tmp")), "wb") as fh, pa.ipc.new_stream(fh, table.schema) as w:
            w.write_table(table, max_chunksize=1000)  # datasets' writer_batch_size
        arrow.with_suffix(".tmp").replace(arrow)
    if not table_csv.is_file() or table_csv.stat().st_mtime < corpus.stat().st_mtime:
        import csv

        with open(corpus, "rb") as src, open(table_csv.with_suffix(".tmp"), "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)  # Python's csv quoting, as pandas and datasets write it
            writer.writerow(["text"])
            writer.writerows([orjson.loads(line)["text"]] for line in src)
        table_csv.with_suffix(".tmp").replace(table_csv)
    best: dict[str, float] = {}
    sources = (("jsonl", corpus), (".json array", array), ("Arrow stream", arrow), ("CSV", table_csv))
    for _ in range(repeat):  # interleaved, best of each
        for name, path in sources:
            start = time.perf_counter()
            _, chunks = plan_chunks([path], 16 << 20)
            n = sum(1 for c in chunks for r in read_chunk(c) if r.value is not None)
            best[name] = min(best.get(name, 1e9), time.perf_counter() - start)
    mb = corpus.stat().st_size / 1e6
    print(f"(4) readers, plan + read {n} records ({mb:.0f} MB of text), best of {repeat}, one thread:")
    for name, seconds in best.items():
        ratio = best["jsonl"] / seconds
        print(f"    {name:13s} {seconds:6.2f} s  {mb / seconds:6.0f} MB/s  x{ratio:.2f} of jsonl's throughput")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="size of the main corpus in MB (>= 100)")
    parser.add_argument("--hf-mb", type=int, default=48, help="size of the hf-backend slice in MB")
    parser.add_argument("--gb", type=float, default=1.0, help="size of the large corpus in GB")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved pairs; best of each is reported")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--profile-only", action="store_true", help="only the per-step CPU breakdown")
    parser.add_argument("--sources-only", action="store_true", help="only part 4 (readers, no tokenizer)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if args.sources_only:
        part_sources(build_corpus(OUT / f"corpus-{args.mb}mb.jsonl", args.mb * 1_000_000), args.repeat)
        return
    tok = build_tokenizer(OUT / "tokenizer-131k")
    corpus = build_corpus(OUT / f"corpus-{args.mb}mb.jsonl", args.mb * 1_000_000)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; python {sys.version.split()[0]}")
    if not args.profile_only:
        part_bare(corpus, tok, args, env)
        part_hf(corpus, tok, args)
    if args.profile_only:
        pass
    elif os.environ.get("PACKTOOL_BENCH_SKIP_1GB"):
        print("(3) skipped (PACKTOOL_BENCH_SKIP_1GB is set)")
    else:
        part_large(build_corpus(OUT / f"corpus-{args.gb:g}gb.jsonl", int(args.gb * 1e9)), tok, args, env)
    if not args.profile_only:
        part_sources(corpus, args.repeat)
    part_profile(corpus, tok)  # last: it pins the Rust thread pools of this process to one thread
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
