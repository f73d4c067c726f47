"""Whether a file named .csv or .tsv is UTF-8 text at all: asked before blaming its quoting or its header.

A zip (an Excel workbook), gzip, zstd, parquet or old Excel file is named by its first bytes, UTF-16 (Excel's
"Unicode text") by its byte order mark or its NUL bytes, binary data by its control bytes, and text in another
encoding (latin-1, cp1252) by its first byte that is not UTF-8; each with the fix.
"""

from __future__ import annotations

from packtool.errors import InputError

#: the fix for a file in another encoding (latin-1 and cp1252 are the usual ones: Excel's "CSV" on Windows)
ENCODING_HINT = (
    "re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8 FILE > FILE.utf8.csv), or export it as 'CSV UTF-8'"
)
_SNIFF_BYTES = 1 << 20
#: files often named .csv that are not text: (first bytes, what it is, the fix)
_MAGIC = (
    (b"PK\x03\x04", "a zip archive (an Excel .xlsx workbook?)", "save it as 'CSV UTF-8' (or unzip it)"),
    (b"\x1f\x8b", "gzip-compressed", "name it .csv.gz (or .tsv.gz) so it is decompressed"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", "name it .csv.zst (or .tsv.zst) so it is decompressed"),
    (b"PAR1", "a parquet file", "name it .parquet"),
    (b"\xd0\xcf\x11\xe0", "an old Excel .xls workbook", "save it as 'CSV UTF-8'"),
)


def check_encoding(path: str, compression: str) -> None:
    """Before blaming a file's quoting or header: an InputError when its first MiB is not UTF-8 text (binary
    data holding a NUL byte, or text in another encoding), naming the first byte that is not and the fix."""
    found = _first_non_text(path, compression)
    if found is None:
        return
    at, byte, head = found
    for magic, what, fix in _MAGIC:
        if head.startswith(magic):
            raise InputError(f"the file is not CSV text: it is {what}", path, hint=fix)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")) or _utf16_looking(head):  # Excel's "Unicode text"
        raise InputError(
            "the file is UTF-16 text, not UTF-8",
            path,
            hint="re-encode it as UTF-8 (e.g. iconv -f utf-16 -t utf-8 FILE > FILE.utf8.csv)",
        )
    controls = sum(1 for c in head if c < 32 and c not in (9, 10, 13))  # latin-1 text has none
    if byte == 0 or controls * 16 > len(head):
        shown = "a NUL byte" if byte == 0 else f"byte 0x{byte:02x}"
        raise InputError(
            f"the file is not CSV text: it holds {shown} at byte {at} and looks binary",
            path,
            hint="pass a CSV or TSV file of UTF-8 text",
        )
    raise InputError(
        f"the file is not UTF-8 text: byte 0x{byte:02x} at byte {at} is not UTF-8", path, hint=ENCODING_HINT
    )


def _utf16_looking(head: bytes) -> bool:
    """UTF-16 without a byte order mark: ASCII text with a NUL byte beside every character."""
    pairs = head[: len(head) & ~1][:256]
    return len(pairs) >= 8 and (pairs[0::2].count(0) == len(pairs) // 2) != (pairs[1::2].count(0) == len(pairs) // 2)


def _first_non_text(path: str, compression: str) -> tuple[int, int, bytes] | None:
    """(offset, byte, the file's first bytes) of the first NUL or non-UTF-8 byte in the first MiB of the
    (decompressed) file, or None (also when it cannot be read: the caller's error stands)."""
    import codecs

    from packtool.stages.tokenize.inputs.streams import blocks

    decoder = codecs.getincrementaldecoder("utf-8")()
    seen = 0
    head = b""
    try:
        for block in blocks(path, compression):
            block = block[: _SNIFF_BYTES - seen]
            head = head or block[:256]
            nul = block.find(b"\0")
            try:
                decoder.decode(block[:nul] if nul >= 0 else block)
            except UnicodeDecodeError as exc:
                return seen + exc.start, block[exc.start], head
            if nul >= 0:
                return seen + nul, 0, head
            seen += len(block)
            if seen >= _SNIFF_BYTES:
                return None
    except (InputError, OSError):
        return None
    return None
