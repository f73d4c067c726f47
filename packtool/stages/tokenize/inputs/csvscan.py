"""The compiled scanner of CSV/TSV row ends, and the rows of a block stream cut at them (`readers/delimited.py`).

The scanner (numba, compiled on first use) follows the quoting as `csv` does: a `"` opens a quoted cell only at a
cell's start, `""` is a quote inside one, and a line end (`\n`, `\r\n` or a lone `\r`) ends a row only outside
quotes. Its state is carried across blocks, so a file read in blocks of any size is cut where `csv` would cut it:
`delimited.py` plans its chunks at these row ends (no cut falls inside a quoted cell) and reads rows with them,
dropping a row over `--max-record-bytes` unread. A file that ends inside a quoted cell is an error naming it, after
`csvsniff.check_encoding` has ruled out a file that is not CSV text at all.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from functools import cache
from typing import TYPE_CHECKING

from packtool.errors import InputError
from packtool.stages.tokenize.inputs.csvsniff import check_encoding

if TYPE_CHECKING:
    import numpy as np

    from packtool.stages.tokenize.inputs.streams import TooLong

HINT = "check the file's quoting: a quoted cell must end with '\"' (write a quote inside one as '\"\"')"
STATE = 0  # the scanner's state, carried across blocks: where the current row stands
QUOTED = 2  # ... inside a quoted cell (0: at a cell's start, 1: in an unquoted cell, 3: after a quote in a quoted one)


def _scan(
    buf: np.ndarray, delimiter: int, state: np.ndarray, ends: np.ndarray, at_end: int
) -> int:  # pragma: no cover - numba
    """Walk `buf` as `csv` parses it; write the positions of the line ends that end a row into `ends`: a `\n`
    (`\r\n`'s `\n`), or a lone `\r` (classic Mac OS line ends, which `csv` reads as row ends too).

    Returns how many were written (`ends` is as long as `buf`: never full). `state[STATE]` carries where
    a row stands across blocks: at a cell's start, in an unquoted cell, in a quoted one, or just after a
    quote inside a quoted one (the cell ends, or `""` is a quote). A block never ends with a `\r` unless
    `at_end` (`row_ends` holds it back), so whether a `\n` follows it is always known."""
    s = state[STATE]
    n = 0
    i = 0
    size = buf.size
    while i < size:
        if s == 2:  # in a quoted cell: the bulk of a long text, straight to the next quote
            while i < size and buf[i] != 34:
                i += 1
            if i < size:
                s = 3
            i += 1
            continue
        if s == 1:  # in an unquoted cell: straight to its end
            while i < size and buf[i] != delimiter and buf[i] != 10 and buf[i] != 13:
                i += 1
            if i == size:
                break
        c = buf[i]
        if c == 10:  # \n outside quotes: the row ends
            ends[n] = i
            n += 1
            s = 0
        elif c == 13:  # a line end outside quotes: \r\n's \n ends the row, a lone \r ends it here
            if i + 1 == size or buf[i + 1] != 10:
                ends[n] = i
                n += 1
            s = 0
        elif c == delimiter:  # a cell ends
            s = 0
        elif s == 0:
            s = 2 if c == 34 else 1
        elif s == 3:
            s = 2 if c == 34 else 1  # `""`: a quote inside the cell; else text after the closing quote
        i += 1
    state[STATE] = s
    return n


@cache
def _kernel() -> Callable[[np.ndarray, int, np.ndarray, np.ndarray, int], int]:
    """`_scan` compiled on first use: numba's import is paid only by runs that read CSV or TSV."""
    from numba import njit

    return njit(cache=True, nogil=True)(_scan)  # type: ignore[no-any-return]


def row_ends(blocks: Iterator[bytes], delimiter: str, state: np.ndarray) -> Iterator[tuple[bytes, np.ndarray]]:
    """(block, positions of its row-ending line ends) for each block; `state` carries the scanner across them.

    A block's last `\r` is held back to start the next one (a `\r\n` is never cut), so the blocks yielded
    may differ by that byte from the ones read; they hold the same bytes in the same order."""
    import numpy as np

    scan = _kernel()
    carry = b""
    for block in blocks:
        if carry:
            block = carry + block
        block, carry = (block[:-1], b"\r") if block.endswith(b"\r") else (block, b"")
        if block:
            buf = np.frombuffer(block, np.uint8)
            ends = np.empty(buf.size, np.int64)
            n = scan(buf, ord(delimiter), state, ends, 0)
            yield block, ends[:n]
    if carry:
        ends = np.empty(1, np.int64)
        n = scan(np.frombuffer(carry, np.uint8), ord(delimiter), state, ends, 1)
        yield carry, ends[:n]


def breaks(data: bytes, start: int = 0, end: int | None = None) -> int:
    """Line breaks in `data[start:end]`: `\n`, `\r\n` and a lone `\r` each count one (as editors number lines)."""
    n = data.count(b"\n", start, end)
    cr = data.count(b"\r", start, end)
    return n + cr - data.count(b"\r\n", start, end) if cr else n


def new_state() -> np.ndarray:
    import numpy as np

    return np.zeros(1, np.int64)


def row_batches(
    path: str, blocks: Iterator[bytes], delimiter: str, limit: int, compression: str = ""
) -> Generator[list[bytes | TooLong], None, None]:
    """The rows of a block stream, a batch per block, each row without its newline, or a `TooLong` for one over
    `limit` bytes (never held: its bytes are dropped as they come). What follows the last row end is the last
    row."""
    from packtool.stages.tokenize.inputs.streams import TooLong

    parts: list[bytes] = []
    held = 0
    dropping, dropped, dropped_nl = False, 0, 0
    state = new_state()
    for block, ends in row_ends(blocks, delimiter, state):
        batch: list[bytes | TooLong] = []
        prev = 0
        for end in ends.tolist():
            piece = block[prev:end]
            if block[end] == 10 and piece.endswith(b"\r"):  # \r\n: the row ends at its \r
                piece = piece[:-1]
            if dropping:
                batch.append(TooLong(dropped + len(piece), dropped_nl + breaks(piece)))
            elif held + len(piece) > limit:
                batch.append(TooLong(held + len(piece), sum(breaks(p) for p in parts) + breaks(piece)))
            else:
                batch.append(b"".join((*parts, piece)) if parts else piece)
            parts, held, dropping, prev = [], 0, False, end + 1
        tail = block[prev:]
        if dropping:
            dropped, dropped_nl = dropped + len(tail), dropped_nl + breaks(tail)
        elif held + len(tail) > limit:  # drop the row as it comes: never more than `limit` bytes held
            dropping, dropped = True, held + len(tail)
            dropped_nl = sum(breaks(p) for p in parts) + breaks(tail)
            parts, held = [], 0
        else:
            parts.append(tail)
            held += len(tail)
        if batch:
            yield batch
    if int(state[STATE]) == QUOTED:
        check_encoding(path, compression)
        raise InputError("a quoted cell is not closed: the file ends inside its last row", path, hint=HINT)
    if dropping:
        yield [TooLong(dropped, dropped_nl)]
    elif held:
        yield [b"".join(parts)]
