"""TRL 1.16's own `DPOTrainer` preprocessing on every preference shape == packtool's preference token store.

`DPOTrainer._prepare_dataset` (prompt extraction, EOS on standard records, the chat template with
`add_generation_prompt`, the cut where prompt and prompt+completion diverge) runs on a `datasets.Dataset` of
each shape's records, with two real chat templates (Qwen2.5, Llama 3.1; tiny tokenizers built offline, Llama's
with a BOS post-processor), and `DataCollatorForPreference` turns it into TRL's forward sequences and
completion masks. packtool's store of the same records (LLaMA-Factory's ranking records converted as
docs/CHAT.md says) must hold the same ids and targets, byte for byte, pair i as documents 2i and 2i+1. The
step-by-step reference of the default suite (`trl_preference_reference.trl_reference`) is checked against it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
from input_support import tokenize_ok  # noqa: E402
from support import write_jsonl  # noqa: E402
from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer  # noqa: E402
from trl_preference_reference import (  # noqa: E402
    LIST_TOOLS,
    MIXED_PARTS,
    SHAPES,
    as_trl,
    build_tokenizers,
    hf_tokenizer,
    sequences,
    trl_reference,
)

from packtool.formats.token_store import open_token_store  # noqa: E402


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tokenizers(tmp_path_factory.mktemp("trl_pref_tok"), FAMILIES)


def trl_sequences(hf: Any, records: list[dict[str, Any]], tools_as_text: bool = True) -> list[tuple[list[int], list[int]]]:
    """TRL's own preprocessing and collator: (ids, completion mask) of chosen_0, rejected_0, chosen_1, ..."""
    trainer = SimpleNamespace(_tokenizer=hf)  # what _prepare_dataset reads of the trainer
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    rows = [{**r, "tools": r["tools"]} if "tools" in r else r for r in records]
    if tools_as_text and any("tools" in r for r in rows):  # one Arrow type for the column: TRL json.loads a string
        rows = [{**r, "tools": json.dumps(r["tools"]) if isinstance(r.get("tools"), list) else r.get("tools")}
                for r in rows]
    prepared = DPOTrainer._prepare_dataset(trainer, datasets.Dataset.from_list(rows), hf, args, "train")  # type: ignore[arg-type]
    collate = DataCollatorForPreference(pad_token_id=hf.eos_token_id)
    out = []
    for example in prepared:
        batch = collate([example])
        for row in range(2):  # chosen, then rejected
            keep = batch["attention_mask"][row].bool()
            out.append((batch["input_ids"][row][keep].tolist(), batch["completion_mask"][row][keep].tolist()))
    return out


#: Qwen2.5 and Llama 3.1 as in the default suite, plus Qwen3 (reasoning: the last assistant turn gets a think
#: block) and DeepSeek-V3 (whose generation prompt TRL's common-prefix cut was written for)
FAMILIES = ["qwen2_5", "llama3_1", "qwen3", "deepseek_v3"]
TOOLS_RENDERED = {"qwen2_5", "qwen3"}


@pytest.mark.parametrize("family", FAMILIES)
def test_trl_dpo_preprocessing_equals_the_preference_store(tmp_path: Path, tokenizers: dict[str, Path],
                                                           family: str) -> None:
    tok_dir = tokenizers[family]
    hf = hf_tokenizer(tok_dir, family)
    for name, (_, records) in SHAPES.items():
        if family not in TOOLS_RENDERED and name != "standard":
            records = [r for r in records if "tools" not in r]  # these templates render no tools
        trl_records = [as_trl(name, r) for r in records]
        want = trl_sequences(hf, trl_records)
        assert sequences(trl_reference(hf, trl_records)) == want, (family, name)  # the default suite's reference
        out = tokenize_ok([write_jsonl(tmp_path / f"{name}.jsonl", records)], tok_dir, tmp_path / f"{family}_{name}",
                          "--format", "preference")
        store = open_token_store(out)
        got = [(store.document(d).tolist(), store.loss[store.starts[d]: store.boundaries[d]].tolist())
               for d in range(store.n_documents)]
        assert got == want, (family, name)
        assert store.preference_pairs == len(records)


@pytest.mark.parametrize(("family", "case"), [("llama3_1", MIXED_PARTS), ("qwen2_5", LIST_TOOLS)])
def test_objects_with_mixed_keys_equal_trl(tmp_path: Path, tokenizers: dict[str, Path], family: str, case: Any) -> None:
    """Content parts with mixed keys (a template that prints the list), a list of tools and tool calls whose
    arguments differ (a template that prints them with `tojson`): `datasets.Dataset.from_list` gives every object
    of a kind every key of any in its column, and TRL renders those Nones; the store holds TRL's ids. The default
    suite's written-out reading (`case[1]`) is TRL's."""
    written, read = case
    hf = hf_tokenizer(tokenizers[family], family)
    want = trl_sequences(hf, written, tools_as_text=False)
    assert sequences(trl_reference(hf, read)) == want
    out = tokenize_ok([write_jsonl(tmp_path / "p.jsonl", written)], tokenizers[family], tmp_path / "out",
                      "--format", "preference")
    store = open_token_store(out)
    got = [(store.document(d).tolist(), store.loss[store.starts[d]: store.boundaries[d]].tolist())
           for d in range(store.n_documents)]
    assert got == want
