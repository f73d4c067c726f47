"""Pack stores made by the real pipeline (`packtool tokenize` + `packtool pack`) for the interop tests.

Shipped sample data and tokenizer (data/sample/): a chat store (loss from assistant turns, no EOS),
a chat store tokenized with --eos, a prompt-completion store (loss, EOS) and a text store (every
token a target, EOS), plus a >65,535-id (uint32) text store from the big-vocab fixture tokenizer.
Stores whose every document must end with EOS (for OLMo-core) are packed with `--overlong drop`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from support import big_vocab_texts, build_big_vocab_tokenizer, cli

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"
SIZE = 1024


@dataclass(frozen=True)
class Store:
    name: str
    pack_dir: Path
    size: int
    eos_id: int
    pad_id: int
    vocab_size: int
    eos_ended: bool  # every segment ends with EOS (packed with --overlong drop, tokenized with EOS)


def _run(*args: str) -> None:
    code, out, err = cli(*args)
    assert code == 0, err


def build_stores(root: Path) -> dict[str, Store]:
    """Tokenize + pack every store once; returns them by name."""
    tok = str(SAMPLE / "tokenizer")
    specs = {
        "chat": ([str(SAMPLE / "chat.jsonl")], ["--format", "chat"], tok, "split", False),
        "chat_eos": ([str(SAMPLE / "chat.jsonl")], ["--format", "chat", "--eos"], tok, "drop", True),
        "prompt_completion": (
            [str(SAMPLE / "prompt_completion.jsonl")],
            ["--format", "prompt-completion"],
            tok,
            "drop",
            True,
        ),
        "text": ([str(SAMPLE / "text.jsonl")], [], tok, "split", False),
        "text_eos": ([str(SAMPLE / "text.jsonl")], [], tok, "drop", True),
    }
    big_tok = build_big_vocab_tokenizer(root / "big_tok")
    big_src = root / "big.jsonl"
    big_src.write_text("".join(json.dumps({"text": t}) + "\n" for t in big_vocab_texts(300, seed=3)))
    specs["u32"] = ([str(big_src)], [], str(big_tok), "drop", True)
    stores = {}
    for name, (inputs, flags, tokenizer, overlong, eos_ended) in specs.items():
        tdir, pdir = root / f"{name}_tok", root / f"{name}_packs"
        _run("tokenize", *inputs, "--tokenizer", tokenizer, "--output", str(tdir), "--workers", "1", "-q", *flags)
        _run("pack", str(tdir), "--size", str(SIZE), "--output", str(pdir), "--overlong", overlong, "-q")
        manifest = json.loads((tdir / "manifest.json").read_text())
        pack_dir = next((pdir / "packed").iterdir())
        meta = json.loads((pack_dir / f"{SIZE}_metadata.jsonl").read_text().splitlines()[0])
        stores[name] = Store(
            name,
            pack_dir,
            SIZE,
            manifest["tokenizer"]["eos_id"],
            meta["pad_id"],
            manifest["tokenizer"]["vocab_size"],
            eos_ended,
        )
    return stores


def export(store: Store, target: str, out: Path) -> Path:
    """Export through the public API (tests/test_export.py drives the same through the CLI)."""
    from packtool.stages.export import ExportConfig, export_store

    export_store(ExportConfig(store.pack_dir, target, out, size=store.size))
    return out


def segments_per_pack(store: Store) -> np.ndarray:
    from packtool.formats.pack_store import open_pack_split

    return np.diff(np.asarray(open_pack_split(store.pack_dir, "training", store.size).pack_offsets))


def batches(n: int, b: int) -> list[list[int]]:
    """Every pack index, in batches of b (the last one shorter)."""
    return [list(range(i, min(n, i + b))) for i in range(0, n, b)]
