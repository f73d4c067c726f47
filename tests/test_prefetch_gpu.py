"""`DevicePrefetcher` on a CUDA GPU (`pytest -m gpu`): batches equal the unprefetched ones, and a step with a
slow loader takes about max(load, compute) instead of load + compute.

Equality: a real pack store through `ResumableLoader` (workers 0 and 2, `pin_memory` off and on) and a
preference batch with a nested vision-like part: every tensor arrives on the GPU with the same values, every
other value untouched, and the resume state after k batches is the unprefetched loader's after k.
Timing (ratios in one process, as scripts/bench_loader.py reports them): a loader that sleeps LOAD seconds per
batch (time.sleep, as a file read would, releases the GIL), a step of GPU matmuls calibrated to about LOAD
that ends with `.item()` (a sync every step, as logging a loss does).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from support import write_pack_store, zipf_docs

from packtool.loader import DevicePrefetcher, PackedCollator, PackedDataset, PackedSampler, ResumableLoader
from packtool.loader.prefetch import map_tensors
from tests.pair_support import batch as pair_batch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
LOAD = 0.04


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prefetch_gpu")
    write_pack_store(root / "packed" / "tok", zipf_docs(400, seed=7, vocab=600, max_len=900), 1024, pad_id=0)
    return root


def resumable(store: Path, workers: int, pin: bool) -> ResumableLoader:
    ds = PackedDataset(store)
    return ResumableLoader(torch.utils.data.DataLoader(ds, batch_size=4, sampler=PackedSampler(ds, seed=1),
                                                       num_workers=workers, pin_memory=pin,
                                                       collate_fn=PackedCollator(flatten=True)))  # fmt: skip


def on_cpu(batch):
    return map_tensors(batch, lambda t: t.cpu())


@pytest.mark.parametrize(("workers", "pin"), [(0, False), (2, True)])
def test_batches_equal_the_unprefetched_ones_and_resume_alike(store: Path, workers: int, pin: bool) -> None:
    want = list(resumable(store, 0, False))
    pre = DevicePrefetcher(resumable(store, workers, pin), "cuda", ahead=2)
    got = []
    for b in pre:
        assert all(v.device.type == "cuda" for v in b.values() if torch.is_tensor(v))
        got.append(on_cpu(b))
    assert len(got) == len(want) >= 5
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k in w:
            assert torch.equal(g[k], w[k]) if torch.is_tensor(w[k]) else g[k] == w[k], k
    loader = resumable(store, 0, False)
    plain = iter(loader)
    for _ in range(3):
        next(plain)
    pre = DevicePrefetcher(resumable(store, workers, pin), "cuda")
    it = iter(pre)
    for _ in range(3):
        next(it)
    torch.cuda.synchronize()
    time.sleep(0.2)
    assert pre.state_dict() == loader.state_dict()


def test_pair_and_nested_keys_arrive_whole() -> None:
    b = pair_batch([([5, 6, 7], [8], [9, 10])], True, pad=2)
    b["vision"] = {"pixel_values": torch.rand(2, 3, 4), "image_grid_thw": [torch.tensor([1, 2, 2])], "kind": "img"}
    (got,) = list(DevicePrefetcher([b], "cuda"))
    assert got["prefix_segment"].device.type == "cuda" and got["vision"]["kind"] == "img"
    back = on_cpu(got)
    assert torch.equal(back["vision"]["pixel_values"], b["vision"]["pixel_values"])
    assert all(torch.equal(back[k], b[k]) for k in b if torch.is_tensor(b[k]))
    assert back["max_length_q"] == b["max_length_q"]


class SlowPacks(torch.utils.data.Dataset):
    """Batches of 8 MiB that take LOAD seconds each to produce."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict:
        time.sleep(LOAD)
        return {"input_ids": torch.full((2 * 1024 * 1024,), i, dtype=torch.int32)}


def matmuls_for(seconds: float) -> tuple[torch.Tensor, int]:
    x = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        x @ x
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(20):
        x @ x
    torch.cuda.synchronize()
    return x, max(1, round(seconds / ((time.perf_counter() - t) / 20)))


def step_time(batches, x: torch.Tensor, k: int, to_device: bool) -> float:
    times = []
    t = time.perf_counter()
    for batch in batches:
        ids = batch["input_ids"].to("cuda") if to_device else batch["input_ids"]
        z = x
        for _ in range(k):
            z = x @ x
        (z[0, 0] + ids[:1].float().sum()).item()  # a sync per step (e.g. logging the loss)
        now = time.perf_counter()
        times.append(now - t)
        t = now
    return sorted(times[2:])[len(times[2:]) // 2]  # the median step, after the warm-up


def test_step_time_with_a_slow_loader_is_about_max_of_load_and_compute() -> None:
    x, k = matmuls_for(LOAD)
    loader = torch.utils.data.DataLoader(SlowPacks(), batch_size=None)
    serial = step_time(loader, x, k, to_device=True)
    overlapped = step_time(DevicePrefetcher(loader, "cuda"), x, k, to_device=False)
    compute = step_time([{"input_ids": torch.zeros(1, device="cuda")}] * 12, x, k, to_device=False)
    bound = max(LOAD, compute)
    assert serial > 1.6 * bound, (serial, LOAD, compute)  # load + compute
    assert overlapped < 1.25 * bound, (overlapped, LOAD, compute)  # ~ max(load, compute)
