"""`.json`: one JSON array of records, streamed element by element (`inputs/jsonscan.py`); a `.json`
whose first character is `{` is JSON Lines, as `datasets`' json loader reads it, and its chunks are
the jsonl reader's.

Array elements are numbered by their 0-based index (`record N of the JSON array`); a bad element is a
bad record at its index, a broken array a file-level error found while planning.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from packtool.stages.tokenize.inputs.readers.base import Numbering, Plan, ReaderDefaults, Span
from packtool.stages.tokenize.inputs.readers.jsonl import plan_lines
from packtool.stages.tokenize.inputs.record import RawRecord

if TYPE_CHECKING:
    from packtool.stages.tokenize.inputs.chunk import Chunk

#: `.json` files a directory walk leaves out: model, tokenizer, dataset and store metadata, not records
NOT_DATA_JSON = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "config.json",
        "generation_config.json",
        "manifest.json",
        "dataset_info.json",
        "dataset_infos.json",
        "state.json",
        "dataset_dict.json",
    }
)


class JsonArrayReader(ReaderDefaults):
    kind: str = "json"
    suffixes: tuple[str, ...] = (".json",)
    numbering: Numbering = Numbering.INDEX
    family: str = "json"
    family_rank: int = 2
    record_label: str = "of the JSON array"
    not_data: frozenset[str] = NOT_DATA_JSON

    def plan(self, path: str, chunk_bytes: int) -> Plan:
        from packtool.stages.tokenize.inputs.jsonscan import check_json_lines, plan_json_array, starts_as_array

        if not starts_as_array(path):
            check_json_lines(path)  # one pretty-printed object is refused here, at file level
            return plan_lines(path, chunk_bytes)._replace(read_as="jsonl")  # JSON Lines named .json
        size, ranges = plan_json_array(path, chunk_bytes)
        return Plan(size, [Span(s, e, index, e - s) for s, e, index in ranges])

    def read(self, chunk: Chunk, limit: int, separator: str | None) -> Iterator[RawRecord]:
        from packtool.stages.tokenize.inputs.jsonscan import json_array_records

        yield from json_array_records(chunk.paths[0], chunk.start, chunk.end, chunk.first_line, limit)


READERS = (JsonArrayReader(),)
