"""`DevicePrefetcher`: the next batch is on the GPU before the step asks for it.

    loader = DevicePrefetcher(ResumableLoader(DataLoader(ds, sampler=sampler, batch_size=B, collate_fn=collate)),
                              "cuda")
    for batch in loader:        # every tensor of the batch already on the device
        ...
    state = loader.state_dict() # the batches the loop received, not the ones held ahead

On CUDA a background thread pulls batches from `loader`, pins their tensors (unless already
pinned) and copies them with `non_blocking=True` on a side stream, `ahead` batches ahead of the
loop. Before a batch is handed out the consumer's stream waits on its copy (an event), and every
tensor is `record_stream`-ed on that stream, so the caching allocator never hands its memory to
the next copy while the step still reads it. Loading (the thread; `time.sleep`, file reads and
numba kernels release the GIL) and the copy overlap the step: with a slow loader a step takes
about max(load, compute) instead of their sum (scripts/bench_loader.py, tests/test_prefetch_gpu.py).

On CPU it passes through: iterating it iterates `loader`, the same batch objects. Any structure
works (mappings: dicts and UserDicts such as BatchEncoding; lists, tuples, named tuples, nested: every
collator's output with its pair and vision keys): each tensor is copied once (a tensor that appears twice stays one tensor), everything else
is handed through untouched.

Resume: `state_dict()` is `loader.state_dict()` as of the last batch handed out (the thread has
already taken up to `ahead + 1` more from `loader`; a snapshot of its state is kept with each batch);
leaving a loop early puts those batches back (`loader.load_state_dict` of that snapshot), so the
next loop or a checkpoint continues exactly as `ResumableLoader` alone would.
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from packtool.errors import ConfigError

WHERE = "DevicePrefetcher"
_END = object()


class _Failure:
    """An exception raised in the thread, raised again in the loop that reads the batches."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _CudaOps:
    """The CUDA side of a prefetch: pinned copies on a side stream, an event per batch, the consumer's wait."""

    def __init__(self, device: torch.device) -> None:
        # "cuda" means the current device; the thread must be told which (set_device takes an index)
        self.device = device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
        self.stream = torch.cuda.Stream(device=self.device)

    def thread_start(self) -> None:
        torch.cuda.set_device(self.device)

    def copy(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "cpu" and not tensor.is_pinned():
            tensor = tensor.pin_memory()
        with torch.cuda.stream(self.stream):
            return tensor.to(self.device, non_blocking=True)

    def event(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> Any:
        """Make the consumer's current stream wait for the copy; returns that stream."""
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        return consumer

    def record(self, tensor: torch.Tensor, consumer: Any) -> None:
        if tensor.device.type == "cuda":
            tensor.record_stream(consumer)


def _device_ops(device: torch.device) -> _CudaOps | None:
    """None (pass through) on CPU; the CUDA copier on a CUDA device; a refusal elsewhere."""
    if device.type == "cpu":
        return None
    if device.type != "cuda":
        raise ConfigError(f"device {str(device)!r} is not cuda or cpu, {WHERE}, pass 'cuda', 'cuda:N' or 'cpu'")
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device {str(device)!r} but torch sees no CUDA device, {WHERE}, pass device='cpu' (batches pass through)"
        )
    return _CudaOps(device)


def map_tensors(
    obj: Any, fn: Callable[[torch.Tensor], torch.Tensor], memo: dict[int, torch.Tensor] | None = None
) -> Any:
    """`obj` with `fn` applied to every tensor inside mappings, lists and tuples (named tuples, dict subclasses and
    UserDicts such as BatchEncoding / BatchFeature keep their type); one result per tensor object (`memo`);
    anything else is returned as it is."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if id(obj) not in memo:
            memo[id(obj)] = fn(obj)
        return memo[id(obj)]
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn, memo) for k, v in obj.items()}
        if type(obj) is dict:
            return items
        if isinstance(obj, MutableMapping):
            # a dict subclass, or a UserDict such as transformers' BatchEncoding / BatchFeature: keep the class
            # and its other attributes
            out = copy.copy(obj)
            out.update(items)
            return out
        return items  # a read-only mapping: its tensors moved, as a dict
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn, memo) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(v, fn, memo) for v in obj)
    return obj


def _tensors(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor inside `obj` (the structures `map_tensors` walks)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class DevicePrefetcher:
    """Wrap a loader (`ResumableLoader`, a `DataLoader`, any iterable of batches) so that its batches arrive on
    `device`, copied `ahead` batches ahead on a side CUDA stream (module docstring). On CPU: the loader as is."""

    def __init__(self, loader: Any, device: str | torch.device, *, ahead: int = 1) -> None:
        if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 1:
            raise ConfigError(f"ahead={ahead!r}, {WHERE}, pass a whole number of batches >= 1 (1 is enough)")
        self.loader = loader
        self.device = torch.device(device)
        self.ahead = ahead
        self._ops = _device_ops(self.device)
        self._run: _Run | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._ops is None:
            return iter(self.loader)
        self._close()
        self._run = _Run(self.loader, self._ops, self.ahead, self._snapshot())
        return self._run.batches()

    def __len__(self) -> int:
        return len(self.loader)

    def _snapshot(self) -> Any:
        return copy.deepcopy(self.loader.state_dict()) if hasattr(self.loader, "state_dict") else None

    def _close(self) -> None:
        """Stop a run that is still going; put the batches it took ahead back into the loader."""
        run, self._run = self._run, None
        if run is not None and run.stop() and hasattr(self.loader, "load_state_dict"):
            self.loader.load_state_dict(copy.deepcopy(run.delivered))

    def state_dict(self) -> dict[str, Any]:
        """The loader's state as of the last batch handed out (not the batches held ahead)."""
        if not hasattr(self.loader, "state_dict"):
            raise ConfigError(
                f"{type(self.loader).__name__} has no state_dict, {WHERE}, wrap a ResumableLoader to resume"
            )
        if self._run is not None and not self._run.finished:
            return copy.deepcopy(self._run.delivered)
        return self.loader.state_dict()  # type: ignore[no-any-return]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state` (stops a run still going: the next `iter()` starts from `state`)."""
        if not hasattr(self.loader, "load_state_dict"):
            raise ConfigError(
                f"{type(self.loader).__name__} has no load_state_dict, {WHERE}, wrap a ResumableLoader to resume"
            )
        self._close()
        self.loader.load_state_dict(state)


class _Run:
    """One pass over the loader: a thread fills a queue of (device batch, copy event, loader state after it)."""

    def __init__(self, loader: Any, ops: _CudaOps, ahead: int, start_state: Any) -> None:
        self.loader, self.ops = loader, ops
        self.delivered = start_state  # the loader's state as of the last batch handed out
        self.finished = False  # every batch the loader gave was handed out (or the run failed)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=ahead)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="packtool-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        source = iter(self.loader)
        try:
            self.ops.thread_start()
            for batch in source:
                state = copy.deepcopy(self.loader.state_dict()) if hasattr(self.loader, "state_dict") else None
                moved = map_tensors(batch, self.ops.copy)
                if not self._put((moved, self.ops.event(), state)):
                    return
            self._put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(_Failure(exc))
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # a DataLoader iterator shuts its workers down

    def batches(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    item = self._queue.get(timeout=0.1)
                except queue.Empty:
                    if self._stop.is_set():
                        raise ConfigError(
                            f"this loop's batches were stopped by a later iter() or load_state_dict(), {WHERE}, "
                            "iterate the prefetcher again (one loop at a time)"
                        ) from None
                    continue
                if item is _END:
                    self.finished = True
                    return
                if isinstance(item, _Failure):
                    self.finished = True
                    raise item.exc
                moved, event, state = item
                consumer = self.ops.wait(event)
                for tensor in _tensors(moved):
                    self.ops.record(tensor, consumer)
                self.delivered = state
                yield moved
        finally:  # a loop left early (or this generator collected): the thread stops; the put-back is _close's
            self._stop.set()

    def stop(self) -> bool:
        """Stop the thread; True when batches were taken from the loader but not handed out."""
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        return not self.finished
