"""`DevicePrefetcher` on CPU: the pass-through, the structures it copies, and ResumableLoader's exact resume
while batches are held ahead.

The CUDA path runs here with its device operations replaced by a recording stand-in (`FakeOps`: a copy is
a clone it remembers, an event a counter): the prefetcher's own logic (the thread, the queue, which tensor
is copied, the wait before a batch is handed out, `record_stream` on every delivered tensor, the state kept
with each batch, the put-back when a loop stops early) is what runs. The real copies, streams and timings
run in tests/test_prefetch_gpu.py (marked gpu).
"""

from __future__ import annotations

import threading
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest
import torch
from support import write_pack_store, zipf_docs

from packtool.errors import ConfigError
from packtool.loader import DevicePrefetcher, PackedCollator, PackedDataset, PackedSampler, ResumableLoader
from packtool.loader import prefetch as prefetch_module
from packtool.loader.prefetch import map_tensors
from tests.pair_support import batch as pair_batch

N = 128
Pair = namedtuple("Pair", ["chosen", "rejected"])


class FakeOps:
    """Records what the prefetcher asks of the device: copies (clones), events, waits and record_stream calls."""

    def __init__(self) -> None:
        self.copied: dict[int, torch.Tensor] = {}  # id(copy) -> source
        self.events = 0
        self.waited: list[int] = []
        self.recorded: list[tuple[int, str]] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def thread_start(self) -> None:
        self.threads.add(threading.current_thread().name)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        with self.lock:
            self.copied[id(out)] = tensor
        return out

    def event(self) -> int:
        with self.lock:
            self.events += 1
            return self.events

    def wait(self, event: int) -> str:
        self.waited.append(event)
        return f"consumer-{event}"

    def record(self, tensor: torch.Tensor, consumer: str) -> None:
        assert id(tensor) in self.copied, "record_stream on a tensor the prefetcher did not copy"
        self.recorded.append((id(tensor), consumer))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeOps:
    ops = FakeOps()
    monkeypatch.setattr(prefetch_module, "_device_ops", lambda device: None if device.type == "cpu" else ops)
    return ops


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("packs")
    write_pack_store(root / "packed" / "tok", zipf_docs(200, seed=5, vocab=600, max_len=300), N, pad_id=0)
    return root


def resumable(store: Path, workers: int = 0) -> ResumableLoader:
    ds = PackedDataset(store)
    sampler = PackedSampler(ds, seed=3)
    return ResumableLoader(torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler, num_workers=workers,
                                                       collate_fn=PackedCollator(flatten=True)))  # fmt: skip


def key(batch: dict) -> tuple:
    return tuple(batch["input_ids"].reshape(-1).tolist()) + tuple(batch["cu_seqlens"].tolist())


def test_cpu_passes_the_same_batch_objects_through_and_delegates_the_state(store: Path) -> None:
    batches = [{"a": torch.arange(3)}, [torch.ones(2), "text"], ("x", 1)]
    assert all(got is want for got, want in zip(DevicePrefetcher(batches, "cpu"), batches, strict=True))
    loader = resumable(store)
    pre = DevicePrefetcher(loader, torch.device("cpu"))
    assert len(pre) == len(loader)
    it = iter(pre)
    first = next(it)
    assert isinstance(first["input_ids"], torch.Tensor) and pre.state_dict() == loader.state_dict()
    assert pre.state_dict()["consumed"] == 2


def test_refusals_name_the_argument() -> None:
    with pytest.raises(ConfigError, match="'meta' is not cuda or cpu"):
        DevicePrefetcher([], "meta")
    with pytest.raises(ConfigError, match="ahead=0"):
        DevicePrefetcher([], "cpu", ahead=0)
    with pytest.raises(ConfigError, match="list has no state_dict, DevicePrefetcher, wrap a ResumableLoader"):
        DevicePrefetcher([], "cpu").state_dict()
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="torch sees no CUDA device.*device='cpu'"):
            DevicePrefetcher([], "cuda")


def test_map_tensors_copies_every_tensor_once_and_leaves_the_rest() -> None:
    class Encoding(dict):  # like transformers' BatchEncoding
        extra = "kept"

    shared = torch.arange(4)
    grid = np.arange(3)
    nested = {
        "pairs": pair_batch([([5, 6], [7], [8])], True, pad=1),
        "vision": Encoding(pixel_values=torch.zeros(2, 3), image_grid_thw=[torch.tensor([1, 2, 2]), (shared, None)]),
        "pair": Pair(torch.ones(1), torch.zeros(1)),
        "both": [shared, shared],
        "meta": {"name": "x", "n": 3, "grid": grid},
    }
    calls: list[torch.Tensor] = []
    out = map_tensors(nested, lambda t: calls.append(t) or t + 0)
    assert type(out["vision"]) is Encoding and out["vision"].extra == "kept"
    assert type(out["pair"]) is Pair and isinstance(out["vision"]["image_grid_thw"][1], tuple)
    assert out["both"][0] is out["both"][1] is out["vision"]["image_grid_thw"][1][0]  # one copy of one tensor
    assert out["meta"]["grid"] is grid and out["meta"]["name"] == "x" and out["vision"]["image_grid_thw"][1][1] is None
    # the pair batch's tensors (cu_seq_lens_q and _k are one object), two vision ones, `shared`, the Pair's two
    n_tensors = len({id(v) for v in nested["pairs"].values() if torch.is_tensor(v)}) + 2 + 1 + 2
    assert len(calls) == len({id(t) for t in calls}) == n_tensors
    assert torch.equal(out["pairs"]["prefix_segment"], nested["pairs"]["prefix_segment"])
    assert out["pairs"]["max_length_q"] == nested["pairs"]["max_length_q"]


def test_the_cuda_path_copies_waits_and_records_every_tensor(fake: FakeOps) -> None:
    batches = [{"input_ids": torch.arange(i, i + 5), "pair": Pair(torch.ones(2) * i, [torch.zeros(1)]), "n": i,
                "images": [{"pixel_values": torch.rand(2, 2)}]} for i in range(6)]  # fmt: skip
    got = []
    for j, b in enumerate(DevicePrefetcher(batches, "cuda:0", ahead=2)):
        assert fake.waited[-1] == j + 1  # this batch's copy event, waited on before it was handed out
        tensors = [b["input_ids"], b["pair"].chosen, b["pair"].rejected[0], b["images"][0]["pixel_values"]]
        assert all(id(t) in fake.copied for t in tensors)
        assert {i for i, _ in fake.recorded[-4:]} == {id(t) for t in tensors}
        assert {c for _, c in fake.recorded[-4:]} == {f"consumer-{j + 1}"}
        got.append(b)
    assert fake.threads == {"packtool-prefetch"}
    for b, want in zip(got, batches, strict=True):
        assert b["n"] == want["n"] and b["input_ids"] is not want["input_ids"]
        assert torch.equal(b["input_ids"], want["input_ids"]) and torch.equal(b["pair"].chosen, want["pair"].chosen)
        assert torch.equal(b["images"][0]["pixel_values"], want["images"][0]["pixel_values"])


@pytest.mark.parametrize("ahead", [1, 3])
def test_resume_is_exact_while_batches_are_held_ahead(fake: FakeOps, store: Path, ahead: int) -> None:
    full = resumable(store)
    two_epochs = [key(b) for b in full] + [key(b) for b in full]
    assert len(two_epochs) >= 10
    for k in (1, 3, len(two_epochs) // 2 + 1):
        loader = resumable(store)
        pre = DevicePrefetcher(loader, "cuda", ahead=ahead)
        seen: list[tuple] = []
        it = iter(pre)
        while len(seen) < k:
            try:
                seen.append(key(next(it)))
            except StopIteration:
                it = iter(pre)
        time.sleep(0.2)  # let the thread take batches ahead
        held = loader.state_dict()["consumed"] - pre.state_dict()["consumed"]
        assert 0 <= held <= 2 * (ahead + 1)
        state = pre.state_dict()
        resumed = DevicePrefetcher(resumable(store), "cuda", ahead=ahead)
        resumed.load_state_dict(state)
        rest: list[tuple] = []
        while len(seen) + len(rest) < len(two_epochs):
            rest.extend(key(b) for b in resumed)
        assert seen + rest == two_epochs, f"resume after {k} batches"
        # the same prefetcher, iterated again after leaving its loop: the batches held ahead come back
        again = [key(b) for b in pre]
        assert seen + again == two_epochs[: len(seen) + len(again)] and again


def test_the_state_is_the_delivered_batches_not_the_fetched_ones(fake: FakeOps, store: Path) -> None:
    loader = resumable(store)
    pre = DevicePrefetcher(loader, "cuda", ahead=2)
    it = iter(pre)
    next(it)
    deadline = time.time() + 10
    while loader.state_dict()["consumed"] < 2 * 4 and time.time() < deadline:  # 1 handed out, 2 queued, 1 in hand
        time.sleep(0.01)
    assert loader.state_dict()["consumed"] == 2 * 4
    assert pre.state_dict()["consumed"] == 2  # one batch of 2 packs handed out
    pre.load_state_dict(pre.state_dict())  # stops the run; the next loop starts after that batch
    assert loader.state_dict()["consumed"] == 2


def test_a_loader_error_reaches_the_loop(fake: FakeOps) -> None:
    def broken():
        yield {"x": torch.ones(1)}
        raise ValueError("bad pack 7")

    pre = DevicePrefetcher(broken(), "cuda")
    it = iter(pre)
    assert torch.equal(next(it)["x"], torch.ones(1))
    with pytest.raises(ValueError, match="bad pack 7"):
        next(it)


def test_workers_and_the_thread_together(fake: FakeOps, store: Path) -> None:
    want = [key(b) for b in resumable(store)]
    assert [key(b) for b in DevicePrefetcher(resumable(store, workers=2), "cuda")] == want


def test_leaving_a_loop_stops_the_thread(fake: FakeOps, store: Path) -> None:
    pre = DevicePrefetcher(resumable(store), "cuda", ahead=2)
    for _ in pre:
        break
    run = pre._run
    assert run is not None
    run._thread.join(timeout=10)
    assert not run._thread.is_alive() and not run.finished
    assert pre.state_dict()["consumed"] == 2


def test_a_loop_stopped_by_a_later_one_says_so(fake: FakeOps) -> None:
    batches = [{"x": torch.full((2,), i)} for i in range(5)]
    pre = DevicePrefetcher(batches, "cuda")
    first = iter(pre)
    next(first)
    second = iter(pre)
    assert torch.equal(next(second)["x"], torch.zeros(2))  # a list restarts: nothing to put back
    with pytest.raises(ConfigError, match="stopped by a later iter"):
        next(first)


def _same(a, b) -> bool:
    if torch.is_tensor(a):
        return torch.is_tensor(b) and a is not b and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_real_collators_pair_and_padded_batches_and_their_resume(fake: FakeOps, tmp_path: Path,
                                                                 document_stores) -> None:  # fmt: skip
    from packtool.loader import HF_KEYS, DocumentDataset, DynamicBatchSampler, PaddedCollator
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import realistic_pairs, write_pref_store

    tok = write_pref_store(tmp_path / "tok", realistic_pairs(60, seed=3, scale=0.3))
    pack_store(PackConfig(tok, 512, tmp_path / "pref", share_prompt=True, overlong="drop"))
    pref = PackedDataset(tmp_path / "pref")
    docs = DocumentDataset(document_stores["pc"])

    def loaders():
        yield ResumableLoader(torch.utils.data.DataLoader(pref, batch_size=2, sampler=PackedSampler(pref, seed=2),
                                                          collate_fn=PackedCollator(flatten=True, keys=HF_KEYS)))
        yield ResumableLoader(torch.utils.data.DataLoader(docs, batch_sampler=DynamicBatchSampler(docs, 800, padded=True,
                                                          seed=4), collate_fn=PaddedCollator()))  # fmt: skip

    keys: set[str] = set()
    for make_plain, make_pre in zip(loaders(), loaders(), strict=True):
        want = list(make_plain)
        keys |= set(want[0])
        assert len(want) >= 4
        pre = DevicePrefetcher(make_pre, "cuda", ahead=2)
        it = iter(pre)
        got = [next(it) for _ in range(3)]
        state = pre.state_dict()
        del it
        got += list(pre)  # the same prefetcher continues after the batches it held ahead were put back
        assert len(got) == len(want) and all(_same(w, g) for w, g in zip(want, got, strict=True))
        assert state["consumed"] in (3, 6)  # batches of the plan, or packs
    assert {"prefix_segment", "pair_ids", "chosen", "cu_seq_lens_q", "attention_mask"} <= keys
