"""`packtool export` to each trainer format vs the `pack` run that wrote the same store, in one process.

    python scripts/bench_export.py [--copies 20] [--size 4096] [--repeats 3]

Builds two token stores with the real pipeline from the shipped sample data, repeated `--copies`
times so the stores hold a few million tokens: a text store (every token a target) and a chat store
tokenized with --eos (loss mask: assistant turns), both packed with --overlong drop so every target
(olmo-core included) accepts them. Then, interleaved `--repeats` times, it times the `pack_store`
library call (the baseline: what `packtool pack` costs for this store, planning + writing) and
`export_store` to each target, and prints best-of times and the ratio export / pack. The page cache
is warm for both (the token store for pack, the pack store for export).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent.parent / "data" / "sample"
TARGETS = ("megatron-bridge", "nemo", "trl", "olmo-core")


def make_tokens(work: Path, name: str, src: str, copies: int, fmt: str, eos: bool) -> Path:
    from packtool import TokenizeConfig, tokenize_corpus
    from packtool.choices import InputFormat

    data = work / f"{name}.jsonl"
    text = (SAMPLE / src).read_text("utf-8")
    data.write_text(text * copies, "utf-8")
    out = work / f"{name}_tok"
    config = TokenizeConfig(inputs=(str(data),), tokenizer=str(SAMPLE / "tokenizer"), output=str(out), format=InputFormat(fmt),
                            eos=True if eos else None, workers=2)
    tokenize_corpus(config.validate())
    return out


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench(work: Path, tokens: Path, size: int, repeats: int) -> dict[str, float]:
    from packtool import PackConfig, pack_store
    from packtool.choices import Overlong
    from packtool.stages.export import ExportConfig, export_store

    root = work / f"{tokens.name}_packs"
    pack_config = PackConfig(tokens, size, root, overlong=Overlong.DROP, workers=2).validate()
    best: dict[str, float] = {}
    result = None
    for _ in range(repeats):
        t = timed(lambda: pack_store(pack_config))
        best["pack"] = min(best.get("pack", t), t)
        for target in TARGETS:
            out = work / f"{tokens.name}_{target}"
            config = ExportConfig(root, target, out, size=size, overwrite=True).validate()
            t = timed(lambda c=config: export_store(c))
            best[target] = min(best.get(target, t), t)
            shutil.rmtree(out)
    result = pack_store(pack_config)
    best["n_tokens"] = result.metadata["n_tokens"]
    best["n_packs"] = result.metadata["n_packs"]
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=20)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_export_"))
    try:
        stores = {
            "text": make_tokens(work, "text", "text.jsonl", args.copies, "text", False),
            "chat (loss)": make_tokens(work, "chat", "chat.jsonl", 2 * args.copies, "chat", True),
        }
        for name, tokens in stores.items():
            best = bench(work, tokens, args.size, args.repeats)
            print(
                f"{name} store: {best['n_tokens'] / 1e6:.2f} M tokens in {int(best['n_packs'])} packs of {args.size}, "
                f"best of {args.repeats}"
            )
            print(f"  {'run':<26}{'seconds':>9}{'M tok/s':>9}{'x pack':>9}")
            for key in ("pack", *TARGETS):
                secs = best[key]
                label = "pack (baseline)" if key == "pack" else f"export --to {key}"
                ratio = secs / best["pack"]
                print(f"  {label:<26}{secs:>9.3f}{best['n_tokens'] / secs / 1e6:>9.1f}{ratio:>9.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
