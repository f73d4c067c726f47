"""Blends, sampler states and weights as a hostile user meets them (issue 38, defects 3, 6-13, and a pass of our own):
a store re-packed under an open blend, sampler states and epochs out of range, keys that are no integers, and
weights written `1,5`, `1_0`, `1e-9` or `1e6` through `BlendedDataset`, `packtool stats`, `packtool pack` and
`packtool run`. Every case failed (silently, or with the wrong message or exit code) before its fix."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from support import cli, cli_error, make_store, write_pack_store, zipf_docs

from packtool.errors import ConfigError, FormatError, UsageError
from packtool.formats.pack_store import metadata_for, write_metadata_line
from packtool.loader import BlendedDataset, PackedDataset, PackedSampler, ResumableLoader

SIZE = 64
TOKENIZER = {"name": "org/tiny-tok", "sha256": "a" * 64}


def pack_store(directory: Path, n_docs: int, seed: int, shift: int = 0) -> Path:
    """A pack store of `n_docs` documents; `shift` changes every token (same lengths: same packs, another build)."""
    docs = [(d + shift) % 600 for d in zipf_docs(n_docs, seed=seed, max_len=SIZE - 4)]
    write_pack_store(directory, docs, SIZE)
    meta = metadata_for(directory, "training", SIZE)
    meta["tokenizer"] = TOKENIZER
    write_metadata_line(directory, meta)
    return directory


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("hostile_blend")
    return [pack_store(root / f"s{i}", n, seed=i) for i, n in enumerate((20, 35))]


# ---- defect 3: a store re-packed under an open blend -------------------------------------------------------


@pytest.mark.parametrize("state", ["never opened", "closed by the LRU", "open"])
def test_a_store_repacked_with_as_many_packs_under_an_open_blend_is_refused(tmp_path: Path, state: str) -> None:
    """The blend served the new build's packs under the old builds, order and fingerprint (a checkpoint taken then
    did not resume). A change of pack count was caught; a change of build is caught now, whether the store was
    never opened or its maps were closed by the LRU and are opened again. Maps still open read the old build,
    the one the blend was opened with: right, and kept."""
    a, b = pack_store(tmp_path / "a", 20, seed=0), pack_store(tmp_path / "b", 20, seed=1)
    ds = BlendedDataset([a, b], max_open=1)
    src, packs = ds.index(0, len(ds))
    key_a, key_b = int(np.flatnonzero(src == 0)[0]), int(np.flatnonzero(src == 1)[0])
    old = PackedDataset(a)[int(packs[key_a])]["input_ids"].clone()
    if state != "never opened":
        assert torch.equal(ds[key_a]["input_ids"], old)
    if state == "closed by the LRU":
        ds[key_b]  # opens b: a's maps are closed (max_open=1), its layout kept for a re-open
    n_packs, build = int(ds.n_packs[0]), ds.builds[0]
    pack_store(a, 20, seed=0, shift=1)  # the same lengths: as many packs, another build
    assert metadata_for(a, "training", SIZE)["n_packs"] == n_packs
    assert metadata_for(a, "training", SIZE)["build"] != build
    if state == "open":
        assert torch.equal(ds[key_a]["input_ids"], old)
        return
    with pytest.raises(FormatError, match=r"re-packed since the blend opened .* re-open the blend"):
        ds[key_a]
    fresh = BlendedDataset([a, b], max_open=1)  # re-opened: the new build, and a new fingerprint
    assert fresh.fingerprint != ds.fingerprint and not torch.equal(fresh[key_a]["input_ids"], old)


def test_pack_seed_7_under_an_open_blend_through_the_cli(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """The issue's case as a user meets it: a blend opened, a sampler state taken, `pack --seed 7` re-packs a
    store into as many packs; reading it is refused by name, and the state does not resume on the re-opened blend."""
    from support import write_jsonl, zipf_texts

    for name, seed in (("a", 0), ("b", 1)):
        write_jsonl(tmp_path / f"{name}.jsonl", [{"text": x} for x in zipf_texts(60, seed=seed, max_words=80)])
        tokenize = ("tokenize", str(tmp_path / f"{name}.jsonl"), "--tokenizer", str(bpe_tokenizer_dir))
        assert cli(*tokenize, "--output", str(tmp_path / f"t{name}"), "-q")[0] == 0
        assert (
            cli("pack", str(tmp_path / f"t{name}"), "--size", "256", "--output", str(tmp_path / f"p{name}"), "-q")[0]
            == 0
        )
    ds = BlendedDataset([tmp_path / "pa", tmp_path / "pb"])
    sampler = PackedSampler(ds, num_replicas=2, rank=0)
    sampler.advance(1)
    state = sampler.state_dict()
    assert (
        cli("pack", str(tmp_path / "ta"), "--size", "256", "--output", str(tmp_path / "pa"), "--seed", "7", "-q")[0]
        == 0
    )
    again = BlendedDataset([tmp_path / "pa", tmp_path / "pb"])
    assert again.n_packs.tolist() == ds.n_packs.tolist() and again.builds[0] != ds.builds[0]
    with pytest.raises(FormatError, match="re-packed since the blend opened"):
        ds.__getitems__(np.flatnonzero(ds.index(0, len(ds))[0] == 0)[:2])
    with pytest.raises(ConfigError, match="sampler state is of blend"):
        PackedSampler(again, num_replicas=2, rank=0).load_state_dict(state)


# ---- defects 6, 7: sampler states and epochs out of range, keys that are no integers ----------------------


def test_a_sampler_state_past_its_epoch_is_refused_at_load(stores: list[Path]) -> None:
    """`consumed` past the epoch made len() raise `ValueError: __len__() should return >= 0`; `base` past it (or
    consumed * num_replicas far past it) gave an epoch silently empty. Both are refused when the state loads."""
    for data in (BlendedDataset([stores[0], f"{stores[1]}:0.5"], seed=1), PackedDataset(stores[1])):
        n = len(data)
        sampler = PackedSampler(data, num_replicas=2, rank=0)
        sampler.advance(3)
        state = sampler.state_dict()
        bad = [
            (dict(state, consumed=10**6), "consumed=1000000, past the"),
            (dict(state, consumed=-(-n // 2) + 1), "past the"),
            (dict(state, base=10**6), "base=1000000, past the"),
            (dict(state, base=n + 1, consumed=0), "past the"),
            (dict(state, num_replicas=10**6), "consumed=3, past the 1 indices each of its 1000000 ranks"),
            (dict(state, global_sample="6"), "global_sample='6'"),
        ]
        for broken, message in bad:
            fresh = PackedSampler(data, num_replicas=2, rank=0)
            with pytest.raises(ConfigError, match=message):
                fresh.load_state_dict(broken)
        for world in (1, 2, 3):  # the state itself loads, at any world size, and continues where it was
            fresh = PackedSampler(data, num_replicas=world, rank=0)
            fresh.load_state_dict(state)
            assert len(fresh) >= 0 and fresh.global_sample == 6


def test_a_finished_padded_epoch_moves_and_reloads(stores: list[Path]) -> None:
    """A whole epoch consumed at 3 ranks over 20 packs (21 indices, one of padding), moved to 2 ranks: the epoch is
    over, and the moved state (its base clamped to the epoch) loads again, then the next epoch starts whole."""
    data = PackedDataset(stores[0])
    n = len(data)
    assert n % 3, "the epoch of 3 ranks ends in padding"
    three = PackedSampler(data, num_replicas=3, rank=0)
    three.advance(len(three))
    two = PackedSampler(data, num_replicas=2, rank=1)
    two.load_state_dict(three.state_dict())
    assert len(two) == 0 and two.exhausted and two.state_dict()["base"] == n
    again = PackedSampler(data, num_replicas=2, rank=1)
    again.load_state_dict(two.state_dict())
    assert again.exhausted
    again.set_epoch(1)
    assert len(again) == -(-n // 2)


def test_epochs_and_counts_that_are_no_integers_are_refused(stores: list[Path]) -> None:
    """`set_epoch(-1)` yielded negative keys (read back as epoch 0), `set_epoch(1.5)` was epoch 1, `advance(-5)`
    moved the resume point back; a blend epoch whose keys pass int64 wrapped."""
    blend = BlendedDataset([stores[0], f"{stores[1]}:0.5"], seed=1)
    for data in (blend, PackedDataset(stores[0])):
        sampler = PackedSampler(data, num_replicas=2, rank=0)
        for epoch in (-1, 1.5, True, "1", None):
            with pytest.raises(ConfigError, match=r"epoch .* is not an integer >= 0, PackedSampler.set_epoch"):
                sampler.set_epoch(epoch)  # type: ignore[arg-type]
        assert sampler.epoch == 0
        sampler.set_epoch(np.int64(2))
        assert sampler.epoch == 2 and min(sampler) >= 0
        for count in (-5, 1.5, True):
            with pytest.raises(ConfigError, match="is not a count >= 0"):
                sampler.advance(count)  # type: ignore[arg-type]
        state = dict(sampler.state_dict(), epoch=-1)
        with pytest.raises(ConfigError, match="not an integer >= 0"):
            PackedSampler(data, num_replicas=2, rank=0).load_state_dict(state)
    huge = 2**63 // len(blend)
    sampler = PackedSampler(blend, num_replicas=2, rank=0)
    with pytest.raises(ConfigError, match=r"has keys past 2\*\*63 - 1"):
        sampler.set_epoch(huge)
    with pytest.raises(ConfigError, match=r"has keys past 2\*\*63 - 1"):
        sampler.load_state_dict(dict(sampler.state_dict(), epoch=huge))
    sampler.set_epoch(huge - 1)  # the last epoch whose keys fit
    assert max(sampler) < 2**63


def test_blend_keys_that_are_no_integers_are_refused(stores: list[Path]) -> None:
    """`ds[1.5]` read `ds[1]` (and `ds[True]`, `ds["1"]` too); `__getitems__([0.5])`, `locate([0.5])` read key 0."""
    ds = BlendedDataset([stores[0], f"{stores[1]}:0.5"], seed=1)
    for key in (1.5, True, "1", np.float64(1.0)):
        with pytest.raises(ConfigError, match="is not an integer"):
            ds[key]  # type: ignore[index]
    for keys in ([0.5], [True, False], np.array([1.0])):
        with pytest.raises(ConfigError, match="blend keys must be integers"):
            ds.__getitems__(keys)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="blend keys must be integers"):
            ds.locate(keys)  # type: ignore[arg-type]
    assert ds[np.int64(1)]["source_index"] == ds[1]["source_index"] == ds.locate([1])[1][0]
    assert ds[-1]["source_index"] == ds[len(ds) - 1]["source_index"]  # -1: the last sample of epoch 0, as documented
    with pytest.raises(IndexError, match=f"blend key {-len(ds) - 1} is outside"):
        ds[-len(ds) - 1]


def test_a_resumable_loader_state_round_trips_through_the_checks(stores: list[Path]) -> None:
    """The checks refuse nothing a real run writes: every state of a plain and an elastic run loads."""
    ds = BlendedDataset([stores[0], f"{stores[1]}:1.5"], seed=3)
    sampler = PackedSampler(ds, num_replicas=3, rank=2)
    loader = ResumableLoader(torch.utils.data.DataLoader(ds, batch_size=2, sampler=sampler, collate_fn=lambda b: b))
    for epoch in range(2):
        for _ in loader:
            state = loader.state_dict()
            for world in (1, 3, 5):
                PackedSampler(ds, num_replicas=world, rank=0).load_state_dict(state)
        assert loader.epoch == epoch


# ---- defects 8-12: weights and sizes ------------------------------------------------------------------------


def test_a_blend_size_that_is_no_pack_size_is_refused_as_such(stores: list[Path]) -> None:
    """`size=0` said `pack every store with --size 0`."""
    for size in (0, -1, 64.0, True, "64"):
        with pytest.raises(ConfigError, match="blend size must be a positive integer") as info:
            BlendedDataset([stores[0]], size=size)  # type: ignore[arg-type]
        assert "--size 0" not in str(info.value) and "--size -1" not in str(info.value)
    with pytest.raises(ConfigError, match=r"holds sizes 64, not 128, BlendedDataset, pass one of those as size="):
        BlendedDataset([stores[0]], size=128)


@pytest.mark.parametrize("weight", ["1,5", "1_0", "0x10", " 2", "2 ", "١", "1e", "", "two"])
def test_a_weight_python_reads_but_the_command_line_does_not_is_refused_alike(stores: list[Path], weight: str) -> None:
    """`stats packA:1,5 packB` said `blend store packA:1,5 does not exist` (exit 1) where `pack` says the weight is
    not a number (exit 2); `STORE:1_0` was weight 10, `STORE: 2` and `STORE:١` (Arabic-Indic one) read by float()."""
    a, b = stores
    with pytest.raises(UsageError, match=re.escape(f"blend weight {weight!r} of {a} is not a number")):
        BlendedDataset([f"{a}:{weight}", str(b)])
    for args in ([f"{a}:{weight}", str(b)], [f"{a}:{weight}"]):
        line = cli_error("stats", *args, code=2)
        assert f"weight {weight!r} of {a} is not a number" in line and "does not exist" not in line, line
    line = cli_error("pack", f"{a}:{weight}", str(b), "--size", "64", "--output", str(a.parent / "o"), code=2)
    assert f"mixture weight {weight!r} of {a} is not a number" in line, line


def test_weights_the_command_line_reads_read_alike_everywhere(stores: list[Path]) -> None:
    a, b = stores
    for text, value in (("2", 2.0), ("+2", 2.0), ("2.", 2.0), (".5", 0.5), ("5e-1", 0.5), ("1E0", 1.0)):
        assert BlendedDataset([f"{a}:{text}", str(b)]).weights[0] == value
    assert BlendedDataset([(a, "1.5"), (b, np.float32(0.7))]).weights == [1.5, 0.7]  # float32 0.7 as written
    assert BlendedDataset([(a, np.int64(2))]).weights == [2.0]
    for weight in (None, [1], "x"):
        with pytest.raises(UsageError, match="is not a number"):
            BlendedDataset([(a, weight)])


def test_a_weight_that_gives_a_store_no_sample_says_what_it_rounds_to(stores: list[Path], tmp_path: Path) -> None:
    """`STORE:1e-9` gave the store 0 samples silently while weight 0 is refused."""
    a, b = stores  # 20 documents in 3 or so packs, 35 in more
    n = int(BlendedDataset([a]).n_packs[0])
    least = 1 / (2 * n)
    with pytest.raises(UsageError, match=rf"blend weight 1e-09 of {a} gives it 0 of its {n} packs .* rounds to 0\), raise it to at least") as info:  # fmt: skip
        BlendedDataset([f"{a}:1e-9", str(b)])
    shown = float(str(info.value).split("at least ")[1].split(" ")[0])
    assert shown >= least and BlendedDataset([f"{a}:{shown!r}", str(b)]).counts[0] == 1  # the least weight works
    line = cli_error("stats", f"{a}:1e-9", str(b), code=2)
    assert "gives it 0 of its" in line and "rounds to 0" in line
    token = make_store(tmp_path / "tok", np.full(10, 5))
    line = cli_error("pack", f"{token}:0.01", "--size", "64", "--output", str(tmp_path / "o"), code=2)
    assert f"mixture weight 0.01 of {token} gives it 0 of its 10 documents" in line, line
    assert not (tmp_path / "o").exists()
    assert cli("pack", f"{token}:0.05", "--size", "64", "--output", str(tmp_path / "o"), "-q")[0] == 0  # 0.5 doc: 1


# ---- defects 9, 13: the run config ---------------------------------------------------------------------------


def test_a_run_config_weight_written_1e6_reads_as_the_command_line_reads_it(stores: list[Path], tmp_path: Path) -> None:
    """YAML 1.1 reads `1e6` (no dot) as text: `weight: 1e6` said `'1e6' is not a number`."""
    a, b = stores
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"stats:\n  blend:\n    - {{path: '{a}', weight: 2e0}}\n    - '{b}:1e0'\n  json: true\n")
    code, out, err = cli("run", str(cfg), "-q")
    assert code == 0, err
    assert '"weight": 2.0' in out
    token = make_store(tmp_path / "tok", np.full(10, 5))
    for tokens_dir in (f"[{{path: '{token}', weight: 2e0}}]", f"['{token}']\n  weights: [2e0]"):
        cfg.write_text(f"pack:\n  tokens_dir: {tokens_dir}\n  size: 64\n  output: out\n")
        from packtool.cli.runconfig import load_run_config

        assert load_run_config(cfg)[0].pack.weights == (2.0,)  # type: ignore[union-attr]
    cfg.write_text(f"pack:\n  tokens_dir: [{{path: '{token}', weight: '1,5'}}]\n  size: 64\n  output: out\n")
    assert "weight '1,5'" in cli_error("run", str(cfg), code=2)


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("pack:\n  size: 64\n  output: out\n  sise: 3\n", "unknown key 'sise'"),
        ("pack:\n  size: sixty\n  output: out\n", "expected an integer"),
        ("pack:\n  size: 64\n  output: [out]\n", "expected a string"),
        ("tokenze:\n  inputs: [a.jsonl]\n", "unknown section"),
        ("pack: [64]\n", "must be a mapping of flags"),
        ("pack:\n  size: 64\n  output: out\n  tokens_dir: 3\n", "expected a token store"),
        ("pack: {size: 64\n", "invalid YAML"),
        ("steps: []\n", "`steps` must be a non-empty list"),
    ],
)
def test_every_run_config_error_is_a_usage_error_exit_2(tmp_path: Path, text: str, expect: str) -> None:
    """SPEC: a bad flag or config value is exit 2. An unknown key or a wrong type exited 1, a range error 2."""
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    assert expect in cli_error("run", str(cfg), code=2)


def test_a_missing_config_file_is_exit_1_as_a_missing_input_is(tmp_path: Path) -> None:
    assert "does not exist" in cli_error("run", str(tmp_path / "nope.yaml"), code=1)
    assert "is a directory" in cli_error("run", str(tmp_path), code=1)


# ---- our own hostile pass: arguments that were truncated, taken as truthy, or raised a raw Python error -------


def test_sampler_arguments_are_integers_and_booleans_or_refused(stores: list[Path]) -> None:
    """`seed=1.5` was seed 1, `num_replicas=2.5` two ranks, `rank=True` rank 1, `shuffle="no"` and
    `drop_last="False"` truthy, `PackedSampler(5.5)` a TypeError, `PackedSampler(-3)` an empty sampler."""
    data = PackedDataset(stores[0])
    for kw, message in (
        ({"seed": 1.5}, "seed must be an integer >= 0"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"seed": "3"}, "seed must be an integer >= 0"),
        ({"num_replicas": 2.5, "rank": 0}, "num_replicas must be an integer >= 1"),
        ({"num_replicas": True, "rank": 0}, "num_replicas must be an integer >= 1"),
        ({"num_replicas": 2, "rank": 1.5}, "rank must be an integer >= 0"),
        ({"num_replicas": 2, "rank": True}, "rank must be an integer >= 0"),
        ({"shuffle": "no"}, "shuffle must be True or False"),
        ({"drop_last": "False"}, "drop_last must be True or False"),
    ):
        with pytest.raises(ConfigError, match=message):
            PackedSampler(data, **kw)  # type: ignore[arg-type]
    for bad, message in ((5.5, "is no dataset"), (True, "is no dataset"), (-3, "has no packs"), (0, "has no packs")):
        with pytest.raises(ConfigError, match=message):
            PackedSampler(bad)  # type: ignore[arg-type]
    same = PackedSampler(data, num_replicas=np.int64(2), rank=np.int64(1), seed=np.int64(4), shuffle=np.bool_(True))
    assert list(same) == list(PackedSampler(data, num_replicas=2, rank=1, seed=4))
    with pytest.raises(ConfigError, match="sampler state is a NoneType, not a mapping"):
        same.load_state_dict(None)  # type: ignore[arg-type]


def test_blend_arguments_that_were_truncated_or_lost_are_refused(stores: list[Path]) -> None:
    """`prefix_counts(1.5)` was prefix 1 and `epoch=-1` a draw of its own; `packs_of` past a store's count gave a
    pack the blend never draws; `max_open=0` or `1.5` became 1; `{store: 2}` blended the store at weight 1; a
    generator raised TypeError; `Interleave([1.5, 2])` counted 1 and 2."""
    from packtool.core.blend import Interleave

    ds = BlendedDataset([stores[0], f"{stores[1]}:0.5"], seed=1)
    for args, message in (((1.5,), "prefix 1.5 is not an integer"), ((True,), "prefix True"),
                          ((3, -1), "epoch -1 is not an integer"), ((3, 1.5), "epoch 1.5")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            ds.prefix_counts(*args)  # type: ignore[arg-type]
    assert ds.prefix_counts(np.int64(3), np.int64(1)).sum() == 3
    with pytest.raises(ConfigError, match=r"occurrences of store 1 must be integers in 0\.\."):
        ds.packs_of(1, np.array([int(ds.counts[1])]))
    with pytest.raises(ConfigError, match="store 2 is not in 0..1"):
        ds.packs_of(2, np.array([0]))
    assert ds.packs_of(1, np.arange(int(ds.counts[1]))).size == int(ds.counts[1])
    for max_open in (0, -5, 1.5, "2", True):
        with pytest.raises(ConfigError, match="max_open must be an integer >= 1"):
            BlendedDataset([stores[0]], max_open=max_open)  # type: ignore[arg-type]
    for sources in ({str(stores[0]): 2}, (s for s in [str(stores[0])])):
        with pytest.raises(ConfigError, match="blend sources must be a list"):
            BlendedDataset(sources)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="blend split must be a split name"):
        BlendedDataset([stores[0]], split=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="interleave counts must be integers"):
        Interleave(np.array([1.5, 2]))


def test_order_and_indices_of_an_epoch_that_is_no_integer_are_refused(stores: list[Path]) -> None:
    """`order(1.5)` and `indices(1.5)` were epoch 1's; `indices(-1)` of a blend gave negative keys. A state whose
    interrupted layout claims absurdly many ranks is refused before its window is rebuilt (O(ranks) memory)."""
    blend = BlendedDataset([stores[0], f"{stores[1]}:0.5"], seed=1)
    for data in (blend, PackedDataset(stores[0])):
        sampler = PackedSampler(data, num_replicas=2, rank=1)
        for epoch in (1.5, -1, True):
            for call in (sampler.order, sampler.indices):
                with pytest.raises(ConfigError, match="is not an integer >= 0"):
                    call(epoch)  # type: ignore[arg-type]
        assert sampler.indices(1).tolist() == sampler.order(1)[1::2].tolist()
    balanced = PackedSampler(PackedDataset(stores[1]), num_replicas=2, rank=0, balance=(1.0, 0.0), window=2)
    balanced.advance(1)
    moved = PackedSampler(PackedDataset(stores[1]), num_replicas=3, rank=0, balance=(1.0, 0.0), window=2)
    moved.load_state_dict(balanced.state_dict())
    state = moved.state_dict()
    assert state["head"] is not None
    for world in (10**9, 0):
        with pytest.raises(ConfigError, match="malformed head"):
            PackedSampler(
                PackedDataset(stores[1]), num_replicas=3, rank=0, balance=(1.0, 0.0), window=2
            ).load_state_dict(dict(state, head=dict(state["head"], num_replicas=world)))
