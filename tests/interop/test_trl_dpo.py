"""TRL 1.16's DPOTrainer on packtool preference packs equals its own padded DPOTrainer, for every loss_type.

Same pairs (TRL's own preprocessing of string records gives the ids), same float64 tiny Llama (sdpa: float64
throughout; eager's float32 softmax is 1e-6 off on the sppo_hard gradients) and reference: TRL's `DPOTrainer` (padded) vs `packtool.hf.dpo.PackedDPOTrainer` on two
packs of those pairs (both layouts: `[P+C][P+R]` and the shared prompt `[P][C][R]`) under
attn_implementation="packtool". The first step's loss and every parameter gradient agree within
1e-6 (relative to the largest), for each TRL loss type, plus `use_weighting` and `ld_alpha`.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")
transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

import packtool.hf  # noqa: E402,F401
from packtool.hf.dpo import PackedDPOTrainer, PreferencePackCollator  # noqa: E402
from tests.pair_support import batch  # noqa: E402

LOSS_TYPES = ["sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
              "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm"]  # fmt: skip
VOCAB = 64
RTOL = 1e-6


def tokenizer(directory: Path):
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<pad>"}))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def records(n: int, seed: int = 0) -> list[dict[str, str]]:
    g = torch.Generator().manual_seed(seed)

    def words(lo: int, hi: int) -> str:
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return " ".join(f"w{int(i)}" for i in torch.randint(4, VOCAB, (k,), generator=g))

    return [{"prompt": words(4, 9) + " ", "chosen": words(1, 6) + " <eos>", "rejected": words(1, 7) + " <eos>"}
            for _ in range(n)]  # fmt: skip


def model(seed: int):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2, max_position_embeddings=64)  # fmt: skip
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(torch.float64)


def config(tmp_path: Path, n: int, **kw):
    return trl.DPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=n, bf16=False, use_cpu=True,
                         max_length=None, report_to="none", beta=0.2, label_smoothing=0.1, **kw)  # fmt: skip


def item(pairs, shared: bool, first: int) -> dict:
    b = batch(pairs, shared, pad=2, first_pair=first)
    out = {"input_ids": b["input_ids"][0].tolist(), "labels": b["labels"][0].tolist(),
           "position_ids": b["position_ids"][0].tolist(), "cu_seqlens": b["cu_seq_lens_q"].tolist(),
           "pair_ids": b["pair_ids"].tolist(), "chosen": b["chosen"].tolist()}  # fmt: skip
    if shared:
        out["prefix_segment"] = b["prefix_segment"].tolist()
    return out


def step(trainer, inputs) -> tuple[float, list[torch.Tensor]]:
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in trainer.model.parameters()]
    return float(loss.detach()), grads


class _Float64Head:
    """TRL's fused LM head (`kernels.ChunkedLogProbFunction`) computes in float32 whatever the model's dtype, which
    puts ~1e-7 relative rounding into TRL's own log-probs (1.1e-6 on sppo_hard's gradients). The baseline runs the
    same head math in float64 instead, so the comparison measures packing, not TRL's float32 tiles."""

    @staticmethod
    def apply(hidden, weight, bias, labels, temperature, chunk, softcap, scale, outputs):
        z = hidden @ weight.T if bias is None else torch.addmm(bias, hidden, weight.T)
        z = z * scale
        if softcap:
            z = softcap * torch.tanh(z / softcap)
        z = z / temperature
        logp = torch.log_softmax(z, -1)
        lp = logp.gather(1, labels.clamp(min=0)[:, None])[:, 0]
        with torch.no_grad():
            entropy = -(logp.exp() * logp).sum(-1) if "entropy" in outputs else None
            lss = torch.logsumexp(2 * logp, -1) if "log_sum_sq_probs" in outputs else None
            mean = z.mean(-1) if "mean_logits" in outputs else None
            top1 = z.argmax(-1) == labels if "is_top1" in outputs else None
        return lp, entropy, lss, mean, top1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import trl.trainer.utils as trl_utils

    patch = pytest.MonkeyPatch()
    patch.setattr(trl_utils, "_ChunkedLogProbFunction", _Float64Head)
    tmp = tmp_path_factory.mktemp("dpo")
    tok = tokenizer(tmp / "tok")
    rows = records(5)
    policy, ref = model(0), model(1)
    want = trl.DPOTrainer(model=copy.deepcopy(policy), ref_model=copy.deepcopy(ref), args=config(tmp / "a", 5, use_weighting=True),
                          train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)  # fmt: skip
    prepared = [(r["prompt_ids"], r["chosen_ids"], r["rejected_ids"]) for r in want.train_dataset]
    padded = next(iter(want.get_train_dataloader()))
    yield tmp, tok, policy, ref, want, prepared, padded
    patch.undo()


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
def test_packed_dpo_trainer_equals_trl_padded_for_every_loss_type(setup, shared: bool) -> None:
    tmp, tok, policy, ref, want, prepared, padded = setup
    packs = [item(prepared[:3], shared, 0), item(prepared[3:], shared, 3)]
    pol = copy.deepcopy(policy)
    pol.set_attn_implementation("packtool")
    ref_p = copy.deepcopy(ref)
    ref_p.set_attn_implementation("packtool")
    got = PackedDPOTrainer(model=pol, ref_model=ref_p, args=config(tmp / f"b{shared}", 2, remove_unused_columns=False),
                           train_dataset=datasets.Dataset.from_list(packs), data_collator=PreferencePackCollator(),
                           processing_class=tok)  # fmt: skip
    inputs = next(iter(got.get_train_dataloader()))
    assert sorted(inputs["pair_ids"][inputs["pair_ids"] >= 0].unique().tolist()) == [0, 1, 2, 3, 4]
    cases = [(lt, {}) for lt in LOSS_TYPES] + [("sigmoid", {"use_weighting": True}), ("sigmoid", {"ld_alpha": 0.5})]
    for loss_type, extra in cases:
        for trainer in (want, got):
            trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
            trainer.use_weighting = extra.get("use_weighting", False)
            trainer.ld_alpha = extra.get("ld_alpha")
        w_loss, w_grads = step(want, padded)
        g_loss, g_grads = step(got, inputs)
        assert abs(g_loss - w_loss) <= RTOL * max(abs(w_loss), 1e-12), (loss_type, extra, g_loss, w_loss)
        for g, w in zip(g_grads, w_grads, strict=True):
            scale = float(w.abs().max())
            assert float((g - w).abs().max()) <= RTOL * max(scale, 1e-12), (loss_type, extra)
    assert got._metrics["train"]["logps/chosen"][-1] == pytest.approx(
        want._metrics["train"]["logps/chosen"][-1], rel=1e-6
    )


def test_precomputed_reference_log_probs_per_pack_equal_the_reference_forward(setup) -> None:
    tmp, tok, policy, _ref, _want, prepared, _padded = setup
    packs = [item(prepared[:3], True, 0), item(prepared[3:], True, 3)]
    results = []
    for precompute in (False, True):
        pol = copy.deepcopy(policy)
        pol.set_attn_implementation("packtool")
        ref = None if precompute else copy.deepcopy(pol)  # precompute: the initial policy is the reference
        trainer = PackedDPOTrainer(model=pol, ref_model=ref, train_dataset=datasets.Dataset.from_list(packs),
                                   args=config(tmp / f"p{precompute}", 2, remove_unused_columns=False,
                                               precompute_ref_log_probs=precompute),
                                   data_collator=PreferencePackCollator(), processing_class=tok)  # fmt: skip
        if precompute:
            assert [len(x) for x in trainer.train_dataset["ref_chosen_logps"]] == [3, 2]
        inputs = next(iter(trainer.get_train_dataloader()))
        out = []
        for loss_type in ("sigmoid", "ipo", "apo_down"):
            trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
            out.append(step(trainer, inputs))
        results.append(out)
    for (a_loss, a_grads), (b_loss, b_grads) in zip(*results, strict=True):
        assert abs(a_loss - b_loss) <= 1e-9 * max(abs(a_loss), 1e-12)
        for g, w in zip(b_grads, a_grads, strict=True):
            assert float((g - w).abs().max()) <= 1e-9 * max(float(w.abs().max()), 1e-12)


def test_packs_dataset_keeps_the_pack_keys_and_refuses_plain_packs() -> None:
    from packtool.errors import ConfigError
    from packtool.hf.dpo import packs_dataset

    pairs = [([5, 6, 7], [8, 9], [10]), ([11, 12], [13], [14, 15])]
    b = batch(pairs, True, pad=2)
    items = [{"input_ids": b["input_ids"][0], "labels": b["labels"][0], "position_ids": b["position_ids"][0],
              "cu_seqlens": b["cu_seq_lens_q"], "pair_ids": b["pair_ids"], "chosen": b["chosen"],
              "prefix_segment": b["prefix_segment"], "shared_prompt": True}]  # fmt: skip
    ds = packs_dataset(items)
    assert set(ds.column_names) == {"input_ids", "labels", "position_ids", "cu_seqlens", "pair_ids", "chosen",
                                    "prefix_segment"}  # fmt: skip
    got = PreferencePackCollator()([ds[0]])
    assert torch.equal(got["prefix_segment"], b["prefix_segment"]) and torch.equal(
        got["cu_seqlens"], b["cu_seq_lens_q"]
    )
    with pytest.raises(ConfigError, match="not a preference pack store"):
        packs_dataset([{k: v for k, v in items[0].items() if k != "pair_ids"}])


@pytest.mark.parametrize("share", [False, True], ids=["pairs", "shared_prompt"])
def test_a_real_pack_store_through_packs_dataset_equals_trl_padded(setup, share: bool) -> None:
    """TRL's own ids -> a preference token store -> `pack_store` -> `packs_dataset` -> PackedDPOTrainer."""
    import numpy as np

    from packtool.hf.dpo import packs_dataset
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import write_pref_store

    tmp, tok, policy, ref, want, prepared, padded = setup
    store = write_pref_store(tmp / f"tok{share}", [tuple(np.asarray(x, np.int64) for x in p) for p in prepared],
                             vocab=VOCAB)  # fmt: skip
    out = tmp / f"packs{share}"
    pack_store(PackConfig(store, 40, out, share_prompt=share, overlong="drop"))
    packs = packs_dataset(out, size=40)
    pol, ref_p = copy.deepcopy(policy), copy.deepcopy(ref)
    pol.set_attn_implementation("packtool")
    ref_p.set_attn_implementation("packtool")
    got = PackedDPOTrainer(model=pol, ref_model=ref_p, train_dataset=packs, data_collator=PreferencePackCollator(),
                           args=config(tmp / f"r{share}", len(packs), remove_unused_columns=False),
                           processing_class=tok)  # fmt: skip
    inputs = next(iter(got.get_train_dataloader()))
    assert sorted(inputs["pair_ids"][inputs["pair_ids"] >= 0].unique().tolist()) == [0, 1, 2, 3, 4]
    for loss_type in ("sigmoid", "ipo", "sft", "aot"):
        for trainer in (want, got):
            trainer.loss_types, trainer.loss_weights = [loss_type], [1.0]
            trainer.use_weighting, trainer.ld_alpha = False, None
        w_loss, w_grads = step(want, padded)
        g_loss, g_grads = step(got, inputs)
        assert abs(g_loss - w_loss) <= RTOL * max(abs(w_loss), 1e-12), (loss_type, g_loss, w_loss)
        for g, w in zip(g_grads, w_grads, strict=True):
            assert float((g - w).abs().max()) <= RTOL * max(float(w.abs().max()), 1e-12), loss_type
