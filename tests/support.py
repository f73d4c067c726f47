"""Test support shared by the test modules (imported as `support`; no test imports another test).

Tiny tokenizers built in tmp dirs (no network, ever), Zipf-like corpora, the ONE in-process CLI
runner, a token-store writer with random ids, a pack-store writer that follows the format
independently of the real packer, and the shared pack invariant checker.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from packtool.core.packing.segments import build_segments
from packtool.formats.files import sha256_bytes
from packtool.formats.pack_store import (
    FORMAT_VERSION,
    build_id,
    companion_name,
    data_name,
    file_names,
    file_records,
    metadata_for,
    open_pack_split,
    write_metadata_line,
)
from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id, open_token_store

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>", "<s>"]
_WORDS = ["the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be", "by", "this", "are", "from", "at", "or", "an", "which", "packing", "tokens", "sequence", "attention", "model", "training", "data", "batch", "padding", "length", "document", "memory", "kernel", "gradient", "loss", "layer", "python", "numpy", "vector", "matrix", "shard", "pack", "bin", "offset", "héllo", "naïve", "café", "東京", "データ", "🙂", "ünïcödé"]


def zipf_texts(n: int, seed: int = 0, max_words: int = 400) -> list[str]:
    """Real-looking text with Zipf-distributed lengths (many short docs, a long tail)."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.6, size=n), max_words)
    probs = 1.0 / np.arange(1, len(_WORDS) + 1)
    probs /= probs.sum()
    out = []
    for length in lengths:
        words = rng.choice(_WORDS, size=int(length), p=probs)
        out.append(" ".join(words).capitalize() + ".")
    return out


def build_bpe_tokenizer(directory: Path, vocab_size: int = 600) -> Path:
    """Train a deterministic byte-level BPE on a fixed corpus; save tokenizer.json + config."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(zipf_texts(400, seed=123), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "chat_template": CHATML_TEMPLATE,
    }))
    return directory


def build_big_vocab_tokenizer(directory: Path, vocab_size: int = 70_000) -> Path:
    """A word-level tokenizer whose ids go above 65,535, so token stores must be uint32."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + ["[UNK]"])}
    for word in _WORDS:
        vocab.setdefault(word, len(vocab))
    i = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{i}", len(vocab))
        i += 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "chat_template": CHATML_TEMPLATE,
    }))
    return directory


def big_vocab_texts(n: int, seed: int = 0) -> list[str]:
    """Texts whose words map to ids above 65,535 in the big-vocab tokenizer."""
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{j}" for j in rng.integers(60_000, 69_000, size=int(k))) for k in rng.integers(1, 50, size=n)]


def cli(*args: str) -> tuple[int, str, str]:
    """Run the real entry point (`packtool.cli.main`) in-process: (exit code, stdout, stderr)."""
    from packtool.cli import main

    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["packtool", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def cli_error(*args: str, code: int = 1) -> str:
    """Run the CLI, expect exit `code` (1, or 2 for a usage error) with exactly one `error:` line on stderr
    and no traceback; return it."""
    got, out, err = cli(*args)
    lines = err.strip().splitlines()
    assert got == code, (got, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def tokenize_rows(tmp_path: Path, tok_dir: Path, rows: list[Any], *flags: str, name: str = "out") -> tuple[Path, str]:
    """`packtool tokenize` of `rows` (one worker, --on-error skip) into `tmp_path/name`: (store, stdout)."""
    src = write_jsonl(tmp_path / f"{name}.jsonl", rows)
    out = tmp_path / name
    code, stdout, err = cli("tokenize", str(src), "--tokenizer", str(tok_dir), "--output", str(out), "--workers", "1",
                            "-q", "--on-error", "skip", *flags)
    assert code == 0, err
    return out, stdout


def target_runs(ids: np.ndarray, loss: np.ndarray) -> list[list[int]]:
    """The runs of consecutive target tokens (loss 1) of a document, as id lists."""
    edges = np.flatnonzero(np.diff(np.r_[0, loss.astype(int), 0]))
    return [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2], strict=True)]


def tokenize_records(out: Path, rows: list[object], tokenizer: Path, *flags: str) -> Path:
    """`packtool tokenize` (the real CLI, one worker) of `rows` written as `{out}.jsonl` into the store `out`."""
    src = write_jsonl(out.with_suffix(".jsonl"), rows)
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(tokenizer), "--output", str(out), "--workers", "1", "-q", *flags)
    assert code == 0, err
    return out


# ---- token stores and pack stores written straight through the format modules ----

PAD, EOS = 1, 0


def zipf_lengths(n: int, seed: int = 0, cap: int = 300) -> np.ndarray:
    """Many short documents, a long tail, and a few empty ones."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.5, size=n) * 3, cap).astype(np.int64)
    lengths[rng.choice(n, size=max(1, n // 50), replace=False)] = 0
    return lengths


def make_store(path: Path, lengths: np.ndarray, *, vocab: int = 600, with_loss: bool = False, seed: int = 0,
               pad_id: int | None = PAD) -> Path:
    """A token store written with the format module (random ids, optional loss mask)."""
    rng = np.random.default_rng(seed)
    total = int(np.sum(lengths))
    ids = rng.integers(2, vocab, size=total)
    loss = (rng.random(total) < 0.7).astype(np.uint8) if with_loss else None
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, dtype_for_max_id(vocab - 1))
    writer.append(ids, np.asarray(lengths), loss)
    writer.finish({"packtool_version": "test", "tokenizer": {"name": "org/tiny-tok", "sha256": "0" * 64,
                   "vocab_size": vocab, "bos_id": None, "eos_id": EOS, "pad_id": pad_id}})
    return path


def check_packs(store_dir: Path, pack_dir: Path, split: str, size: int) -> dict:
    """The shared invariant checker: rows are real segments, no pack over size, pad elsewhere,
    every non-empty document exactly once (as its fragments, in order) with identical tokens."""
    store = open_token_store(store_dir)
    ps = open_pack_split(pack_dir, split, size, check_hashes=True)
    meta = ps.metadata
    pad_id = meta["pad_id"]
    po = np.asarray(ps.pack_offsets)
    lens = np.asarray(ps.seg_lens, np.int64)
    seg_pad = np.asarray(ps.seg_pad, np.int64)
    real = lens - seg_pad
    per_pack = np.add.reduceat(lens, po[:-1]) if ps.n_packs else np.zeros(0)
    assert np.all(per_pack <= size)
    if meta["max_docs_per_pack"]:
        assert np.diff(po).max() <= meta["max_docs_per_pack"]
    # reconstruct each segment's tokens from the pack rows, compare with the source
    flat = np.asarray(ps.tokens).reshape(-1)
    row = np.repeat(np.arange(ps.n_packs), np.diff(po))
    within = np.cumsum(lens) - lens - np.repeat((np.cumsum(lens) - lens)[po[:-1]], np.diff(po))
    dst = row * size + within
    covered = np.zeros(flat.size, bool)
    for i in range(lens.size):  # test code: clarity over speed
        d, s, r = dst[i], ps.seg_src[i], real[i]
        np.testing.assert_array_equal(flat[d:d + r], store.tokens[s:s + r])
        assert np.all(flat[d + r:d + lens[i]] == pad_id)
        covered[d:d + lens[i]] = True
        if ps.loss is not None:
            lf = np.asarray(ps.loss).reshape(-1)
            np.testing.assert_array_equal(lf[d:d + r], store.loss[s:s + r])
            assert not lf[d + r:d + lens[i]].any()
    assert np.all(flat[~covered] == pad_id)
    if ps.loss is not None:
        assert not np.asarray(ps.loss).reshape(-1)[~covered].any()
    # documents: each appears exactly once (split: consecutive fragments covering it)
    lengths = store.lengths
    key = np.lexsort((np.asarray(ps.seg_src), np.asarray(ps.seg_doc)))
    doc, src, rl = np.asarray(ps.seg_doc)[key], np.asarray(ps.seg_src)[key], real[key]
    policy = meta["overlong"]["policy"]
    cap = size // meta["pad_multiple"] * meta["pad_multiple"]
    expect = build_segments(store.starts, lengths, size, policy, meta["pad_multiple"])
    np.testing.assert_array_equal(doc, expect.doc)
    np.testing.assert_array_equal(src, expect.src)
    np.testing.assert_array_equal(rl, expect.real)
    covered_tokens = np.bincount(doc, weights=rl, minlength=lengths.size).astype(np.int64)
    if policy == "split":
        np.testing.assert_array_equal(covered_tokens, lengths)
    else:
        ok = lengths <= cap
        np.testing.assert_array_equal(covered_tokens[ok], lengths[ok])
    assert meta["n_tokens"] == int(real.sum())
    assert meta["n_packs"] == ps.n_packs >= meta["lower_bound_packs"]
    return meta


# Test helper: write a small pack store exactly as `packtool.formats.pack_store` describes it.
#
# Independent of the real packer on purpose: the loader tests must pin the loader against the
# format, not against another module's choices. Next-fit in the given order, documents longer
# than N are split, each segment padded to a multiple of `pad_multiple` with `pad_id`.


@dataclass
class Segment:
    pack: int
    offset: int  # column where the segment starts in its pack row
    doc: int
    tokens: np.ndarray  # real tokens (no --pad-multiple padding)
    loss: np.ndarray  # uint8 per real token
    pad: int


def zipf_docs(n: int, seed: int = 0, vocab: int = 600, max_len: int = 300, empty_every: int = 0) -> list[np.ndarray]:
    """Token documents with Zipf-like lengths (many short, a long tail); optionally empty ones."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(rng.zipf(1.5, size=n) + 1, max_len)
    if empty_every:
        lengths[::empty_every] = 0
    return [rng.integers(0, vocab, size=int(k)).astype(np.int64) for k in lengths]


def write_pack_store(directory: Path, docs: list[np.ndarray], size: int, *, split: str = "training",
                     losses: list[np.ndarray] | None = None, pad_multiple: int = 1, pad_id: int = 1,
                     dtype: str = "uint16") -> list[Segment]:
    """Pack `docs` and write `{split}_{size}.npy`, companions, optional loss, metadata line."""
    m = pad_multiple
    pieces: list[tuple[int, np.ndarray, np.ndarray]] = []
    for d, doc in enumerate(docs):
        loss = np.ones(doc.size, np.uint8) if losses is None else np.asarray(losses[d], np.uint8)
        if doc.size == 0:
            continue  # empty documents produce no segment
        step = (size // m) * m
        for a in range(0, doc.size, step):
            pieces.append((d, doc[a:a + step], loss[a:a + step]))
    segs: list[Segment] = []
    pack, used = 0, 0
    for d, toks, loss in pieces:
        padded = -(-toks.size // m) * m
        if used + padded > size:
            pack, used = pack + 1, 0
        segs.append(Segment(pack, used, d, toks, loss, padded - toks.size))
        used += padded
    n_packs = pack + 1 if segs else 0
    np_dtype = np.dtype("<u2") if dtype == "uint16" else np.dtype("<u4")
    tokens = np.full((n_packs, size), pad_id, dtype=np_dtype)
    loss_arr = np.zeros((n_packs, size), dtype=np.uint8)
    for s in segs:
        tokens[s.pack, s.offset:s.offset + s.tokens.size] = s.tokens
        loss_arr[s.pack, s.offset:s.offset + s.tokens.size] = s.loss
    counts = np.bincount([s.pack for s in segs], minlength=n_packs)
    directory.mkdir(parents=True, exist_ok=True)
    companions = {
        "pack_offsets": np.concatenate(([0], np.cumsum(counts))).astype("<i8"),
        "seg_lens": np.array([s.tokens.size + s.pad for s in segs], "<i4"),
        "seg_pad": np.array([s.pad for s in segs], "<i4"),
        "seg_doc": np.array([s.doc for s in segs], "<i8"),
        "seg_src": np.zeros(len(segs), "<i8"),
    }
    with_loss = losses is not None
    arrays = [tokens, *companions.values()] + ([loss_arr] if with_loss else [])
    blobs = {}
    for name, arr in zip(file_names(split, size, with_loss), arrays, strict=True):
        buf = io.BytesIO()
        np.save(buf, arr)
        blobs[name] = buf.getvalue()
    build = build_id({name: sha256_bytes(blob) for name, blob in blobs.items()})  # format 2: the build's names
    names = file_names(split, size, with_loss, build)
    for name, blob in zip(names, blobs.values(), strict=True):
        (directory / name).write_bytes(blob)
    (directory / data_name(split, size)).write_bytes(blobs[data_name(split, size)])  # the plain alias
    write_metadata_line(directory, {"split": split, "pack_size": size, "dtype": dtype, "pad_id": pad_id,
                                    "format_version": FORMAT_VERSION, "build": build, "n_packs": n_packs,
                                    "n_segments": len(segs), "files": file_records(directory, names)})
    return segs


def build_file(directory: Path, size: int, role: str = "data", split: str = "training") -> Path:
    """The committed build's file of `role` (`data`, `loss` or a companion), as the metadata names it."""
    build = metadata_for(directory, split, size)["build"]
    return directory / (data_name(split, size, build) if role == "data" else companion_name(split, size, role, build))


# ---- mixtures (several token stores in one pack store) ----


def write_store(path: Path, docs: list[np.ndarray], *, vocab: int = 600, tokenizer_sha: str = "0" * 64,
                loss: list[np.ndarray] | None = None) -> Path:
    """A token store holding exactly `docs` (token id arrays), written with the format module."""
    path.mkdir(parents=True, exist_ok=True)
    writer = TokenStoreWriter(path, dtype_for_max_id(vocab - 1))
    lengths = np.array([d.size for d in docs], np.int64)
    ids = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    writer.append(ids, lengths, None if loss is None else np.concatenate(loss).astype(np.uint8))
    writer.finish({"packtool_version": "test", "tokenizer": {"name": "org/tiny-tok", "sha256": tokenizer_sha,
                   "vocab_size": vocab, "bos_id": None, "eos_id": EOS, "pad_id": PAD}})
    return path


def write_random_store(path: Path, lengths: list[int], vocab: int = 600, seed: int = 0) -> Path:
    """A token store of random ids (2..vocab-1) with the given document lengths."""
    rng = np.random.default_rng(seed)
    return write_store(path, [rng.integers(2, vocab, size=int(n)) for n in lengths], vocab=vocab)


def check_mixture_packs(store_dirs: list[Path], pack_dir: Path, split: str, size: int) -> tuple[dict, list[np.ndarray]]:
    """The shared invariant checker for packs of a mixture (or with a validation split), independent of the packer.

    Every segment's tokens (and loss bits; 1 for a store without tokens.loss) equal its source's, found
    through the global token space of the stores in the order given; pad elsewhere; no pack over size;
    each occurrence of a document is its complete fragments. Returns the metadata and, per store, how
    many times each document occurs in the split (0 for empty documents, which are never packed)."""
    stores = [open_token_store(d) for d in store_dirs]
    tok_off = np.concatenate([[0], np.cumsum([s.n_tokens for s in stores])])
    doc_off = np.concatenate([[0], np.cumsum([s.n_documents for s in stores])])
    ps = open_pack_split(pack_dir, split, size, check_hashes=True)
    meta = ps.metadata
    pad_id = meta["pad_id"]
    po = np.asarray(ps.pack_offsets)
    lens = np.asarray(ps.seg_lens, np.int64)
    real = lens - np.asarray(ps.seg_pad, np.int64)
    per_pack = np.add.reduceat(lens, po[:-1]) if ps.n_packs else np.zeros(0)
    assert np.all(per_pack <= size)
    flat = np.asarray(ps.tokens).reshape(-1)
    lf = None if ps.loss is None else np.asarray(ps.loss).reshape(-1)
    row = np.repeat(np.arange(ps.n_packs), np.diff(po))
    within = np.cumsum(lens) - lens - np.repeat((np.cumsum(lens) - lens)[po[:-1]], np.diff(po))
    dst = row * size + within
    covered = np.zeros(flat.size, bool)
    fragments: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in range(lens.size):  # test code: clarity over speed
        g = int(ps.seg_src[i])
        s = int(np.searchsorted(tok_off, g, side="right")) - 1
        store, local = stores[s], g - int(tok_off[s])
        d, r = int(dst[i]), int(real[i])
        doc = int(ps.seg_doc[i]) - int(doc_off[s])
        assert 0 <= doc < store.n_documents and store.starts[doc] <= local < store.starts[doc] + store.lengths[doc]
        np.testing.assert_array_equal(flat[d:d + r], store.tokens[local:local + r])
        assert np.all(flat[d + r:d + lens[i]] == pad_id)
        covered[d:d + lens[i]] = True
        if lf is not None:
            want = store.loss[local:local + r] if store.loss is not None else np.ones(r, np.uint8)
            np.testing.assert_array_equal(lf[d:d + r], want)
            assert not lf[d + r:d + lens[i]].any()
        fragments.setdefault((s, doc), []).append((local - int(store.starts[doc]), r))
    assert np.all(flat[~covered] == pad_id)
    if lf is not None:
        assert not lf[~covered].any()
    counts = [np.zeros(s.n_documents, np.int64) for s in stores]
    for (s, doc), frags in fragments.items():
        starts = sorted(o for o, _ in frags)
        n = starts.count(0)  # one first fragment per occurrence
        assert n >= 1
        total = sum(r for _, r in frags)
        assert total % n == 0 and total // n <= stores[s].lengths[doc]
        for o in set(starts):  # every fragment as often as the document occurs
            assert starts.count(o) == n
        counts[s][doc] = n
    assert meta["n_tokens"] == int(real.sum()) and meta["n_packs"] == ps.n_packs >= meta["lower_bound_packs"]
    return meta, counts


def crashing_executor(after: int) -> Callable[[Sequence[Any]], Iterator[Any]]:
    """An executor that runs `after` tasks in order, then raises KeyboardInterrupt (a crash mid-run)."""

    def run(tasks: Sequence[Any]) -> Iterator[Any]:
        for i, task in enumerate(tasks):
            if i == after:
                raise KeyboardInterrupt
            yield task.run()

    return run
