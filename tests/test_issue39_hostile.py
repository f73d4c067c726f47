"""Issue 39, a hostile pass: hub datasets, pair_scores and the prefetcher as a user and a reviewer meet them.

Each test here failed on the code before the fix its commit carries (see `git log`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_loopback import Hub
from test_hub_datasets import TEST, TRAIN, Run, hub, parquet, run  # noqa: F401 - fixtures

from packtool.formats.token_store import open_token_store

pytest.importorskip("huggingface_hub")


def jsonl(rows: list[dict[str, object]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def test_card_data_files_are_read_in_the_cards_order_as_load_dataset_reads_them(hub: Hub, run: Run) -> None:
    """`path: [zz.jsonl, aa.jsonl]`: datasets reads zz then aa (pattern order), never the sorted order."""
    card = b"---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: [zz.jsonl, aa.jsonl]\n---\n"
    hub.dataset("acme/ordered", {"README.md": card, "zz.jsonl": jsonl(TRAIN[:5]), "aa.jsonl": jsonl(TRAIN[5:9])}, "main")
    assert run.ok("hf://datasets/acme/ordered", "o") == run.local(TRAIN[:9], "ref")


def test_a_split_of_several_keywords_is_read_in_datasets_keyword_order(hub: Hub, run: Run) -> None:
    """test.jsonl and eval.jsonl are both the test split: datasets reads `test` before `eval` (its keyword order)."""
    hub.dataset("acme/kw", {"train.jsonl": jsonl(TRAIN[:3]), "eval.jsonl": jsonl(TEST[:3]),
                            "test.jsonl": jsonl(TEST[3:])}, "main")  # fmt: skip
    assert run.ok("hf://datasets/acme/kw", "k", "--split", "test") == run.local(TEST[3:] + TEST[:3], "ref")
