"""PackedDPOTrainer against TRL 1.16's padded DPOTrainer where the first campaign found it off (issue 38).

- Mixture-of-experts models (Mixtral, Qwen3-MoE, gpt-oss) with their router load-balancing loss on: the loss and
  every gradient equal TRL's padded batch (the padding tail left out, a shared prompt counted twice).
- `--pad-multiple` packs: `num_tokens` counts TRL's tokens, not the padding inside segments.
- Reference log-probs saved with the packs (`precompute_ref_log_probs=True`, `save_to_disk`) are used by a
  later run with no ref_model, never recomputed with the policy; `ld_alpha` weighs them as TRL does; columns
  that are not the packs' are refused by name.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")

import tests.interop.test_trl_dpo as recipe  # noqa: E402
from packtool.errors import ConfigError  # noqa: E402
from packtool.hf.dpo import PackedDPOTrainer, PreferencePackCollator, packs_dataset  # noqa: E402
from tests.interop.test_trl_dpo import setup  # noqa: E402,F401  (the module fixture: TRL's padded batch)

RTOL = 1e-6
MOE = {"vocab_size": recipe.VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "head_dim": 8, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
       "max_position_embeddings": 64, "intermediate_size": 24, "num_experts_per_tok": 2}  # fmt: skip


def moe(family: str, seed: int):
    torch.manual_seed(seed)
    if family == "mixtral":
        config = transformers.MixtralConfig(**MOE, num_local_experts=4, router_aux_loss_coef=0.5)
    elif family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**MOE, moe_intermediate_size=16, num_experts=4, router_aux_loss_coef=0.5)
    else:  # gpt-oss keeps its default coefficient (0.9), with sinks on sliding and full layers
        config = transformers.GptOssConfig(**MOE, num_local_experts=4, sliding_window=4,
                                           layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager"
    ).to(torch.float64)


def packed(tmp: Path, tok, policy, ref, packs, n: int = 2, **kw) -> tuple[PackedDPOTrainer, dict]:
    pol = copy.deepcopy(policy)
    pol.set_attn_implementation("packtool")
    ref_p = None
    if ref is not None:
        ref_p = copy.deepcopy(ref)
        ref_p.set_attn_implementation("packtool")
    trainer = PackedDPOTrainer(model=pol, ref_model=ref_p, train_dataset=packs, data_collator=PreferencePackCollator(),
                               args=recipe.config(tmp, n, remove_unused_columns=False, **kw), processing_class=tok)  # fmt: skip
    return trainer, next(iter(trainer.get_train_dataloader()))


def close(got: tuple[float, list[torch.Tensor]], want: tuple[float, list[torch.Tensor]], rtol: float = RTOL) -> None:
    assert abs(got[0] - want[0]) <= rtol * max(abs(want[0]), 1e-12), (got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        assert float((g - w).abs().max()) <= rtol * max(float(w.abs().max()), 1e-12)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_moe_router_aux_loss_equals_trl_padded_in_both_layouts(setup, family: str) -> None:  # noqa: F811
    """FIXED: the router loss ran over the whole packed row (its padding tail in, a shared prompt once):
    gpt-oss 3.6e-6 off TRL's loss and 3.9e-4 off its gradients, Mixtral 1.7e-4 and 0.17 here."""
    tmp, tok, _policy, _ref, _want, prepared, _padded = setup
    policy, ref = moe(family, 0), moe(family, 1)
    want = trl.DPOTrainer(model=copy.deepcopy(policy), ref_model=copy.deepcopy(ref), processing_class=tok,
                          args=recipe.config(tmp / f"moe{family}", 5),
                          train_dataset=datasets.Dataset.from_list(recipe.records(5)))  # fmt: skip
    assert want.aux_loss_enabled and want.router_aux_loss_coef > 0
    padded = next(iter(want.get_train_dataloader()))
    expected = recipe.step(want, padded)
    for shared in (False, True):
        packs = datasets.Dataset.from_list([recipe.item(prepared[:3], shared, 0), recipe.item(prepared[3:], shared, 3)])
        got, inputs = packed(tmp / f"moe{family}{shared}", tok, policy, ref, packs)
        assert got.aux_loss_enabled
        close(recipe.step(got, inputs), expected)
        assert got._metrics["train"]["aux_loss"][-1] == pytest.approx(want._metrics["train"]["aux_loss"][-1], rel=1e-6)
        assert got._metrics["train"]["num_tokens"] == want._metrics["train"]["num_tokens"]


def test_num_tokens_of_pad_multiple_packs_is_trls_count(setup) -> None:  # noqa: F811
    """FIXED: `num_tokens` counted the --pad-multiple padding inside segments (384 vs TRL's 355 in the campaign)."""
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import write_pref_store

    tmp, tok, policy, ref, want, prepared, padded = setup
    store = write_pref_store(tmp / "tok_pm", [tuple(np.asarray(x, np.int64) for x in p) for p in prepared],
                             vocab=recipe.VOCAB)  # fmt: skip
    pack_store(PackConfig(store, 48, tmp / "packs_pm", pad_multiple=8, overlong="drop"))
    packs = packs_dataset(tmp / "packs_pm", size=48)
    got, inputs = packed(tmp / "pm", tok, policy, ref, packs, n=len(packs))
    assert sorted(inputs["pair_ids"][inputs["pair_ids"] >= 0].unique().tolist()) == [0, 1, 2, 3, 4]
    segments = torch.diff(inputs["cu_seqlens"].long())[inputs["pair_ids"] >= 0]
    assert int(segments.sum()) > int(padded["attention_mask"].sum())  # the segments hold padding
    for trainer in (want, got):
        trainer.loss_types, trainer.loss_weights, trainer.use_weighting, trainer.ld_alpha = ["sigmoid"], [1.0], False, None
        trainer._total_train_tokens = 0
    close(recipe.step(got, inputs), recipe.step(want, padded))
    assert got._metrics["train"]["num_tokens"] == want._metrics["train"]["num_tokens"] == [int(padded["attention_mask"].sum())]
    assert "cu_seqlens_unpadded" in inputs  # packs_dataset keeps the real lengths


def _precomputed(setup, name: str, ref_seed: int = 1, **kw):  # noqa: F811
    tmp, tok, policy, ref, _want, prepared, _padded = setup
    packs = datasets.Dataset.from_list([recipe.item(prepared[:3], True, 0), recipe.item(prepared[3:], True, 3)])
    trainer, _ = packed(tmp / name, tok, policy, recipe.model(ref_seed), packs, precompute_ref_log_probs=True, **kw)
    trainer.train_dataset.save_to_disk(str(tmp / f"{name}_saved"))
    return datasets.load_from_disk(str(tmp / f"{name}_saved"))


def test_saved_reference_log_probs_are_used_by_a_later_run_without_ref_model(setup) -> None:  # noqa: F811
    """FIXED: a later run on the saved packs with ref_model=None dropped the saved ref_chosen_logps /
    ref_rejected_logps and recomputed them with its (trained) policy: the reference became the policy."""
    tmp, tok, policy, _ref, _want, _prepared, _padded = setup
    saved = _precomputed(setup, "saved")
    trained = recipe.model(7)  # the later run's policy: not the reference the sums came from
    later, inputs = packed(tmp / "later", tok, trained, None, saved, precompute_ref_log_probs=True)
    assert later.train_dataset["ref_chosen_logps"] == saved["ref_chosen_logps"]
    explicit, inputs_e = packed(tmp / "explicit", tok, trained, recipe.model(1), saved)  # the reference itself
    for trainer in (later, explicit):
        trainer.loss_types, trainer.loss_weights = ["sigmoid"], [1.0]
    close(recipe.step(later, inputs), recipe.step(explicit, inputs_e), rtol=1e-9)
    assert set(saved.column_names) >= {"ref_chosen_logps", "ref_rejected_logps", "ref_pair_ids", "ref_ld_alpha"}
    with pytest.raises(ConfigError, match="precompute_ref_log_probs=True to train against the saved"):
        packed(tmp / "noflag", tok, trained, None, saved)


def test_precompute_weighs_the_reference_with_ld_alpha_and_refuses_another_one(setup) -> None:  # noqa: F811
    """FIXED: with ld_alpha the precomputed reference was the plain sum (TRL weighs the reference's tail as the
    policy's): a policy equal to its reference gave loss 0.467 instead of log 2."""
    tmp, tok, policy, _ref, _want, prepared, _padded = setup
    packs = datasets.Dataset.from_list([recipe.item(prepared[:3], False, 0), recipe.item(prepared[3:], False, 3)])
    results = []
    for precompute in (False, True):
        trainer, inputs = packed(tmp / f"ld{precompute}", tok, policy, None if precompute else policy, packs,
                                 precompute_ref_log_probs=precompute, ld_alpha=0.5)  # fmt: skip
        results.append(recipe.step(trainer, inputs))
    assert results[0][0] == pytest.approx(float(np.log(2)), rel=1e-12)
    close(results[1], results[0], rtol=1e-9)
    saved = _precomputed(setup, "ld", ld_alpha=0.5)
    with pytest.raises(ConfigError, match="weighted with ld_alpha=0.5, this run has ld_alpha=None"):
        packed(tmp / "ld_other", tok, policy, None, saved, precompute_ref_log_probs=True)


def test_saved_reference_columns_that_are_not_the_packs_are_refused(setup) -> None:  # noqa: F811
    tmp, tok, policy, _ref, _want, _prepared, _padded = setup
    saved = _precomputed(setup, "swap")
    rows = saved.to_list()
    # another pack's numbers under a pack with as many pairs: the pair ids say so
    rows[0]["ref_pair_ids"] = [9, 8, 7]
    with pytest.raises(ConfigError, match="are for pairs"):
        trainer, inputs = packed(tmp / "ids", tok, policy, None, datasets.Dataset.from_list(rows),
                                 precompute_ref_log_probs=True)  # fmt: skip
        trainer.compute_loss(trainer.model, inputs)
    # a pack whose list is one entry short (saved before ref_pair_ids existed)
    rows = [{k: v for k, v in r.items() if k not in ("ref_pair_ids", "ref_ld_alpha")} for r in saved.to_list()]
    rows[0]["ref_chosen_logps"] = rows[0]["ref_chosen_logps"][:2]
    with pytest.raises(ConfigError, match="of the batch holds 3 pairs"):
        packed(tmp / "short", tok, policy, None, datasets.Dataset.from_list(rows), precompute_ref_log_probs=True)
    with pytest.raises(ConfigError, match="has ref_chosen_logps but not ref_rejected_logps"):
        packed(tmp / "half", tok, policy, None, saved.remove_columns("ref_rejected_logps"), precompute_ref_log_probs=True)


def test_gradient_accumulation_over_packs_of_unequal_pair_counts_is_the_mean_over_the_steps_pairs(setup) -> None:  # noqa: F811
    """FIXED: each micro-batch's loss is a mean over ITS pairs and Trainer averaged the micro-batches, so with
    packs of 3 and 2 pairs a pair of the small pack weighed 1.5x one of the large (0.25 vs 1/6): one optimizer
    step now equals TRL's step over the same 5 pairs (its micro-batches hold equal counts)."""
    tmp, tok, policy, ref, _want, prepared, _padded = setup
    sgd = {"learning_rate": 0.5, "optim": "sgd", "lr_scheduler_type": "constant", "max_steps": 1,
           "max_grad_norm": 0.0, "logging_steps": 1, "save_strategy": "no"}  # fmt: skip
    want = trl.DPOTrainer(model=copy.deepcopy(policy), ref_model=copy.deepcopy(ref), processing_class=tok,
                          args=recipe.config(tmp / "ga_trl", 5, **sgd),
                          train_dataset=datasets.Dataset.from_list(recipe.records(5)))  # fmt: skip
    want.train()
    packs = datasets.Dataset.from_list([recipe.item(prepared[:3], False, 0), recipe.item(prepared[3:], False, 3)])
    got, _ = packed(tmp / "ga", tok, policy, ref, packs, n=1, gradient_accumulation_steps=2, **sgd)
    got.train()
    for g, w, before in zip(got.model.parameters(), want.model.parameters(), policy.parameters(), strict=True):
        moved = float((w.detach() - before.detach()).abs().max())  # TRL's update of this parameter
        assert float((g.detach() - w.detach()).abs().max()) <= 1e-6 * max(moved, 1e-12)
    assert got.state.log_history[0]["loss"] == pytest.approx(want.state.log_history[0]["loss"], rel=1e-6)


def test_a_sequence_longer_than_max_length_is_refused_not_trained_whole(setup) -> None:  # noqa: F811
    """FIXED: DPOConfig's max_length (1024 by default) makes TRL cut each longer sequence (keep_start); the packs
    were trained whole without a word, so the loss was not TRL's on the same pairs."""
    tmp, tok, policy, ref, _want, prepared, _padded = setup
    packs = datasets.Dataset.from_list([recipe.item(prepared[:3], False, 0), recipe.item(prepared[3:], False, 3)])
    longest = max(len(p) + max(len(c), len(r)) for p, c, r in prepared)
    got, inputs = packed(tmp / "maxlen", tok, policy, ref, packs)
    got.args.max_length = longest - 1
    with pytest.raises(ConfigError, match=f"holds {longest} tokens .* max_length={longest - 1}"):
        got.compute_loss(got.model, inputs)
    got.args.max_length = longest
    assert float(got.compute_loss(got.model, inputs)) > 0


def test_an_empty_packs_dataset_is_refused_by_name(setup) -> None:  # noqa: F811
    """FIXED: an empty dataset raised a bare StopIteration from PackedDPOTrainer's constructor."""
    tmp, tok, policy, ref, _want, _prepared, _padded = setup
    empty = datasets.Dataset.from_list([recipe.item([([5, 6], [7], [8])], False, 0)]).select([])
    with pytest.raises(ConfigError, match="the train dataset has no packs"):
        packed(tmp / "empty", tok, policy, ref, empty)


@pytest.mark.parametrize("share", [False, True], ids=["pairs", "shared_prompt"])
def test_pairs_with_an_empty_prompt_count_their_first_token_as_trl_does(setup, share: bool) -> None:  # noqa: F811
    """FIXED: TRL's ipo and sigmoid_norm divide by completion lengths that count a sequence's first token when its
    prompt is empty; the loader drops that token's label, so the packed loss was off (ipo 6.4605 for 6.4317).
    `packs_dataset` now reads the store's flag (`first_target`); a dataset without it is refused for them."""
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import write_pref_store

    tmp, tok, policy, ref, _want, _prepared, _padded = setup
    rows = recipe.records(4, seed=3)
    for row in rows[:2]:
        row["prompt"] = ""
    want = trl.DPOTrainer(model=copy.deepcopy(policy), ref_model=copy.deepcopy(ref), processing_class=tok,
                          args=recipe.config(tmp / f"cut0{share}", 4), train_dataset=datasets.Dataset.from_list(rows))  # fmt: skip
    pairs = [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in want.train_dataset]
    assert [len(p[0]) for p in pairs[:2]] == [0, 0]
    padded = next(iter(want.get_train_dataloader()))
    store = write_pref_store(tmp / f"cut0_tok{share}", [tuple(np.asarray(x, np.int64) for x in p) for p in pairs],
                             vocab=recipe.VOCAB)  # fmt: skip
    pack_store(PackConfig(store, 64, tmp / f"cut0_packs{share}", share_prompt=share, overlong="drop"))
    packs = packs_dataset(tmp / f"cut0_packs{share}", size=64)
    got, inputs = packed(tmp / f"cut0_b{share}", tok, policy, ref, packs, n=len(packs))
    for loss_type in ("ipo", "sigmoid_norm", "sigmoid"):
        for trainer in (want, got):
            trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
        close(recipe.step(got, inputs), recipe.step(want, padded))
    bare, inputs = packed(tmp / f"cut0_c{share}", tok, policy, ref, packs.remove_columns("first_target"), n=len(packs))
    assert float(bare.compute_loss(bare.model, inputs)) > 0  # sigmoid: no completion length
    bare.loss_types = ["ipo"]
    with pytest.raises(ConfigError, match="loss_type ipo divides by TRL's completion lengths"):
        bare.compute_loss(bare.model, inputs)


def test_the_pack_collator_is_the_default_and_unused_columns_may_be_removed(setup) -> None:  # noqa: F811
    """FIXED: without data_collator= TRL's DataCollatorForPreference got the packs and failed on a KeyError
    ('prompt_ids'); PreferencePackCollator is now the default."""
    tmp, tok, policy, ref, _want, prepared, _padded = setup
    packs = datasets.Dataset.from_list([recipe.item(prepared[:3], True, 0), recipe.item(prepared[3:], True, 3)])
    want, inputs = packed(tmp / "coll_a", tok, policy, ref, packs)
    pol, ref_p = copy.deepcopy(policy), copy.deepcopy(ref)
    pol.set_attn_implementation("packtool")
    ref_p.set_attn_implementation("packtool")
    got = PackedDPOTrainer(pol, ref_p, recipe.config(tmp / "coll_b", 2), train_dataset=packs.add_column("x", [1, 2]),
                           processing_class=tok)  # fmt: skip
    batch = next(iter(got.get_train_dataloader()))
    assert "x" not in batch and "pair_ids" in batch
    for trainer in (want, got):
        trainer.loss_types, trainer.loss_weights = ["sigmoid"], [1.0]
    assert recipe.step(got, batch)[0] == pytest.approx(recipe.step(want, inputs)[0], rel=1e-12)
