"""A hub chat dataset to token ids: `datasets.load_dataset` + `map(apply_chat_template + tokenize)` against
`packtool tokenize hf://datasets/...`, on the same records, from the same loopback hub.

The hub is `tests/hub_loopback.py` on 127.0.0.1 (no network): a dataset repo laid out as `push_to_hub` writes
it (`data/train-0000i-of-0000n.parquet` + a card), holding generated ShareGPT-like records (`conversations` of
`{from, value}`: an optional system prompt, 1-8 human/gpt exchanges of a few to ~150 words, as
`bench_chat.py --shape short`). The tokenizer is bench_chat's >= 100k byte-level BPE with the Qwen3 chat
template (cached under bench_out/chat/).

Each side runs as a fresh process with an empty HF_HOME (so both download the dataset), timed whole
(interpreter start, imports, download, tokenizing, exit), its peak memory sampled as the summed RSS of its
process tree (the `map` workers included), and the bytes it leaves on disk counted after it exits (every
regular file under HF_HOME: the hub cache, and datasets' Arrow cache of the loaded and the mapped dataset;
for packtool the hub cache and the token store). The `datasets` side is what users write:

    ds = load_dataset(NAME, split="train")
    ds = ds.map(lambda ex: tok(tok.apply_chat_template(to_messages(ex["conversations"]), tokenize=False),
                               add_special_tokens=False), num_proc=os.cpu_count(), remove_columns=ds.column_names)

and the two sides' ids are compared (the same tokens, in the same order).

Run: python scripts/bench_hub.py [--records 30000] [--shards 4] [--repeats 1]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
NAME = "bench/sharegpt"

DATASETS_SIDE = """
import hashlib, json, os, sys, time
import numpy as np
from datasets import load_dataset
from transformers import AutoTokenizer
ROLES = {"human": "user", "gpt": "assistant", "system": "system"}
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ds = load_dataset(sys.argv[2], split="train")
def encode(example):
    messages = [{"role": ROLES[t["from"]], "content": t["value"]} for t in example["conversations"]]
    text = tok.apply_chat_template(messages, tokenize=False)
    return tok(text, add_special_tokens=False)
ds = ds.map(encode, num_proc=os.cpu_count(), remove_columns=ds.column_names)
ids = np.concatenate([np.asarray(x, dtype=np.uint32) for x in ds["input_ids"]])
print(json.dumps({"documents": len(ds), "tokens": int(ids.size), "sha256": hashlib.sha256(ids.tobytes()).hexdigest()}))
"""


def records(n: int, seed: int = 0) -> list[dict[str, object]]:
    from bench_chat import lexicon, short_conversation

    rng = np.random.default_rng(seed)
    words = lexicon(rng)
    probs = np.cumsum(1.0 / np.arange(1, len(words) + 1) ** 1.1)
    probs /= probs[-1]
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    out = []
    for i in range(n):
        turns = [{"from": names[str(m["role"])], "value": m["content"]} for m in short_conversation(rng, words, probs)]
        out.append({"id": f"conv-{i}", "conversations": turns})
    return out


def tokenizer_dir() -> Path:
    from bench_chat import build_tokenizer, lexicon

    return build_tokenizer(lexicon(np.random.default_rng(0)))


def shards(rows: list[dict[str, object]], n: int) -> dict[str, bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {"README.md": b"---\nlicense: cc0-1.0\ntask_categories: [text-generation]\n---\n# generated ShareGPT\n"}
    bounds = np.linspace(0, len(rows), n + 1).astype(int)
    for i in range(n):
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows[bounds[i] : bounds[i + 1]]), sink)
        files[f"data/train-{i:05d}-of-{n:05d}.parquet"] = sink.getvalue()
    return files


def tree_rss(pid: int) -> int:
    """Summed RSS (bytes) of `pid` and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def measured(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """(wall seconds, peak tree RSS bytes, stdout) of a command run to its end."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    got: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: got.append(proc.communicate()))
    reader.start()
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    reader.join()
    seconds = time.perf_counter() - start
    out, err = got[0] if got else ("", "")
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {err[-3000:]}")
    return seconds, peak, out


def disk_bytes(*roots: Path) -> int:
    """Bytes of the regular files under `roots` (links not followed: a hub snapshot links into blobs/)."""
    total = 0
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                path = os.path.join(dirpath, name)
                if not os.path.islink(path):
                    total += os.lstat(path).st_size
    return total


def packtool_ids(store: Path) -> tuple[int, int, str]:
    from packtool.formats.token_store import open_token_store

    s = open_token_store(store)
    ids = np.asarray(s.tokens, dtype=np.uint32)
    return int(s.manifest["n_documents"]), int(ids.size), hashlib.sha256(ids.tobytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=30_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from hub_loopback import loopback_hub

    tok = tokenizer_dir()
    rows = records(args.records)
    files = shards(rows, args.shards)
    data_mb = sum(len(v) for v in files.values()) / 1e6
    print(f"{args.records} ShareGPT-like records, {args.shards} parquet shards, {data_mb:.1f} MB; {os.cpu_count()} cores")
    results: dict[str, list[tuple[float, int, int]]] = {"datasets": [], "packtool": []}
    parts: dict[str, str] = {}
    checks: dict[str, tuple[int, int, str]] = {}
    with loopback_hub(lifetime=3600) as hub, tempfile.TemporaryDirectory(dir=ROOT / "bench_out") as tmp:
        hub.dataset(NAME, files)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
        base.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_TELEMETRY="1", PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1",
                    HF_HUB_DISABLE_PROGRESS_BARS="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1", TOKENIZERS_PARALLELISM="true")  # fmt: skip
        for rep in range(args.repeats):
            for side in ("datasets", "packtool"):
                home = Path(tmp) / f"{side}-{rep}"
                env = {**base, "HF_HOME": str(home)}
                if side == "datasets":
                    cmd = [sys.executable, "-c", DATASETS_SIDE, str(tok), NAME]
                    seconds, peak, out = measured(cmd, env)
                    checks[side] = tuple(json.loads(out.strip().splitlines()[-1]).values())  # type: ignore[assignment]
                    disk = disk_bytes(home)
                    parts[side] = (f"hub cache {disk_bytes(home / 'hub') / 1e6:.1f} MB + Arrow cache "
                                   f"{disk_bytes(home / 'datasets') / 1e6:.1f} MB")  # fmt: skip
                else:
                    store = Path(tmp) / f"store-{rep}"
                    cmd = [sys.executable, "-m", "packtool", "tokenize", f"hf://datasets/{NAME}", "--format", "sharegpt",
                           "--tokenizer", str(tok), "--output", str(store), "-q"]  # fmt: skip
                    seconds, peak, _ = measured(cmd, env)
                    checks[side] = packtool_ids(store)
                    disk = disk_bytes(home, store)
                    sizes = ", ".join(f"{p.name} {p.stat().st_size / 1e6:.1f}" for p in sorted(store.iterdir()))
                    parts[side] = f"hub cache {disk_bytes(home / 'hub') / 1e6:.1f} MB + token store ({sizes} MB)"
                results[side].append((seconds, peak, disk))
                print(f"  {side:9s} run {rep}: {seconds:7.1f} s, peak RSS {peak / 2**20:7.0f} MiB, "
                      f"disk {disk / 1e6:7.1f} MB", flush=True)  # fmt: skip
    same = checks["datasets"] == checks["packtool"]
    print(f"ids: datasets {checks['datasets'][:2]} vs packtool {checks['packtool'][:2]} documents/tokens: "
          f"{'identical' if same else 'DIFFERENT'}")  # fmt: skip
    best = {side: min(runs) for side, runs in results.items()}
    (ds_s, ds_rss, ds_disk), (pt_s, pt_rss, pt_disk) = best["datasets"], best["packtool"]
    print(f"wall: datasets {ds_s:.1f} s, packtool {pt_s:.1f} s -> {ds_s / pt_s:.1f}x faster (goal >= 5x)")
    print(f"peak memory: datasets {ds_rss / 2**20:.0f} MiB, packtool {pt_rss / 2**20:.0f} MiB")
    print(f"disk, datasets: {parts['datasets']}\ndisk, packtool: {parts['packtool']}")
    print(f"disk: datasets {ds_disk / 1e6:.1f} MB, packtool {pt_disk / 1e6:.1f} MB -> {pt_disk / ds_disk:.2f} of it "
          "(goal <= 1/3)")  # fmt: skip


if __name__ == "__main__":
    main()
