"""Preference stores never read as plain ones: export refusals, pair-aware documents/batching, merge of shards.

Each defect here gave a number or file that looked right: an SFT export of pairs (the shared prompt dropped
from the completions' context), a dynamic batch holding a chosen sequence without its rejected one, a merged
store whose `preference.pairs` was the first shard's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from packtool.errors import ConfigError
from packtool.formats.token_store import TokenStoreWriter, dtype_for_max_id, open_token_store
from packtool.loader import DocumentDataset, DynamicBatchSampler, PackedCollator, PaddedCollator
from packtool.loader.collator import HF_KEYS
from packtool.stages.merge import merge_shards
from packtool.stages.pack import PackConfig, pack_store
from tests.preference_support import hostile_pairs, realistic_pairs, write_pref_store
from tests.support import EOS, PAD, cli, cli_error, make_store

SIZE = 512


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("prefguards")
    tok = write_pref_store(root / "tok", realistic_pairs(60, seed=5, scale=0.3) + hostile_pairs())
    out: dict = {"tok": tok}
    for share in (False, True):
        pack_store(PackConfig(tok, SIZE, root / f"packs{share}", share_prompt=share, overlong="drop"))
        out[share] = root / f"packs{share}"
    return out


# -- export -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["megatron-bridge", "nemo", "olmo-core"])
@pytest.mark.parametrize("share", [False, True])
def test_export_without_a_pair_format_refuses_a_preference_store(stores, tmp_path, target, share):
    out = tmp_path / "out"
    line = cli_error("export", str(stores[share]), "--to", target, "--output", str(out))
    layout = "shared-prompt" if share else "pairs"
    assert f"is a preference pack store (layout {layout}), --to {target}" in line
    assert "PackedDataset" in line and "pair_logps" in line
    assert ("the prompt they share" in line) == share
    assert not out.exists()  # nothing written, not even the directory


def test_export_trl_of_a_pair_store_prints_the_dpo_recipe_and_writes_no_sft_parquet(stores, tmp_path):
    for share in (True, False):  # TRL's DPO reads the pack store itself; an SFT parquet would train on rejected
        out_dir = tmp_path / f"x{int(share)}"
        code, out, err = cli("export", str(stores[share]), "--to", "trl", "--output", str(out_dir))
        assert code == 0, err
        assert "PackedDPOTrainer" in out and "nothing written" in out
        assert not list(out_dir.glob("*.parquet"))


def test_export_of_a_plain_store_is_unchanged(tmp_path):
    tok = make_store(tmp_path / "tok", np.full(20, 50), with_loss=True)
    pack_store(PackConfig(tok, 256, tmp_path / "packs"))
    code, _, err = cli("export", str(tmp_path / "packs"), "--to", "olmo-core", "--output", str(tmp_path / "o"))
    # plain packs pass the preference check (olmo-core may still refuse for its own reasons, e.g. EOS)
    assert "preference" not in err, err


# -- DocumentDataset, collators ------------------------------------------------------------------------


def test_document_items_carry_pair_keys(stores, tmp_path):
    ds = DocumentDataset(stores["tok"])
    assert ds.preference == ds.n_documents // 2 == 67
    for i in (0, 1, 6, 7, ds.n_documents - 1):
        item = ds[i]
        assert item["pair_ids"].tolist() == [i // 2] and item["chosen"].tolist() == [i % 2 == 0]
        assert item["prefix_segment"].tolist() == [-1]
    plain = DocumentDataset(make_store(tmp_path / "plain", np.full(6, 9)))
    assert plain.preference is None and "pair_ids" not in plain[0]


@pytest.mark.parametrize("via", ["flat", "items"])
def test_collators_carry_pair_ids_and_chosen(stores, via):
    ds = DocumentDataset(stores["tok"])
    idx = [3, 2, 10, 11]
    batch_items = ds.__getitems__(idx)
    items = batch_items if via == "flat" else [ds[i] for i in idx]
    flat = PackedCollator(flatten=True)(items)
    assert flat["pair_ids"].tolist() == [1, 1, 5, 5] and flat["chosen"].tolist() == [False, True, True, False]
    assert flat["prefix_segment"].tolist() == [-1] * 4
    hf = PackedCollator(flatten=True, keys=HF_KEYS)(items)
    assert hf["pair_ids"].tolist() == [1, 1, 5, 5] and "prefix_segment" not in hf  # not shared: the door needs none
    tail = PackedCollator(flatten=True, pad_to_length=4096)(items)  # the padding segment is no pair
    assert tail["pair_ids"].tolist() == [1, 1, 5, 5, -1] and tail["chosen"].tolist()[-1] is False
    padded = PaddedCollator(pad_id=ds.pad_id)(items)
    assert padded["pair_ids"].tolist() == [1, 1, 5, 5] and padded["chosen"].tolist() == [False, True, True, False]
    assert padded["input_ids"].shape[0] == 4


def test_padded_collator_refuses_pack_items_of_a_preference_store(stores):
    from packtool.loader import PackedDataset

    ds = PackedDataset(stores[False], size=SIZE)
    with pytest.raises(ConfigError, match="several sequences of a preference store"):
        PaddedCollator()([ds[0]])


# -- DynamicBatchSampler -------------------------------------------------------------------------------


def _check_pairs_whole(sampler: DynamicBatchSampler, lengths: np.ndarray, every: bool = True) -> None:
    seen: list[int] = []
    for epoch in (0, 1):
        seen = []
        for rank in range(sampler.num_replicas):
            batches = sampler.batches(epoch, rank)
            costs = sampler.costs(epoch)[:, rank]
            for b, cost in zip(batches, costs, strict=True):
                arr = np.asarray(b)
                assert arr.size % 2 == 0 and np.all(arr[0::2] % 2 == 0) and np.all(arr[1::2] == arr[0::2] + 1), b
                r = sampler.round_to
                rounded = (lengths[arr] + r - 1) // r * r
                want = arr.size * rounded.max() if sampler.padded else rounded.sum()
                assert cost == want
                assert want <= sampler.max_tokens or arr.size == 2  # over budget only as a pair alone
                seen += b
        if every:
            assert sorted(seen) == list(range(lengths.size))


@pytest.mark.parametrize(
    "kw",
    [
        {"max_tokens": 1500},
        {"max_tokens": 1500, "padded": True, "round_to": 8},
        {"max_tokens": 900, "round_to": 16, "num_replicas": 2, "rank": 1, "window": 8},
        {"max_tokens": 2000, "padded": True, "num_replicas": 3, "rank": 0, "shuffle": False},
        {"max_tokens": 1200, "drop_last": True, "num_replicas": 2, "rank": 0},
    ],
)
def test_dynamic_batches_keep_each_pair_whole(stores, kw):
    ds = DocumentDataset(stores["tok"])
    sampler = DynamicBatchSampler(ds, **kw)
    assert sampler.pairs
    _check_pairs_whole(sampler, ds.lengths, every=not kw.get("drop_last", False))


def test_dynamic_loader_batches_hold_both_sequences_of_every_pair(stores):
    ds = DocumentDataset(stores["tok"])
    sampler = DynamicBatchSampler(ds, 1000, seed=3)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=sampler, collate_fn=PackedCollator(flatten=True))
    pairs = []
    for batch in loader:
        ids, chosen = batch["pair_ids"], batch["chosen"]
        assert torch.equal(ids[0::2], ids[1::2]) and chosen[0::2].all() and not chosen[1::2].any()
        pairs += ids[0::2].tolist()
    assert sorted(pairs) == list(range(ds.preference))


def test_dynamic_sampler_pairs_option_and_state(stores):
    ds = DocumentDataset(stores["tok"])
    split = DynamicBatchSampler(ds, 1000, pairs=False)  # explicit: sequences batched independently
    assert not split.pairs
    lengths = np.asarray(ds.lengths)
    as_array = DynamicBatchSampler(lengths, 1000, pairs=True)
    assert as_array.batches() == DynamicBatchSampler(ds, 1000).batches()
    with pytest.raises(ConfigError, match="even number of documents"):
        DynamicBatchSampler(lengths[:-1], 1000, pairs=True)
    state = DynamicBatchSampler(ds, 1000).state_dict()
    assert state["pairs"] is True
    with pytest.raises(ConfigError, match="pairs=True"):
        split.load_state_dict(state)
    old = DynamicBatchSampler(lengths, 1000).state_dict()
    del old["pairs"]  # a state written before pairs existed resumes a plain sampler
    DynamicBatchSampler(lengths, 1000).load_state_dict(old)


# -- merge ---------------------------------------------------------------------------------------------


def _shard(path: Path, lengths: list[int], index: int, count: int, preference: bool) -> Path:
    """A shard store of one run: `lengths` documents (pairs when `preference`), chunks = shard index."""
    path.mkdir(parents=True)
    ids = np.arange(sum(lengths)) % 500 + 2
    writer = TokenStoreWriter(path, dtype_for_max_id(599))
    writer.append(ids, np.asarray(lengths, np.int64), (np.arange(sum(lengths)) % 3 != 0).astype(np.uint8))
    manifest = {
        "packtool_version": "test",
        "input_format": "preference",
        "tokenizer": {
            "name": "org/t",
            "sha256": "0" * 64,
            "vocab_size": 600,
            "bos_id": None,
            "eos_id": EOS,
            "pad_id": PAD,
        },
        "sources": [{"path": "in.jsonl", "records": len(lengths) // 2, "documents": len(lengths), "rejected": 0}],
        "build": f"b{index}",
        "shard": {
            "index": index,
            "count": count,
            "chunk_start": index,
            "chunk_end": index + 1,
            "n_chunks": count,
            "build": "run",
        },
    }
    if preference:
        manifest["preference"] = {"pairs": len(lengths) // 2, "layout": "chosen,rejected"}
    writer.finish(manifest)
    return path


def test_merge_sums_the_pairs_of_preference_shards(tmp_path):
    shards = [_shard(tmp_path / "s0", [5, 6], 0, 2, True), _shard(tmp_path / "s1", [3, 4, 7, 2], 1, 2, True)]
    result = merge_shards(shards, tmp_path / "out")
    assert result.manifest["preference"] == {"pairs": 3, "layout": "chosen,rejected"}
    store = open_token_store(tmp_path / "out")
    assert store.preference_pairs == 3 and store.n_documents == 6
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["preference"]["pairs"] == 3


def test_merge_refuses_preference_and_plain_shards_together(tmp_path):
    shards = [_shard(tmp_path / "s0", [5, 6], 0, 2, True), _shard(tmp_path / "s1", [3, 4], 1, 2, False)]
    line = cli_error("merge", *map(str, shards), "--output", str(tmp_path / "out"))
    assert "is a preference store" in line and "is not" in line
    assert not (tmp_path / "out").exists()


# -- stats and balance over a shared-prompt pack store ---------------------------------------------------


def _by_hand(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """(documents per pack, causal attention sum of squares per pack) from the segment roles, by hand."""
    from packtool.formats.pack_store import ROLE_PROMPT, open_pack_split, pack_dir

    ps = open_pack_split(pack_dir(root, "org/tiny-tok"), "training", SIZE)
    docs, squares = [], []
    for p in range(ps.n_packs):
        a, b = int(ps.pack_offsets[p]), int(ps.pack_offsets[p + 1])
        lens, roles = [int(x) for x in ps.seg_lens[a:b]], [int(x) for x in ps.seg_role[a:b]]
        docs.append(sum(r != ROLE_PROMPT for r in roles))
        total, prompt = 0, 0
        for ln, role in zip(lens, roles, strict=True):
            if role == ROLE_PROMPT:
                prompt = ln
                total += ln * ln
            elif role in (4, 5):  # a completion: its own sequence prompt + completion, less the prompt held once
                total += (prompt + ln) ** 2 - prompt**2
            else:
                total += ln * ln
        squares.append(total)
    return np.asarray(docs), np.asarray(squares)


def test_pack_stats_count_documents_not_prompt_segments(stores):
    docs, _ = _by_hand(stores[True])
    code, out, err = cli("stats", str(stores[True]), "--json")
    assert code == 0, err
    s = json.loads(out)
    assert s["docs_per_pack_max"] == docs.max() and s["docs_per_pack_mean"] == pytest.approx(docs.mean())
    assert s["n_segments"] > docs.sum()  # the segments still count the prompts
    code, out, err = cli("stats", str(stores[True]), "--world-size", "2", "--hidden-size", "64", "--json")
    assert code == 0 and json.loads(out)["step_efficiency"]["world_size"] == 2, err


def test_balance_prices_a_shared_completion_with_its_prompt(stores, monkeypatch):
    from packtool.core.cost import CostModel
    from packtool.loader import PackedDataset, PackedSampler
    from packtool.loader import sampler as sampler_module

    ds = PackedDataset(stores[True], size=SIZE)
    sampler = PackedSampler(ds, balance=CostModel(0.0, 1.0), num_replicas=1, rank=0)
    _, squares = _by_hand(stores[True])
    assert np.array_equal(sampler.costs, squares.astype(np.float64))
    plain = PackedSampler(PackedDataset(stores[False], size=SIZE), balance=CostModel(1.0, 0.0), num_replicas=1, rank=0)
    assert plain.costs is not None and plain.costs.sum() > 0  # a pairs-layout store: whole sequences, as before
    monkeypatch.setattr(sampler_module, "LAZY_ABOVE", 0)  # the lazy order prices packs window by window
    lazy = PackedSampler(ds, balance=CostModel(0.0, 1.0), num_replicas=1, rank=0)
    assert lazy.lazy and np.array_equal(lazy._pack_costs(np.arange(len(ds))), squares.astype(np.float64))


def test_token_stats_dynamic_row_batches_pairs_as_the_sampler_does(tmp_path):
    rng = np.random.default_rng(0)
    n, size = 40, 64  # every chosen sequence N tokens, every rejected one 1: a pair always pads a row to N
    pairs = [(np.zeros(0, np.int64), rng.integers(2, 600, size), rng.integers(2, 600, 1)) for _ in range(n)]
    tok = write_pref_store(tmp_path / "tok", pairs)
    code, out, err = cli("stats", str(tok), "--size", str(size), "--json")
    assert code == 0, err
    s = json.loads(out)
    want = 1 - (size + 1) / (2 * size)  # two rows of N per pair, N + 1 real tokens
    assert s["waste"]["dynamic (padded)"] == pytest.approx(want)
    assert "keeps each pair whole" in s["notes"]["pairs"]  # the other rows count sequences as documents: said so
    sampler = DynamicBatchSampler(DocumentDataset(tok), 8 * size, padded=True)
    assert int(sampler.costs().sum()) == 2 * size * n


# -- packtool run ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pack", "to", "refused"),
    [
        ("", "megatron-bridge", True),
        ("  share_prompt: true\n", "trl", False),
        ("", "trl", False),
    ],
)
def test_run_refuses_a_preference_export_before_the_first_step(tmp_path, bpe_tokenizer_dir, pack, to, refused):
    (tmp_path / "pairs.jsonl").write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        f"tokenize:\n  inputs: pairs.jsonl\n  tokenizer: {bpe_tokenizer_dir}\n  format: preference\n"
        f"  output: out/tokens\npack:\n  size: 64\n  output: out\n{pack}export:\n  to: {to}\n  output: out/x\n"
    )
    if refused:
        line = cli_error("run", str(cfg), "--quiet")
        assert "the pack output of step 'run' is a preference pack store" in line and f"--to {to}" in line
        assert not (tmp_path / "out").exists()  # nothing ran
    else:
        from packtool.cli.runconfig import load_run_config

        assert load_run_config(cfg)[0].export["to"] == "trl"
