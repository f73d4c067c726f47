"""PackedDataset and PackedCollator against the pack-store format, on Zipf-shaped packs."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import Segment, build_file, write_pack_store, zipf_docs

from packtool.errors import ConfigError, FormatError, PacktoolError
from packtool.formats.pack_store import open_pack_split
from packtool.loader import HF_KEYS, PackedCollator, PackedDataset, PackedSampler, ResumableLoader, validate_cu_seqlens
from packtool.loader.dataset import parallel_ok, plain_views
from packtool.loader.kernels import fill_batch, segments_of

N = 256


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Segment], list[np.ndarray]]:
    root = tmp_path_factory.mktemp("packs")
    docs = zipf_docs(300, seed=3, vocab=70_000, max_len=700, empty_every=23)  # long tail > N, ids > 65535
    rng = np.random.default_rng(4)
    losses = [(rng.random(d.size) < 0.7).astype(np.uint8) for d in docs]
    segs = write_pack_store(root / "packed" / "big-tok", docs, N, losses=losses, pad_multiple=8, pad_id=3, dtype="uint32")
    return root, segs, losses


def expected_pack(segs: list[Segment], pack: int, pad_id: int) -> dict[str, np.ndarray]:
    """Reference built per segment in plain Python, straight from the format's definition."""
    ids = np.full(N, pad_id, np.int64)
    labels = np.full(N, -100, np.int64)
    pos = np.zeros(N, np.int64)
    cu = [0]
    for s in (s for s in segs if s.pack == pack):
        a, n = s.offset, s.tokens.size
        ids[a:a + n] = s.tokens
        lab = np.where(s.loss == 1, s.tokens, -100)
        lab[0] = -100
        labels[a:a + n] = lab
        pos[a:a + n + s.pad] = np.arange(n + s.pad)
        cu.append(a + n + s.pad)
    if cu[-1] < N:
        pos[cu[-1]:] = np.arange(N - cu[-1])
        cu.append(N)
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "cu_seqlens": np.array(cu, np.int32)}


def test_every_pack_matches_the_format_definition(store):
    root, segs, _ = store
    ds = PackedDataset(root)
    assert len(ds) == max(s.pack for s in segs) + 1
    assert ds.has_segment_padding
    for i in range(len(ds)):
        item, ref = ds[i], expected_pack(segs, i, pad_id=3)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            assert item[key].dtype == (torch.int32 if key == "cu_seqlens" else torch.int64)
            np.testing.assert_array_equal(item[key].numpy(), ref[key], err_msg=f"pack {i} {key}")
        assert item["max_seqlen"] == int(np.diff(ref["cu_seqlens"]).max())
        assert item["n_target_tokens"] == int((ref["labels"] != -100).sum())
    assert ds[-1]["input_ids"].shape == (N,)


def test_batched_fetch_equals_single_items(store):
    ds = PackedDataset(store[0])
    idx = [5, 0, 5, len(ds) - 1]
    batch = ds.__getitems__(idx)
    for j, i in enumerate(idx):
        for key, value in ds[i].items():
            got = batch[j][key]
            assert torch.equal(got, value) if torch.is_tensor(value) else got == value


def test_store_without_loss_file_matches_the_format_definition(tmp_path):
    # uint16 tokens, no loss file, no --pad-multiple: the kernel's other branches
    segs = write_pack_store(tmp_path / "p", zipf_docs(120, seed=5, max_len=400), N, pad_id=2)
    ds = PackedDataset(tmp_path / "p")
    assert not ds.has_segment_padding
    batch = ds.__getitems__(list(range(len(ds))))
    for i in range(len(ds)):
        ref = expected_pack(segs, i, pad_id=2)
        for key in ("input_ids", "labels", "position_ids", "cu_seqlens"):
            np.testing.assert_array_equal(batch[i][key].numpy(), ref[key], err_msg=f"pack {i} {key}")
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])


def test_a_batch_still_held_is_never_overwritten(store):
    # batches come from recycled buffers: only buffers nothing refers to may be reused
    ds = PackedDataset(store[0])
    collate = PackedCollator(flatten=True)
    held = [collate(ds.__getitems__([i, i + 1])) for i in range(0, 12, 2)]  # more than the pool keeps
    copies = [{k: v.clone() for k, v in b.items() if torch.is_tensor(v)} for b in held]
    for i in range(12, 40, 2):
        collate(ds.__getitems__([i % len(ds), (i + 1) % len(ds)]))
    item = ds[3]
    ids = item["input_ids"].clone()
    ds.__getitems__([0, 1, 2])
    assert torch.equal(item["input_ids"], ids)
    for b, c in zip(held, copies, strict=True):
        for k, v in c.items():
            assert torch.equal(b[k], v), k


def test_worker_batches_equal_local_batches(store):
    ds = PackedDataset(store[0])
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=1, collate_fn=PackedCollator(flatten=True))
    batch = next(iter(loader))
    local = PackedCollator(flatten=True)(ds.__getitems__([0, 1, 2]))
    for key, value in local.items():
        assert torch.equal(value, batch[key]) if torch.is_tensor(value) else value == batch[key], key


def _kernel_outputs(ds: PackedDataset, idx: np.ndarray, parallel: bool) -> tuple:
    tokens, loss, po, lens, pads = plain_views(open_pack_split(ds.directory, ds.split, ds.size))
    cap = idx.size + int(segments_of(po, idx))
    rows = np.full((3, idx.size, ds.size), 7, np.int64)
    seg = np.full((4, cap), 7, np.int64)
    cus = np.full((2, cap + 1), 7, np.int32)
    ret = fill_batch(tokens, loss, loss.size > 0, po, lens, pads, idx, rows, seg, cus, parallel)
    return ret, rows, seg, cus


@pytest.mark.parametrize("with_loss", [True, False])
def test_parallel_kernel_is_byte_identical_to_the_serial_one(store, tmp_path, with_loss):
    # uint32 + loss masks + --pad-multiple; and uint16 without loss file or padding
    if with_loss:
        ds = PackedDataset(store[0])
    else:
        write_pack_store(tmp_path / "p", zipf_docs(120, seed=5, max_len=400), N, pad_id=2)
        ds = PackedDataset(tmp_path / "p")
    rng = np.random.default_rng(9)
    batches = [np.arange(len(ds)), rng.integers(0, len(ds), 7), np.array([3]), np.array([2, 2, 0])]
    for idx in batches:
        serial = _kernel_outputs(ds, idx, False)
        parallel = _kernel_outputs(ds, idx, True)
        assert serial[0] == parallel[0] and serial[0][1] == -1
        for a, b in zip(serial[1:], parallel[1:], strict=True):
            assert a.tobytes() == b.tobytes()  # every byte, untouched entries included


def test_parallel_kernel_refuses_corrupt_packs_like_the_serial_one(tmp_path):
    write_pack_store(tmp_path / "p", zipf_docs(60, seed=2, max_len=300), N)
    lens = build_file(tmp_path / "p", N, "seg_lens")
    arr = np.load(lens)
    arr[len(arr) // 2] = N + 1
    np.save(lens, arr)
    ds = PackedDataset(tmp_path / "p")
    idx = np.arange(len(ds))
    bad_serial, bad_parallel = _kernel_outputs(ds, idx, False)[0], _kernel_outputs(ds, idx, True)[0]
    assert bad_serial == bad_parallel and bad_serial[1] >= 0


def _collate_reporting_threads(items):  # type: ignore[no-untyped-def]
    batch = PackedCollator(flatten=True)(items)
    batch["parallel_ok"] = parallel_ok()
    return batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_after_the_parallel_kernel_ran_in_the_parent(store, context):
    # numba's GNU-OpenMP layer aborts a forked child that launches threads its parent started:
    # the parent runs the parallel kernel first, workers must still work (serial kernel there)
    ds = PackedDataset(store[0])
    _kernel_outputs(ds, np.arange(len(ds)), True)  # numba's threads now exist here
    expected = [_collate_reporting_threads(ds.__getitems__(list(range(a, min(a + 3, len(ds))))))
                for a in range(0, len(ds), 3)]
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=2, collate_fn=_collate_reporting_threads,
                                         multiprocessing_context=context, timeout=120)  # a deadlock fails, not hangs
    got = list(loader)
    assert len(got) == len(expected) > 1
    for a, b in zip(expected, got, strict=True):
        assert b.pop("parallel_ok") is False
        a.pop("parallel_ok")
        for key, value in a.items():
            assert torch.equal(value, b[key]) if torch.is_tensor(value) else value == b[key], key


def test_path_forms_and_size_choice(store, tmp_path):
    root, _, _ = store
    tok_dir = root / "packed" / "big-tok"
    for path in (root, tok_dir, tok_dir / f"training_{N}.npy"):
        ds = PackedDataset(path)
        assert (ds.size, ds.split, len(ds)) == (N, "training", len(PackedDataset(root)))
    write_pack_store(tmp_path / "two", zipf_docs(20), 64)
    write_pack_store(tmp_path / "two", zipf_docs(20), 128)
    with pytest.raises(ConfigError, match="pass size=N"):
        PackedDataset(tmp_path / "two")
    assert PackedDataset(tmp_path / "two", size=128).size == 128
    with pytest.raises(ConfigError, match="no packs of size 512"):
        PackedDataset(tmp_path / "two", size=512)
    with pytest.raises(FormatError, match="no metadata line for split 'validation'"):
        PackedDataset(tmp_path / "two", split="validation", size=64)
    with pytest.raises(FormatError, match="no token store or pack store"):
        PackedDataset(tmp_path / "nothing-here")


def test_inconsistent_segments_raise_format_error(tmp_path):
    d = tmp_path / "p"
    write_pack_store(d, zipf_docs(50), 64)
    seg_path = build_file(d, 64, "seg_lens")
    seg = np.load(seg_path)
    seg[0] = 65  # longer than the pack
    np.save(seg_path, seg)
    ds = PackedDataset(d)  # same byte count, so metadata sizes still match
    with pytest.raises(FormatError, match="inconsistent segment lengths"):
        ds[0]


def test_truncated_pack_file_is_refused(tmp_path):
    d = tmp_path / "p"
    write_pack_store(d, zipf_docs(50), 64)
    f = build_file(d, 64)
    f.write_bytes(f.read_bytes()[:-10])
    with pytest.raises(PacktoolError, match="truncated"):
        PackedDataset(d)


def test_pickles_without_the_maps_and_workers_agree(store):
    ds = PackedDataset(store[0])
    ds[0]
    state = pickle.dumps(ds)
    assert len(state) < 20_000  # no token bytes travel to the workers
    clone = pickle.loads(state)
    assert torch.equal(clone[1]["input_ids"], ds[1]["input_ids"])
    runs = []
    for workers in (0, 2):
        loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=PackedCollator(flatten=True))
        runs.append(list(loader))
    assert len(runs[0]) == len(runs[1]) > 1
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["cu_seqlens"], b["cu_seqlens"])


def test_loader_never_imports_the_cli_stack():
    # torch itself may pull tqdm in; what matters is what packtool.loader adds on top of torch
    code = ("import sys, torch; before = set(sys.modules); import packtool.loader, packtool.attention; "
            "new = set(sys.modules) - before; "
            "print(sorted(m for m in new if m.split('.')[0] in ('typer', 'tqdm', 'tokenizers', 'click')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ---- collator -----------------------------------------------------------------------

def test_collator_rows_and_flat_share_one_global_cu_seqlens(store):
    ds = PackedDataset(store[0])
    items = ds.__getitems__([0, 1, 2])
    rows = PackedCollator()(items)
    flat = PackedCollator(flatten=True)(items)
    assert rows["input_ids"].shape == (3, N) and flat["input_ids"].shape == (1, 3 * N)
    cu = rows["cu_seqlens"]
    assert torch.equal(cu, flat["cu_seqlens"]) and cu[0] == 0 and cu[-1] == 3 * N
    expected = np.concatenate([[0]] + [ds[i]["cu_seqlens"].numpy()[1:] + i * N for i in range(3)])
    np.testing.assert_array_equal(cu.numpy(), expected)
    assert rows["max_seqlen"] == max(ds[i]["max_seqlen"] for i in range(3)) == rows["max_length_q"]
    assert rows["cu_seq_lens_q"] is cu and rows["cu_seq_lens_k"] is cu
    # --pad-multiple was used: Megatron gets real lengths plus padded offsets
    assert torch.equal(rows["cu_seqlens_q_padded"], cu)
    real = rows["cu_seqlens_q"]
    assert real[-1] < cu[-1] and bool(torch.all(real <= cu))
    assert rows["n_target_tokens"] == int((rows["labels"] != -100).sum())
    # a plain list of item dicts (no stacked fast path) gives the same batch
    slow = PackedCollator(flatten=True)([ds[0], ds[1], ds[2]])
    for key, value in flat.items():
        assert torch.equal(value, slow[key]) if torch.is_tensor(value) else value == slow[key], key


def test_collator_keys_filter_for_model_kwargs(store):
    ds = PackedDataset(store[0])
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([0, 1]))
    assert set(batch) == set(HF_KEYS)


def test_static_segments_pad_with_zero_length_segments(store):
    ds = PackedDataset(store[0])
    items = ds.__getitems__([0, 1])
    n_seg = PackedCollator()(items)["cu_seqlens"].numel() - 1
    out = PackedCollator(flatten=True, static_segments=n_seg + 5)(items)
    cu = out["cu_seqlens"]
    assert cu.numel() == n_seg + 6 and bool(torch.all(cu[n_seg:] == 2 * N))
    assert out["max_seqlen"] == 2 * N and out["cu_seqlens_q"].numel() == n_seg + 6
    with pytest.raises(ConfigError, match="more than static_segments"):
        PackedCollator(static_segments=n_seg - 1)(items)


def test_pad_to_length_adds_one_ignored_segment(store):
    ds = PackedDataset(store[0])
    items = ds.__getitems__([0, 1])
    base = PackedCollator(flatten=True)(items)
    out = PackedCollator(flatten=True, pad_to_length=2 * N + 40, pad_id=7)(items)
    assert out["input_ids"].shape == (1, 2 * N + 40)
    assert bool(torch.all(out["input_ids"][0, 2 * N:] == 7)) and bool(torch.all(out["labels"][0, 2 * N:] == -100))
    assert out["position_ids"][0, 2 * N:].tolist() == list(range(40))
    assert out["cu_seqlens"].tolist() == base["cu_seqlens"].tolist() + [2 * N + 40]
    rows = PackedCollator(pad_to_length=N + 8)(items)
    assert rows["input_ids"].shape == (2, N + 8) and rows["cu_seqlens"][-1] == 2 * (N + 8)
    assert int((rows["labels"] != -100).sum()) == base["n_target_tokens"]
    with pytest.raises(ConfigError, match="pad_to_length 100 is shorter"):
        PackedCollator(pad_to_length=100)(items)


@pytest.mark.parametrize(("cu", "total", "max_len", "message"), [
    ([0, 5, 3, 10], 10, 10, "decreases at entry 2"),
    ([0, 5, 9], 10, 10, "expected 0 to 10"),
    ([1, 5, 10], 10, 10, "expected 0 to 10"),
    ([0, 5, 10], 10, 4, "max_seqlen 4 is below the longest segment"),
])
def test_validate_cu_seqlens_catches_what_kernels_would_not(cu, total, max_len, message):
    with pytest.raises(FormatError, match=message):
        validate_cu_seqlens(torch.tensor(cu, dtype=torch.int32), total, max_len)
    with pytest.raises(FormatError, match="1-D int32"):
        validate_cu_seqlens(torch.tensor(cu, dtype=torch.int64), total, max_len)


def test_collator_rejects_foreign_items(store):
    ds = PackedDataset(store[0])
    item = dict(ds[0])
    item["cu_seqlens"] = torch.tensor([0, 10, 100], dtype=torch.int32)  # does not reach N
    item["cu_seqlens_unpadded"] = item["cu_seqlens"]
    with pytest.raises(FormatError, match="does not start at 0 and end at"):
        PackedCollator()([item])


# ---- sampler and exact resume --------------------------------------------------------

def test_sampler_shards_are_disjoint_and_cover_every_pack():
    n, world = 103, 4
    shards = [PackedSampler(n, num_replicas=world, rank=r, seed=9) for r in range(world)]
    got = [s.indices() for s in shards]
    assert {len(g) for g in got} == {26}  # ceil(103 / 4), padded by wrapping
    assert set(np.concatenate(got).tolist()) == set(range(n))
    assert len(set(np.concatenate(got)[: n].tolist())) == n  # first n draws are a permutation
    dropped = [PackedSampler(n, num_replicas=world, rank=r, drop_last=True).indices() for r in range(world)]
    flat = np.concatenate(dropped)
    assert flat.size == 100 and np.unique(flat).size == 100
    s = shards[0]
    first = s.indices().tolist()
    s.set_epoch(1)
    assert s.indices().tolist() != first and sorted(s.indices(0).tolist()) == sorted(first)
    assert PackedSampler(n, shuffle=False).indices().tolist() == list(range(n))


def test_sampler_refuses_bad_ranks_and_foreign_state():
    with pytest.raises(ConfigError, match="rank 4 is not in 0..3"):
        PackedSampler(10, num_replicas=4, rank=4)
    state = PackedSampler(10, seed=1).state_dict()
    with pytest.raises(ConfigError, match="seed=1 but this sampler has 2"):
        PackedSampler(10, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match="n=10 but this sampler has 11"):
        PackedSampler(11, seed=1).load_state_dict(state)


def _loader(ds: PackedDataset, workers: int, rank: int = 0) -> ResumableLoader:
    sampler = PackedSampler(ds, num_replicas=2, rank=rank, seed=5)
    return ResumableLoader(torch.utils.data.DataLoader(
        ds, batch_size=3, sampler=sampler, num_workers=workers, collate_fn=PackedCollator(flatten=True),
        prefetch_factor=4 if workers else None))


def _key(batch: dict) -> tuple:
    return tuple(batch["input_ids"].reshape(-1)[::17].tolist()) + tuple(batch["cu_seqlens"].tolist())


@pytest.mark.parametrize("resume_workers", [0, 2])
def test_resume_mid_epoch_is_exact_whatever_the_workers(store, resume_workers):
    ds = PackedDataset(store[0])
    full = _loader(ds, workers=2, rank=1)
    reference = [_key(b) for b in full] + [_key(b) for b in full]  # two epochs, uninterrupted
    assert len(reference) >= 8 and reference[: len(reference) // 2] != reference[len(reference) // 2:]
    for k in (1, 4, len(reference) // 2, len(reference) // 2 + 2):
        first = _loader(ds, workers=2, rank=1)
        seen: list[tuple] = []
        it = iter(first)
        while len(seen) < k:  # the workers prefetch far ahead of what we take
            try:
                seen.append(_key(next(it)))
            except StopIteration:
                it = iter(first)
        state = first.state_dict()
        resumed = _loader(ds, workers=resume_workers, rank=1)
        resumed.load_state_dict(state)
        rest: list[tuple] = []
        while len(seen) + len(rest) < len(reference):
            rest.extend(_key(b) for b in resumed)
        assert seen + rest == reference, f"resume after {k} batches"


def test_set_epoch_of_the_current_epoch_keeps_the_resume_point():
    s = PackedSampler(20, seed=1)
    s.advance(6)
    s.set_epoch(0)
    assert len(list(iter(s))) == 14
    s.set_epoch(1)
    assert len(list(iter(s))) == 20


# ---- end to end: jsonl -> tokenize -> pack -> PackedDataset -> decode == input ----------

def test_round_trip_through_the_real_pipeline(tmp_path, bpe_tokenizer_dir):
    import json

    from support import zipf_texts
    from tokenizers import Tokenizer

    texts = zipf_texts(150, seed=8) + [""]  # long tail and an empty document
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    run = [sys.executable, "-m", "packtool"]
    for cmd in (
        [*run, "tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "tok"), "--quiet"],
        [*run, "pack", str(tmp_path / "tok"), "--size", "128", "--output", str(tmp_path / "out"), "--pad-multiple", "8", "--quiet"],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    ds = PackedDataset(tmp_path / "out")
    store = open_pack_split(ds.directory, ds.split, ds.size)
    po, lens, pad = store.pack_offsets, store.seg_lens, store.seg_pad
    assert np.any(pad > 0)
    pieces: dict[int, list[tuple[int, np.ndarray]]] = {}
    for p in range(len(ds)):
        item = ds[p]
        cu = item["cu_seqlens"].numpy()
        for j, s in enumerate(range(int(po[p]), int(po[p + 1]))):  # the pack's own segments come first
            start, real = int(cu[j]), int(lens[s] - pad[s])
            assert int(cu[j + 1] - cu[j]) == int(lens[s]) and item["labels"][start] == -100
            assert bool(torch.all(item["labels"][start + real:int(cu[j + 1])] == -100))  # --pad-multiple padding
            pieces.setdefault(int(store.seg_doc[s]), []).append((int(store.seg_src[s]), item["input_ids"][start:start + real].numpy()))
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    for doc, text in enumerate(texts):
        parts = sorted(pieces.get(doc, []), key=lambda p: p[0])
        token_ids = np.concatenate([p[1] for p in parts]).tolist() if parts else []
        assert tok.decode(token_ids, skip_special_tokens=True) == text, f"document {doc}"


def test_keys_and_sizes_that_are_not_integers_are_refused(store):
    """Issue 38 (7, 12): `ds[1.5]` read `ds[1]`, `ds[True]` read `ds[1]`, an index past the end wrapped or read
    garbage, and `size=0` told the user to `pack --size 0`."""
    root, _, _ = store
    ds = PackedDataset(root)
    want = ds[1]["input_ids"]
    assert ds[np.int64(1)]["input_ids"].equal(want)
    assert ds[-len(ds)]["input_ids"].equal(ds[0]["input_ids"])
    for key in (1.5, True, "1", np.float64(1.0)):
        with pytest.raises(ConfigError, match="is not an integer"):
            ds[key]
    with pytest.raises(ConfigError, match="are not integers"):
        ds.__getitems__([0, 1.5])
    for key in (len(ds), -len(ds) - 1):
        with pytest.raises(IndexError, match="out of range"):
            ds[key]
    with pytest.raises(IndexError, match="out of range"):
        ds.__getitems__([0, len(ds)])
    for size in (0, -4, 2.5, True):
        with pytest.raises(ConfigError, match="is not a pack size") as err:
            PackedDataset(root, size=size)
        assert "--size 0" not in str(err.value)
