"""The `.json` reader's machinery: ONE JSON array of records, streamed (never the whole file in memory).

A compiled scanner (numba, ~1 GB/s on one core) walks the bytes with the little JSON state
that matters at the top level: inside a string or not, an escape pending, the nesting depth.
It reports the commas between the array's elements and the array's close; each element is
then parsed alone by orjson. Planning scans the file once (as jsonl planning counts newlines)
and cuts chunks at element boundaries: a chunk is a byte range starting right after a comma
(or the opening `[`) and ending at a comma (or the closing `]`), with the 0-based index of its
first element, so chunks are read in parallel and resume as jsonl chunks do.

Structure that breaks the array itself (no `[` first, the file ends inside the array, data
after its `]`) is a file-level InputError found at planning, before any work; a bad element
(malformed JSON, an empty element such as `[1,,2]`, one over `--max-record-bytes`) is a
per-record error addressed by its index. Memory per reader: one block + the longest element.

A `.json` file whose first character is `{` is JSON Lines, as `datasets`' json loader reads
it (many hub datasets name their jsonl `.json`): the reader plans it as `.jsonl`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache

import numpy as np
import orjson

from packtool.errors import InputError
from packtool.formats.oserrors import reading
from packtool.stages.tokenize.inputs.record import BOM, RawRecord, too_long_reason
from packtool.stages.tokenize.inputs.streams import file_blocks

_BLOCK = 1 << 22
_HINT = "check that the file is one complete JSON array of records (or JSON Lines, one object per line)"

# scanner state (an int64 array carried across blocks)
_PHASE, _DEPTH, _IN_STRING, _ESCAPE, _ERROR_AT, _NEXT, _OPEN = range(7)
_EVENTS = 1 << 16  # events per scanner call: memory stays one block + 512 KiB however dense the commas
_BEFORE, _INSIDE, _AFTER, _NOT_ARRAY, _GARBAGE, _BAD_CLOSE = range(6)
_CLOSE = -1  # an event position < 0 marks the array's close at -(event) - 2


def _scan(buf: np.ndarray, offset: int, state: np.ndarray, events: np.ndarray) -> int:  # pragma: no cover - numba
    """Scan `buf` (bytes at file `offset`) from state[_NEXT]: write top-level comma positions, or
    -(pos)-2 for the close, until `events` is full (state[_NEXT]: where to go on; buf.size: done).

    Returns the number of events written. A structural error sets state[_PHASE] and
    state[_ERROR_AT] and stops the scan."""
    phase, depth, in_string, escape = state[_PHASE], state[_DEPTH], state[_IN_STRING], state[_ESCAPE]
    n = 0
    i = state[_NEXT]
    size, cap = buf.size, events.size
    while i < size and n < cap:
        if in_string:  # the bulk of the bytes: a tight loop to the next quote or backslash
            if escape:
                escape = 0
                i += 1
                continue
            while i < size and buf[i] != 34 and buf[i] != 92:
                i += 1
            if i < size:
                if buf[i] == 34:
                    in_string = 0
                else:
                    escape = 1
                i += 1
            continue
        c = buf[i]
        i += 1
        if phase == 1:
            if c == 34:
                in_string = 1
            elif c == 123 or c == 91:  # { [
                depth += 1
            elif c == 125 or c == 93:  # } ]
                depth -= 1
                if depth == 0:
                    if c != 93:
                        phase = 5
                        state[_ERROR_AT] = offset + i - 1
                        break
                    phase = 2
                    events[n] = -(offset + i - 1) - 2
                    n += 1
            elif c == 44 and depth == 1:  # ,
                events[n] = offset + i - 1
                n += 1
        elif c == 32 or c == 9 or c == 10 or c == 13:
            continue
        elif phase == 0:
            if c != 91:
                phase = 3
                state[_ERROR_AT] = offset + i - 1
                break
            phase = 1
            depth = 1
            state[_OPEN] = offset + i  # the byte after `[`
        else:  # phase 2: anything but whitespace after the close
            phase = 4
            state[_ERROR_AT] = offset + i - 1
            break
    state[_PHASE], state[_DEPTH], state[_IN_STRING], state[_ESCAPE], state[_NEXT] = phase, depth, in_string, escape, i
    return n


@cache
def _kernel() -> Callable[[np.ndarray, int, np.ndarray, np.ndarray], int]:
    """`_scan` compiled on first use: numba's import (~0.4 s) is paid only by runs that read a `.json` array."""
    from numba import njit

    return njit(cache=True, nogil=True)(_scan)  # type: ignore[no-any-return]


def _new_state(phase: int) -> np.ndarray:
    state = np.zeros(7, np.int64)
    state[_PHASE] = phase
    state[_DEPTH] = 1 if phase == _INSIDE else 0
    state[_ERROR_AT] = -1
    return state


def _events(block: bytes, offset: int, state: np.ndarray) -> Iterator[np.ndarray]:
    """The events of one block, in batches of at most `_EVENTS`."""
    buf = np.frombuffer(block, np.uint8)
    events = np.empty(_EVENTS, np.int64)
    state[_NEXT] = 0
    scan = _kernel()
    while state[_NEXT] < buf.size and state[_PHASE] < _NOT_ARRAY:
        yield events[: scan(buf, offset, state, events)]


def starts_as_array(path: str) -> bool:
    """True when the first non-blank character is `[` (a JSON array), False for `{` (JSON Lines)."""
    with reading(path), open(path, "rb") as fh:
        head = fh.read(1 << 16).removeprefix(BOM).lstrip(b" \t\r\n")
        while not head:
            more = fh.read(1 << 16)
            if not more:
                raise InputError("the file is empty, expected one JSON array of records", path, hint=_HINT)
            head = more.lstrip(b" \t\r\n")
    return head[:1] != b"{"


#: how much of a `{`-first `.json` file is read to tell JSON Lines from one object spread over lines
_FIRST_LINE_LIMIT = 1 << 24
_OBJECT_PEEK = 1 << 20


def check_json_lines(path: str) -> None:
    """A `.json` file that does not start with `[` is read as JSON Lines (as `datasets` reads it); refuse one that
    is one JSON object spread over several lines (pretty-printed, or records under a key), with what it holds and
    how to hand it over, instead of a per-line error at line 1.

    Memory stays bounded: only the first non-blank line (at most 16 MiB) is parsed. JSON Lines has a whole value
    on it; a value that runs on past the line's end is an object spanning lines; a first line that is malformed
    before its end stays line 1's own error. The first MiB is then peeked at to name the key holding the records.
    (Approach from the helper's branch `leftovers`, which parsed less than this function first did: the whole
    file, up to 256 MiB.)
    """
    import json

    with reading(path), open(path, "rb") as fh:
        line = fh.readline(_FIRST_LINE_LIMIT).removeprefix(BOM)
        while line and not line.strip():
            line = fh.readline(_FIRST_LINE_LIMIT)
        if not line.endswith(b"\n"):
            return  # the only line, or longer than the limit: the JSON Lines reader reports it
        text = line.decode("utf-8", errors="replace").rstrip()
        try:
            json.loads(text)
            return  # a whole value on its first line: JSON Lines
        except RecursionError:
            return  # nested deeper than any record: line 1's own error (orjson's depth limit) says so
        except json.JSONDecodeError as exc:
            if exc.pos < len(text):
                return  # malformed, not unfinished: line 1's own error
        fh.seek(0)
        raw = fh.read(_OBJECT_PEEK)
        peek = raw.removeprefix(BOM).decode("utf-8", errors="replace").lstrip()
    try:
        value, _ = json.JSONDecoder().raw_decode(peek)
    except RecursionError:
        value = None  # an object nested deeper than Python's parser goes: no key to name
    except json.JSONDecodeError:
        if len(raw) < _OBJECT_PEEK:
            return  # the whole file is no JSON value: broken JSON Lines, line 1's own error says where
        value = None  # an object longer than the peek
    lists = [k for k, v in value.items() if isinstance(v, list)] if isinstance(value, dict) else []
    under = f" (its records may be the list under {lists[0]!r})" if len(lists) == 1 else ""
    raise InputError(
        f"the file is one JSON object spread over several lines{under}, not JSON Lines (one record per line) "
        "or a JSON array of records",
        path,
        hint="write the records as a JSON array or as JSON Lines (e.g. jq -c '.KEY[]' FILE > FILE.jsonl)",
    )


def plan_json_array(path: str, chunk_bytes: int) -> tuple[int, list[tuple[int, int, int]]]:
    """(file size, chunks as (start byte, end byte, index of the first element)), cut at element boundaries.

    Raises InputError when the file is not one complete JSON array."""
    state = _new_state(_BEFORE)
    offset = 0
    cuts: list[tuple[int, int]] = []  # (byte after a comma, index of the element it starts)
    n_commas = 0
    close = -1
    target = chunk_bytes
    with reading(path), open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            start = len(BOM) if offset == 0 and block.startswith(BOM) else 0
            for batch in _events(memoryview(block)[start:], offset + start, state):  # type: ignore[arg-type]
                events = batch
                if events.size and events[-1] < 0:
                    close = int(-events[-1] - 2)
                    events = events[:-1]
                while events.size:  # chunk cuts: the first comma at or after each multiple of chunk_bytes
                    k = int(np.searchsorted(events, target - 1))
                    if k >= events.size:
                        break
                    cuts.append((int(events[k]) + 1, n_commas + k + 1))
                    target = max(target + chunk_bytes, int(events[k]) + 1 + chunk_bytes)
                n_commas += int(events.size)
            _check(path, state)
            offset += len(block)
    _check(path, state)
    if state[_PHASE] == _BEFORE:
        raise InputError("the file is empty, expected one JSON array of records", path, hint=_HINT)
    if state[_PHASE] == _INSIDE:
        where = "inside a string" if state[_IN_STRING] else f"inside element {n_commas}"
        raise InputError(
            f"the JSON array is truncated: the file ends {where} (the array's ']' is missing)", path, hint=_HINT
        )
    first = int(state[_OPEN])
    if n_commas == 0 and _blank(path, first, close):
        return offset, []  # `[]` (whitespace inside, however much): an empty array holds no records
    starts = [(first, 0), *cuts]
    chunks = [(s, starts[i + 1][0] - 1 if i + 1 < len(starts) else close, index) for i, (s, index) in enumerate(starts)]
    return offset, chunks


def _blank(path: str, start: int, end: int, block: int = 1 << 20) -> bool:
    """Whether bytes [start, end) of the file are all JSON whitespace (read a block at a time)."""
    with reading(path), open(path, "rb") as fh:
        fh.seek(start)
        while start < end:
            data = fh.read(min(block, end - start))
            if not data or data.strip(b" \t\r\n"):
                return not data
            start += len(data)
    return True


def _check(path: str, state: np.ndarray) -> None:
    phase, at = int(state[_PHASE]), int(state[_ERROR_AT])
    if phase == _NOT_ARRAY:
        raise InputError(f"not a JSON array: byte {at} is not '[' (expected one array of records)", path, hint=_HINT)
    if phase == _GARBAGE:
        raise InputError(f"unexpected data after the JSON array's end, at byte {at}", path, hint=_HINT)
    if phase == _BAD_CLOSE:
        raise InputError(f"the JSON array is malformed: an unmatched '}}' at byte {at} closes it", path, hint=_HINT)


def json_array_records(path: str, start: int, end: int, first_index: int, limit: int) -> Iterator[RawRecord]:
    """The elements in bytes `start:end` of a planned chunk, parsed; `line` holds the 0-based index."""
    state = _new_state(_INSIDE)
    index = first_index
    pending: list[bytes] = []
    pending_bytes = 0
    dropped = -1  # bytes of an over-long element skipped so far; -1: not skipping
    offset = start
    for block in file_blocks(path, start, end):
        prev = 0
        for batch in _events(block, offset, state):  # commas only: a chunk ends before the array's close
            for cut in (batch - offset).tolist():
                yield _element(path, index, pending, block[prev:cut], pending_bytes, dropped, limit)
                index += 1
                pending, pending_bytes, dropped, prev = [], 0, -1, cut + 1
        tail = block[prev:]
        if dropped >= 0:
            dropped += len(tail)
        elif pending_bytes + len(tail) > limit:
            dropped, pending, pending_bytes = pending_bytes + len(tail), [], 0
        else:
            pending.append(tail)
            pending_bytes += len(tail)
        offset += len(block)
    yield _element(path, index, pending, b"", pending_bytes, dropped, limit)


def _element(
    path: str, index: int, pending: list[bytes], piece: bytes, pending_bytes: int, dropped: int, limit: int
) -> RawRecord:
    if dropped >= 0 or pending_bytes + len(piece) > limit:
        return RawRecord(path, index, error=too_long_reason(max(dropped, pending_bytes) + len(piece), limit))
    data = b"".join((*pending, piece)) if pending else piece
    try:
        return RawRecord(path, index, orjson.loads(data))
    except orjson.JSONDecodeError as exc:
        if not data.strip():
            return RawRecord(path, index, error="empty element (two commas in a row, or a comma before ']')")
        message = str(exc)
        reason = "invalid UTF-8" if "utf-8" in message.lower() else f"malformed JSON ({message})"
        return RawRecord(path, index, error=reason)
