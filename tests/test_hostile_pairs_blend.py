"""A hostile pass over the preference (DPO) and load-time blend surfaces, through the CLI and the public API.

Each defect found has a test here that failed on the code before its fix (marked FIXED below); the rest pin
behaviour the campaign found already right (one-line errors, exit codes, no silent wrong answers).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from input_support import same_store_bytes, tokenize_ok
from preference_support import write_pref_store
from support import cli, cli_error, write_jsonl, write_pack_store, zipf_docs

from packtool.errors import ConfigError, FormatError
from packtool.formats.pack_store import metadata_for, write_metadata_line
from packtool.formats.token_store import open_token_store
from packtool.loader import HF_KEYS, BlendedDataset, PackedCollator, PackedDataset, PackedSampler
from packtool.loss import count_targets, packed_cross_entropy, pair_logps

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402,F401
from tests.pair_support import batch, make_pairs  # noqa: E402

VOCAB = 96
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
SIZE = 64
TOKENIZER = {"name": "org/tiny-tok", "sha256": "a" * 64}


def tiny(attn: str) -> Any:
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**SMALL, num_hidden_layers=2), attn_implementation=attn
    )
    return model.to(torch.float64).eval()


def alone_nll(model: Any, pairs: list[tuple[list[int], list[int], list[int]]]) -> tuple[float, int, list[float]]:
    """Summed NLL of every completion token with each sequence run alone, its count, and each sequence's mean."""
    total, count, means = 0.0, 0, []
    for p, c, r in pairs:
        for comp in (c, r):
            seq = torch.tensor([p + comp])
            logits = model(input_ids=seq).logits[0]
            nll = torch.nn.functional.cross_entropy(logits[len(p) - 1 : -1], seq[0, len(p) :], reduction="sum")
            total, count = total + float(nll), count + len(comp)
            if comp:
                means.append(float(nll) / len(comp))
    return total, count, means


def no_labels(b: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in b.items() if k != "labels"}


# --- loss on a shared-prompt batch ---------------------------------------------------------------------------------


def test_packed_cross_entropy_of_a_shared_prompt_batch_equals_each_sequence_alone() -> None:
    """FIXED: packed_cross_entropy(logits, labels, cu_seqlens) on a `--share-prompt` batch silently left out each
    completion's first token (4.5887 instead of 4.5941 here). `prefix_segment=` scores it from its prompt's last
    logit; what cannot be exact with it (reduction none, shifted labels) is refused by name."""
    pairs = make_pairs(1, 3, VOCAB)
    ref = tiny("eager")
    want_sum, want_count, want_means = alone_nll(ref, pairs)
    model = tiny("packtool")
    b = batch(pairs, shared=True)
    logits = model(**no_labels(b)).logits
    cu, pre = b["cu_seq_lens_q"], b["prefix_segment"]
    got = packed_cross_entropy(logits, b["labels"], cu, prefix_segment=pre)
    assert math.isclose(float(got), want_sum / want_count, rel_tol=1e-9)
    assert math.isclose(float(packed_cross_entropy(logits, b["labels"], cu, "sum", prefix_segment=pre)), want_sum,
                        rel_tol=1e-9)  # fmt: skip
    seq = packed_cross_entropy(logits, b["labels"], cu, "sequence", prefix_segment=pre.numpy())
    assert math.isclose(float(seq), sum(want_means) / len(want_means), rel_tol=1e-9)
    assert count_targets(b["labels"], cu, prefix_segment=pre) == (want_count, len(want_means))
    # without prefix_segment the first completion tokens are not scored (what the docstring warns of)
    assert count_targets(b["labels"], cu)[0] == want_count - 2 * len(pairs)
    with pytest.raises(ConfigError, match="reduction 'none' with a shared-prompt prefix_segment"):
        packed_cross_entropy(logits, b["labels"], cu, "none", prefix_segment=pre)
    with pytest.raises(ConfigError, match="shifted=True with a shared-prompt prefix_segment"):
        packed_cross_entropy(logits, b["labels"], cu, shifted=True, prefix_segment=pre)
    # the pairs layout (prefix_segment all -1) is a plain row: same numbers with or without it
    p = batch(pairs, shared=False)
    plain_logits = model(**no_labels(p)).logits
    minus = torch.full((p["pair_ids"].numel(),), -1)
    a = packed_cross_entropy(plain_logits, p["labels"], p["cu_seq_lens_q"])
    assert float(a) == float(packed_cross_entropy(plain_logits, p["labels"], p["cu_seq_lens_q"], prefix_segment=minus))
    assert math.isclose(float(a), want_sum / want_count, rel_tol=1e-9)


def test_model_loss_with_labels_on_a_shared_batch_is_right_or_refused() -> None:
    """FIXED: model(**batch) with labels on a shared-prompt batch returned transformers' shift-by-one loss, which
    scores each rejected completion's first token from the chosen's last logit (4.5907 instead of 4.5941), and under
    eager/sdpa a loss over logits where the rejected completion never saw its prompt. Now: exact under "packtool",
    refused under another attention."""
    pairs = make_pairs(1, 3, VOCAB)
    want_sum, want_count, _ = alone_nll(tiny("eager"), pairs)
    loss = tiny("packtool")(**batch(pairs, shared=True)).loss
    assert math.isclose(float(loss), want_sum / want_count, rel_tol=1e-6)  # transformers scores in float32
    plain = tiny("packtool")(**batch(pairs, shared=False)).loss  # the pairs layout: transformers' own loss
    assert math.isclose(float(plain), want_sum / want_count, rel_tol=1e-6)
    for attn in ("eager", "sdpa"):
        with pytest.raises(ConfigError, match="no attn_implementation='packtool'"):
            tiny(attn)(**batch(pairs, shared=True))
        logits = tiny(attn)(**no_labels(batch(pairs, shared=True))).logits
        with pytest.raises(ConfigError, match="attn_implementation='packtool'"):
            pair_logps(logits, batch(pairs, shared=True))  # a fresh batch: no packtool layer saw its prefix


def test_pair_logps_refuses_half_pairs_and_wrong_logits() -> None:
    """Already right: one side of a pair missing, logits of the wrong shape, kept=True with a wrong row count."""
    pairs = make_pairs(4, 2, VOCAB)
    b = batch(pairs, shared=False)
    logits = torch.zeros(b["labels"].numel(), VOCAB)
    with pytest.raises(FormatError, match="exactly one chosen and one rejected"):
        pair_logps(logits, dict(b, chosen=torch.tensor([True, True, True, False, False])))
    for bad in (logits[:-1], logits.reshape(-1), torch.zeros(2, b["labels"].numel(), VOCAB)):
        with pytest.raises(ConfigError, match="do not hold one row per token"):
            pair_logps(bad, b)
    with pytest.raises(ConfigError, match="do not hold one row per target"):
        pair_logps(logits, b, kept=True)


# --- preference tokenize -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trl_preference_reference import build_tokenizers

    return build_tokenizers(tmp_path_factory.mktemp("hostile_tok"), ["qwen2_5"])["qwen2_5"]


GOOD = {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}
CONV = {"prompt": [{"role": "user", "content": "USR hi"}], "chosen": [{"role": "assistant", "content": "Hello."}],
        "rejected": [{"role": "assistant", "content": "Go."}]}  # fmt: skip
SHAREGPT_RANKING = {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "gpt", "value": "x"},
                    "rejected": {"from": "gpt", "value": "y"}}  # fmt: skip


def test_a_ranking_record_read_as_a_conversation_is_refused(tmp_path: Path, qwen: Path) -> None:
    """FIXED: `--format sharegpt` on LLaMA-Factory ranking records tokenized the prompt turn alone (0 targets, exit
    0): both answers silently gone. Now a bad record naming --format preference; a conversation that holds its
    answer beside chosen/rejected columns (UltraFeedback's `messages`) is still a conversation."""
    src = write_jsonl(tmp_path / "rank.jsonl", [SHAREGPT_RANKING, SHAREGPT_RANKING])
    line = cli_error("tokenize", str(src), "--tokenizer", str(qwen), "--output", str(tmp_path / "o"), "--format",
                     "sharegpt")  # fmt: skip
    assert "a preference pair" in line and "--format preference" in line and "rank.jsonl:1" in line
    assert not (tmp_path / "o").exists()
    chat = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "q"}], **GOOD}])
    line = cli_error("tokenize", str(chat), "--tokenizer", str(qwen), "--output", str(tmp_path / "o"), "--format",
                     "chat")  # fmt: skip
    assert "a preference pair" in line
    uf = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], **GOOD}
    out = tokenize_ok([write_jsonl(tmp_path / "uf.jsonl", [uf])], qwen, tmp_path / "uf", "--format", "chat")
    assert open_token_store(out).n_documents == 1
    pref = tokenize_ok([src], qwen, tmp_path / "pref", "--format", "preference")
    assert open_token_store(pref).preference_pairs == 2
    # other formats on preference records already fail at file:line
    for fmt, why in (("chat", "missing field 'messages'"), ("text", "missing field 'text'"),
                     ("prompt-completion", "missing field 'completion'")):  # fmt: skip
        f = write_jsonl(tmp_path / f"{fmt}.jsonl", [GOOD])
        line = cli_error("tokenize", str(f), "--tokenizer", str(qwen), "--output", str(tmp_path / "o"), "--format",
                         fmt)  # fmt: skip
        assert why in line and f"{fmt}.jsonl:1" in line


def test_hostile_pairs_tokenize_whole_and_alike_across_workers(tmp_path: Path, qwen: Path) -> None:
    """Already right: empty completions, identical answers, a chosen that is a prefix of rejected, whitespace-only
    fields, an empty prompt give both sequences (TRL's ids); non-string content and tools of the wrong type are
    bad records; --on-error skip drops both sequences; workers 1 and 2 write the same bytes."""
    rows = [GOOD, {"prompt": "q", "chosen": "", "rejected": ""}, {"prompt": "q", "chosen": " a", "rejected": " a"},
            {"prompt": "q", "chosen": " a", "rejected": " a b c"}, {"prompt": "  ", "chosen": " ", "rejected": "\n"},
            {"prompt": "", "chosen": " a", "rejected": " b"}]  # fmt: skip
    src = write_jsonl(tmp_path / "p.jsonl", rows * 20)
    one = tokenize_ok([src], qwen, tmp_path / "w1", "--format", "preference", "--workers", "1", "--chunk-bytes", "512")
    two = tokenize_ok([src], qwen, tmp_path / "w2", "--format", "preference", "--workers", "2", "--chunk-bytes", "512")
    same_store_bytes(one, two)
    store = open_token_store(one)
    assert store.preference_pairs == len(rows) * 20 and store.n_documents == 2 * len(rows) * 20
    lens = np.diff(np.concatenate(([0], store.boundaries)))
    assert lens[2] == lens[3] == 2  # "q" + EOS twice: an empty completion keeps its EOS target
    assert store.document(4).tolist() == store.document(5).tolist()  # identical answers stay two sequences
    bad = [({**CONV, "chosen": [{"role": "assistant", "content": None}]}, "content is not a string"),
           ({**CONV, "tools": 5}, "field 'tools' is not a list of tool objects"),
           ({**CONV, "tools": ["x"]}, "field 'tools' is not a list of tool objects"),
           ({"prompt": True, "chosen": " a", "rejected": " b"}, "field 'prompt'")]
    f = write_jsonl(tmp_path / "bad.jsonl", [CONV, *(r for r, _ in bad), CONV])
    out = tokenize_ok([f], qwen, tmp_path / "skip", "--format", "preference", "--on-error", "skip")
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [2, 3, 4, 5]
    assert all(why in r["reason"] for r, (_, why) in zip(rejects, bad, strict=True))
    assert open_token_store(out).n_documents == 4  # both sequences of each bad record are gone
    big = write_jsonl(tmp_path / "big.jsonl", [GOOD, {**GOOD, "prompt": "x " * 5000}])
    line = cli_error("tokenize", str(big), "--tokenizer", str(qwen), "--output", str(tmp_path / "o"), "--format",
                     "preference", "--max-record-bytes", "1000")  # fmt: skip
    assert "over --max-record-bytes 1000" in line and "big.jsonl:2" in line


# --- pack / verify on preference stores ---------------------------------------------------------------------------


def test_a_prompt_longer_than_the_pack_follows_each_overlong_policy(tmp_path: Path) -> None:
    """Already right: split/error refuse naming the pair, drop and truncate drop it (truncation would keep no
    target), in both layouts; verify passes on what was written."""
    rng = np.random.default_rng(0)
    ids = lambda n: rng.integers(2, 600, n)  # noqa: E731
    store = write_pref_store(tmp_path / "st", [(ids(100), ids(5), ids(6)), (ids(5), ids(5), ids(6))])
    for shared in ([], ["--share-prompt"]):
        for policy in ("split", "error"):
            line = cli_error("pack", str(store), "--size", "64", "--output", str(tmp_path / "o"), "--overlong",
                             policy, *shared)  # fmt: skip
            assert "pair 0 needs" in line and "longer than the pack size 64" in line
        for policy in ("drop", "truncate"):
            out = tmp_path / f"{policy}{len(shared)}"
            code, _, err = cli("pack", str(store), "--size", "64", "--output", str(out), "--overlong", policy, "-q",
                               *shared)  # fmt: skip
            assert code == 0, err
            meta = PackedDataset(out, size=64)
            assert meta.preference and len(meta) == 1
            code, out_text, err = cli("verify", str(out), "--source", str(store))
            assert code == 0 and "1 pairs" in out_text, err


def test_pair_flags_that_cannot_hold_a_pair_are_usage_errors(tmp_path: Path) -> None:
    """Already right: --max-docs-per-pack below a pair, --pad-multiple with --share-prompt; verify --source of
    another store names it."""
    rng = np.random.default_rng(1)
    pairs = [(rng.integers(2, 600, 4), rng.integers(2, 600, 3), rng.integers(2, 600, 5)) for _ in range(6)]
    store = write_pref_store(tmp_path / "st", pairs)
    other = write_pref_store(tmp_path / "other", pairs[:3])
    out = tmp_path / "o"
    assert "cannot hold one pair" in cli_error("pack", str(store), "--size", "64", "--output", str(out),
                                               "--max-docs-per-pack", "2", "--share-prompt", code=2)  # fmt: skip
    assert "--pad-multiple 8 with --share-prompt" in cli_error(
        "pack", str(store), "--size", "64", "--output", str(out), "--pad-multiple", "8", "--share-prompt", code=2
    )
    code, _, err = cli("pack", str(store), "--size", "64", "--output", str(out), "-q", "--share-prompt")
    assert code == 0, err
    assert "made from another token store" in cli_error("verify", str(out), "--source", str(other))
    with pytest.raises(ConfigError, match="is a preference pack store"):
        BlendedDataset([out])


# --- blend ---------------------------------------------------------------------------------------------------------


def make_store(directory: Path, n_docs: int, seed: int, size: int = SIZE) -> Path:
    write_pack_store(directory, zipf_docs(n_docs, seed=seed, max_len=size - 4), size)
    meta = metadata_for(directory, "training", size)
    meta["tokenizer"] = TOKENIZER
    write_metadata_line(directory, meta)
    return directory


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("hostile_blend")
    return [make_store(root / "a", 20, seed=0), make_store(root / "b:odd", 50, seed=1)]


def test_a_huge_weight_is_a_one_line_error(stores: list[Path]) -> None:
    """FIXED: a weight of 1e300 crashed BlendedDataset (and `packtool stats STORE:1e300`) with OverflowError
    from numpy's int64; now the blend's size limit, one line."""
    a = stores[0]
    for spec in ([(a, 1e300)], [f"{a}:1e300"], [(a, 1), (stores[1], 1e20)]):
        with pytest.raises(ConfigError, match=r"over the exact limit 2\*\*52") as info:
            BlendedDataset(spec)
        assert "\n" not in str(info.value) and len(str(info.value)) < 300
    line = cli_error("stats", f"{a}:1e300")
    assert "over the exact limit 2**52" in line


def test_odd_store_weight_strings(stores: list[Path]) -> None:
    """Already right: `a:1:2`, `a:`, `:1` are missing stores; a path holding ':' reads whole or with a weight;
    weights 0, negative, NaN, inf are usage errors (exit 2), a missing store exit 1, each one line."""
    a, odd = stores
    assert BlendedDataset([str(odd)]).paths == [str(odd)]
    two = BlendedDataset([f"{odd}:2"])
    assert two.paths == [str(odd)] and len(two) == 2 * int(two.n_packs[0])
    for spec in (f"{a}:1:2", ":1"):
        with pytest.raises(ConfigError, match="does not exist"):
            BlendedDataset([spec])
    with pytest.raises(ConfigError, match="blend weight '' of .* is not a number"):  # as `pack A:` says
        BlendedDataset([f"{a}:"])
    for w in ("0", "-1", "nan", "inf"):
        line = cli_error("stats", f"{a}:{w}", str(odd), code=2)
        assert f"blend weight {w} of" in line
    assert "does not exist" in cli_error("stats", str(a), f"{a}/nope:2")


def test_blend_index_bounds_and_one_store_equals_the_store(stores: list[Path]) -> None:
    """Already right: index refuses a negative range; keys past an epoch are the next epochs; a one-store blend
    of weight 1 is every pack once, items equal to the store's own; the same store twice is two sources."""
    a = stores[0]
    ds = BlendedDataset([(a, 1)])
    plain = PackedDataset(a)
    src, packs = ds.index(0, len(ds))
    assert sorted(packs.tolist()) == list(range(len(plain))) and not src.any()
    for t in range(len(ds)):
        assert np.array_equal(ds[t]["input_ids"], plain[int(packs[t])]["input_ids"])
    with pytest.raises(ConfigError, match="not a non-negative range"):
        ds.index(-1, 2)
    nxt = ds.index(len(ds), 2 * len(ds))
    assert sorted(nxt[1].tolist()) == list(range(len(plain)))
    assert ds.index(2**62, 2**62 + 1)[0].tolist() == [0]
    with pytest.raises(IndexError):
        ds[-len(ds) - 1]
    twice = BlendedDataset([a, a])
    assert len(twice) == 2 * len(ds) and np.bincount(twice.index(0, len(twice))[1]).tolist() == [2] * len(plain)


def test_a_sampler_state_with_bad_fields_is_refused(stores: list[Path]) -> None:
    """FIXED: a state with consumed < 0 resumed silently (yielding more than an epoch), and one without
    num_replicas raised KeyError; both are now one-line ConfigErrors. A state from another blend or from a plain
    dataset was already refused; elastic resume works for the plain and the blend dataset."""
    blend = BlendedDataset([(stores[0], 1), (stores[1], 0.5)], seed=1)
    for data in (blend, PackedDataset(stores[1])):
        full = list(PackedSampler(data, num_replicas=1, rank=0, seed=0))
        four = PackedSampler(data, num_replicas=4, rank=0, seed=0)
        four.advance(2)
        state = four.state_dict()
        got = []
        for r in range(2):
            s = PackedSampler(data, num_replicas=2, rank=r, seed=0)
            s.load_state_dict(state)
            got.append(list(s))
        resumed = [v for pair in zip(*got, strict=False) for v in pair]
        assert resumed[:4] == full[8:12]
        for bad in (dict(state, consumed=-5), dict(state, base=-1), dict(state, num_replicas=0),
                    {k: v for k, v in state.items() if k != "num_replicas"}, dict(state, epoch="1")):  # fmt: skip
            s = PackedSampler(data, num_replicas=2, rank=0, seed=0)
            with pytest.raises(ConfigError, match="sampler state has .* not an integer"):
                s.load_state_dict(bad)
    other = BlendedDataset([(stores[0], 1), (stores[1], 0.6)], seed=1)
    with pytest.raises(ConfigError, match="sampler state is of blend"):
        PackedSampler(other).load_state_dict(PackedSampler(blend).state_dict())
    with pytest.raises(ConfigError, match="but this sampler reads a plain dataset"):
        PackedSampler(PackedDataset(stores[0])).load_state_dict(PackedSampler(blend).state_dict())


@pytest.mark.slow
def test_spawned_dataloader_workers_read_a_shared_prompt_store(tmp_path: Path) -> None:
    """Already right: DataLoader workers (spawn) over a preference store give the batches of the main process."""
    rng = np.random.default_rng(2)
    pairs = [(rng.integers(2, 600, 6), rng.integers(2, 600, 4), rng.integers(2, 600, 3)) for _ in range(12)]
    store = write_pref_store(tmp_path / "st", pairs)
    code, _, err = cli("pack", str(store), "--size", "64", "--output", str(tmp_path / "o"), "-q", "--share-prompt")
    assert code == 0, err
    ds = PackedDataset(tmp_path / "o", size=64)
    want = PackedCollator()([ds[i] for i in range(len(ds))])
    loader = torch.utils.data.DataLoader(ds, batch_size=len(ds), collate_fn=PackedCollator(), num_workers=1,
                                         multiprocessing_context="spawn")  # fmt: skip
    got = next(iter(loader))
    for key in ("input_ids", "pair_ids", "chosen", "prefix_segment", "cu_seqlens"):
        assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(want[key])), key



def test_blend_index_refuses_keys_outside_int64_and_non_integers(stores: list[Path]) -> None:
    """FIXED: index(0, 2, epoch=2**62) and ds[2**63] raised OverflowError, index(0, 3, epoch=-1) an IndexError
    about key -7, and index(0.5, 2) silently read index(0, 2); now one-line ConfigErrors (IndexError for a key)."""
    ds = BlendedDataset([(stores[0], 1)])
    for args, message in (((0, 2, 2**62), "outside the keys 0 .. 2\\*\\*63-1"), ((2**64, 2**64 + 1), "outside the keys"),
                          ((0, 3, -1), "pass an epoch >= 0"), ((0.5, 2), "index start 0.5 is not an integer"),
                          ((0, 2, 1.5), "index epoch 1.5 is not an integer")):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            ds.index(*args)
    with pytest.raises(IndexError, match="outside 0 .. 2\\*\\*63-1"):
        ds[2**63]
    assert ds.index(np.int64(0), np.int64(3), np.int64(1))[1].tolist() == ds.index(len(ds), len(ds) + 3)[1].tolist()
    assert ds.index(2**63 - 2, 2**63 - 1)[0].tolist() == [0]


@pytest.mark.interop
def test_packed_dpo_trainer_refuses_shared_packs_under_another_attention(tmp_path: Path) -> None:
    """FIXED: PackedDPOTrainer on shared-prompt packs with an sdpa (or eager) model trained on a wrong loss
    without a word (0.6419 instead of 0.6479 here: the rejected completion never saw its prompt). Each forward
    now checks that a packtool layer attended with the pack's prefix_segment. Needs TRL: `make interop` runs it in
    the interop venv."""
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import tests.interop.test_trl_dpo as recipe
    from packtool.hf.dpo import PackedDPOTrainer, PreferencePackCollator

    tok = recipe.tokenizer(tmp_path / "tok")
    pairs = make_pairs(0, 4, recipe.VOCAB)
    losses = {}
    for shared in (False, True):
        for attn in ("sdpa", "packtool"):
            policy, ref = recipe.model(0), recipe.model(1)
            policy.set_attn_implementation(attn)
            ref.set_attn_implementation(attn)
            packs = [recipe.item(pairs[:2], shared, 0), recipe.item(pairs[2:], shared, 2)]
            trainer = PackedDPOTrainer(model=policy, ref_model=ref, args=recipe.config(tmp_path / f"{shared}{attn}", 2,
                                       remove_unused_columns=False), train_dataset=datasets.Dataset.from_list(packs),
                                       data_collator=PreferencePackCollator(), processing_class=tok)  # fmt: skip
            inputs = next(iter(trainer.get_train_dataloader()))
            if shared and attn == "sdpa":
                with pytest.raises(ConfigError, match="no attn_implementation='packtool' layer attended"):
                    trainer.compute_loss(trainer.model, inputs)
                continue
            losses[shared, attn] = float(trainer.compute_loss(trainer.model, inputs))
    assert losses[True, "packtool"] == pytest.approx(losses[False, "packtool"], rel=1e-9)
    assert losses[False, "sdpa"] == pytest.approx(losses[False, "packtool"], rel=1e-9)  # pairs: positions suffice
    # FIXED: a batch holding a pair twice (a mixture weight above 1) was refused; each occurrence is a pair
    for shared in (False, True):
        policy, ref = recipe.model(0), recipe.model(1)
        policy.set_attn_implementation("packtool")
        ref.set_attn_implementation("packtool")
        twice = [recipe.item(pairs, shared, 0), recipe.item(pairs, shared, 0)]
        trainer = PackedDPOTrainer(model=policy, ref_model=ref, args=recipe.config(tmp_path / f"twice{shared}", 2,
                                   remove_unused_columns=False), train_dataset=datasets.Dataset.from_list(twice),
                                   data_collator=PreferencePackCollator(), processing_class=tok)  # fmt: skip
        inputs = next(iter(trainer.get_train_dataloader()))
        assert float(trainer.compute_loss(trainer.model, inputs)) == pytest.approx(losses[False, "packtool"], rel=1e-9)


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
def test_a_pair_repeated_by_a_mixture_weight_is_two_pairs(tmp_path: Path, shared: bool) -> None:
    """FIXED: `pack STORE:2` (or any weight above 1) puts a pair twice in one pack or one batch, and pair_logps
    refused every such batch ("do not have exactly one chosen and one rejected"). Each occurrence is now a pair
    of its own (its k-th chosen with its k-th rejected), equal to each sequence alone."""
    rng = np.random.default_rng(3)
    pairs = [(rng.integers(3, VOCAB, 4), rng.integers(3, VOCAB, 3), rng.integers(3, VOCAB, 2)) for _ in range(3)]
    store = write_pref_store(tmp_path / "st", pairs, vocab=VOCAB)
    flags = ["--share-prompt"] if shared else []
    code, _, err = cli("pack", f"{store}:2", "--size", "64", "--output", str(tmp_path / "o"), "-q", *flags)
    assert code == 0, err
    ds = PackedDataset(tmp_path / "o", size=64)
    b = PackedCollator(flatten=True, keys=HF_KEYS)([ds[i] for i in range(len(ds))])
    ids = b["pair_ids"][b["pair_ids"] >= 0]
    assert int((ids == 0).sum()) == (6 if shared else 4)  # pair 0 twice: [P][C][R] or [C][R] each time
    model = tiny("packtool")
    got = pair_logps(model(**no_labels(b)).logits, b)
    assert sorted(got.pair_ids.tolist()) == [0, 0, 1, 1, 2, 2]
    ref = tiny("eager")
    for k, pid in enumerate(got.pair_ids.tolist()):
        p, c, r = (x.tolist() for x in pairs[pid])
        for seq, want_tokens, value in ((c, got.chosen_tokens[k], got.chosen[k]), (r, got.rejected_tokens[k],
                                                                                   got.rejected[k])):  # fmt: skip
            full = torch.tensor([p + seq])
            logp = torch.log_softmax(ref(input_ids=full).logits[0, :-1], -1).gather(1, full[0, 1:, None])[:, 0]
            assert int(want_tokens) == len(seq)
            assert math.isclose(float(value), float(logp[len(p) - 1 :].sum().detach()), rel_tol=1e-6)
