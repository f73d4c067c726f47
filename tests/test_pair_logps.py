"""`packtool.loss.pair_logps` on packed preference batches equals each sequence run alone (float64, 1e-6).

Tiny real transformers models from their config classes (Llama; Qwen3 and Mistral with a sliding
window of 4, shorter than the sequences; Gemma 2 with logit softcapping), the same weights run
each sequence alone under `eager` as the reference, and the packed batch (both layouts: `[P+C][P+R]`
and the shared prompt `[P][C][R]`, a padding tail) under attn_implementation="packtool". Sums and
every parameter gradient of `sum(chosen) - 0.5 * sum(rejected)` must match.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402,F401
from packtool.errors import ConfigError, FormatError  # noqa: E402
from packtool.loss import dpo_loss, pair_logps, pair_targets  # noqa: E402
from tests.pair_support import alone_logps, batch, make_pairs  # noqa: E402

VOCAB = 96
RTOL = 1e-6
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_hidden_layers=2),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1, layer_types=["sliding_attention", "full_attention"]),
    "mistral": lambda: transformers.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=4),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                                attn_logit_softcapping=0.5, final_logit_softcapping=None,
                                                layer_types=["sliding_attention", "full_attention"]),
}  # fmt: skip


def build(name: str, attn: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name](), attn_implementation=attn)
    return model.to(torch.float64).eval()


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max().detach() / want.abs().max().clamp(min=1e-30).detach())


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pair_logps_equal_each_sequence_alone_with_gradients(name: str, shared: bool) -> None:
    pairs = make_pairs(1, 3, VOCAB)
    pairs[1] = (pairs[1][0], pairs[1][1], list(pairs[1][1]))  # identical chosen and rejected
    pairs[2] = (pairs[2][0], pairs[2][1], [])  # an empty rejected completion (no EOS): logps 0 over 0 tokens
    ref = build(name, "eager")
    want_c = torch.stack([alone_logps(ref, p, c) for p, c, _ in pairs])
    want_r = torch.stack([alone_logps(ref, p, r) for p, _, r in pairs])
    (want_c.sum() - 0.5 * want_r.sum()).backward()
    want_g = grads(ref)

    model = build(name, "packtool")
    model.load_state_dict(ref.state_dict())
    b = batch(pairs, shared, first_pair=7)
    logits = model(**b, use_cache=False).logits  # the whole batch: the door ignores pair_ids / chosen
    got = pair_logps(logits, b)
    assert got.pair_ids.tolist() == [7, 8, 9]
    assert got.chosen_tokens.tolist() == [len(c) for _, c, _ in pairs]
    assert got.rejected_tokens.tolist() == [len(r) for _, _, r in pairs]
    assert rel(got.chosen, want_c) < RTOL and rel(got.rejected, want_r) < RTOL
    assert float(got.rejected[2]) == 0.0
    (got.chosen.sum() - 0.5 * got.rejected.sum()).backward()
    for g, w in zip(grads(model), want_g, strict=True):
        assert rel(g, w) < RTOL


def test_kept_logits_equal_full_logits_and_dpo_loss_is_trls_sigmoid() -> None:
    pairs = make_pairs(2, 2, VOCAB)
    model = build("llama", "packtool")
    b = batch(pairs, shared=True)
    keys = {k: v for k, v in b.items() if k not in ("labels",)}
    full = pair_logps(model(**keys).logits, b)
    rows = pair_targets(b).predictor
    kept = pair_logps(model(**keys, logits_to_keep=rows).logits, b, kept=True)
    assert rel(kept.chosen, full.chosen) < 1e-12 and rel(kept.rejected, full.rejected) < 1e-12
    ref = pair_logps(model(**keys).logits.detach() * 0.9, b)
    loss = dpo_loss(full, ref, beta=0.1)
    delta = 0.1 * ((full.chosen - ref.chosen) - (full.rejected - ref.rejected))
    assert torch.allclose(loss, -torch.nn.functional.logsigmoid(delta).mean())


def test_a_shared_batch_run_under_another_attention_is_refused() -> None:
    pairs = make_pairs(3, 2, VOCAB)
    model = build("llama", "sdpa")
    b = batch(pairs, shared=True)
    # sdpa ignores prefix_segment: the rejected completion misses its prompt (with labels, model() itself refuses:
    # tests/test_hostile_pairs_blend.py)
    logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
    with pytest.raises(ConfigError, match="attn_implementation='packtool'"):
        pair_logps(logits, b)


def test_malformed_preference_batches_are_refused() -> None:
    pairs = make_pairs(4, 2, VOCAB)
    b = batch(pairs, shared=False)
    logits = torch.zeros(b["labels"].numel(), VOCAB)
    split = dict(b, pair_ids=torch.tensor([0, 0, 1, 5, -1]))  # pair 1 has no rejected, pair 5 no chosen
    with pytest.raises(FormatError, match="exactly one chosen and one rejected"):
        pair_logps(logits, split)
    with pytest.raises(ConfigError, match="no 'pair_ids'"):
        pair_logps(logits, {k: v for k, v in b.items() if k != "pair_ids"})
    s = batch(pairs, shared=True)
    with pytest.raises(FormatError, match="not an earlier one"):
        pair_logps(
            torch.zeros(s["labels"].numel(), VOCAB),
            dict(s, prefix_segment=torch.tensor([-1, 2, 0, -1, 3, 3, -1])),
            check_attention=False,
        )
    labelled = s["labels"].clone()
    labelled[0, 1] = 5  # a prompt token as a target
    with pytest.raises(FormatError, match="prompt segment has target labels"):
        pair_logps(torch.zeros(s["labels"].numel(), VOCAB), dict(s, labels=labelled), check_attention=False)


def test_export_trl_prints_the_dpo_recipe_for_a_preference_store() -> None:
    from packtool.stages.export.trl import dpo_recipe

    text = "\n".join(dpo_recipe("/packs", 1024))
    for needle in (
        "PackedDPOTrainer",
        "PreferencePackCollator",
        'attn_implementation="packtool"',
        "remove_unused_columns=False",
        "bf16=False, use_cpu=True",
        "nothing written",
    ):
        assert needle in text


def test_the_door_refuses_shared_batches_it_cannot_run_exactly() -> None:
    pairs = make_pairs(5, 2, VOCAB)
    model = build("llama", "packtool")
    b = batch(pairs, shared=True)
    keys = {k: v for k, v in b.items() if k != "labels"}
    with pytest.raises(ConfigError, match="without cu_seq_lens_q"):
        model(**{k: v for k, v in keys.items() if not k.startswith(("cu_seq", "max_length"))})
    with pytest.raises(ConfigError, match="padding attention_mask"):
        mask = torch.ones_like(b["input_ids"])
        mask[0, -1] = 0
        model(**keys, attention_mask=mask)
    restarted = b["position_ids"].clone()
    start = int(b["cu_seq_lens_q"][2])  # the first rejected completion, its positions from 0
    restarted[0, start : int(b["cu_seq_lens_q"][3])] -= int(restarted[0, start])
    with pytest.raises(ConfigError, match="do not continue each completion from its prompt"):
        model(**dict(keys, position_ids=restarted, prefix_segment=b["prefix_segment"].clone()))


def test_the_shared_layout_is_computed_once_per_forward(monkeypatch) -> None:
    from packtool.hf import shared_prompt

    calls = []
    real = shared_prompt.shared_prompt_layout
    monkeypatch.setattr(shared_prompt, "shared_prompt_layout", lambda *a, **k: calls.append(1) or real(*a, **k))
    b = batch(make_pairs(6, 2, VOCAB), shared=True)
    b["cu_seq_lens_k"] = b["cu_seq_lens_q"].clone()  # equal, another tensor (checked once, not per layer)
    build("llama", "packtool")(**b)  # two layers
    assert len(calls) == 1


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_real_preference_pack_stores_score_each_pair_as_alone(tmp_path, name: str) -> None:
    """tokenize-shaped store -> `pack` (both layouts) -> PackedCollator(keys=HF_KEYS) -> model(**batch) -> pair_logps."""
    import numpy as np

    from packtool.formats.token_store import open_token_store
    from packtool.loader.collator import HF_KEYS, PackedCollator
    from packtool.loader.dataset import PackedDataset
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import hostile_pairs, realistic_pairs, write_pref_store

    tok = write_pref_store(tmp_path / "tok", realistic_pairs(12, seed=3, vocab=VOCAB, scale=0.08) + hostile_pairs(VOCAB),
                           vocab=VOCAB)  # fmt: skip
    store = open_token_store(tok)
    ref = build(name, "eager")
    model = build(name, "packtool")
    model.load_state_dict(ref.state_dict())

    def alone(doc: int) -> float:
        ids = torch.as_tensor(np.asarray(store.document(doc), np.int64))
        s = int(store.starts[doc])
        target = torch.as_tensor(np.asarray(store.loss[s : s + ids.numel()]) != 0)
        if ids.numel() < 2:
            return 0.0
        with torch.no_grad():
            logits = ref(input_ids=ids[None]).logits[0, :-1]
        logp = torch.log_softmax(logits, -1).gather(1, ids[1:, None])[:, 0]
        return float(logp[target[1:]].sum())

    for share in (False, True):
        out = tmp_path / f"packs{share}"
        pack_store(PackConfig(tok, 48, out, share_prompt=share, overlong="drop"))
        ds = PackedDataset(out, size=48)
        seen = set()
        for start in range(0, len(ds), 3):
            b = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__(list(range(start, min(start + 3, len(ds))))))
            got = pair_logps(model(**b).logits, b)
            for pair, c, r in zip(got.pair_ids.tolist(), got.chosen.tolist(), got.rejected.tolist(), strict=True):
                want_c, want_r = alone(2 * pair), alone(2 * pair + 1)
                assert abs(c - want_c) <= RTOL * max(1.0, abs(want_c)), (share, pair)
                assert abs(r - want_r) <= RTOL * max(1.0, abs(want_r)), (share, pair)
                seen.add(pair)
        assert len(seen) >= 15  # every pair that fits a pack of 48


def test_packtool_export_trl_prints_the_dpo_recipe_for_a_preference_pack_store(tmp_path) -> None:
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import realistic_pairs, write_pref_store
    from tests.support import cli

    tok = write_pref_store(tmp_path / "tok", realistic_pairs(20, seed=1, scale=0.1))
    pack_store(PackConfig(tok, 128, tmp_path / "packs", share_prompt=True, overlong="drop"))
    packs = next((tmp_path / "packs").rglob("128_metadata.jsonl")).parent
    code, out, err = cli("export", str(packs), "--to", "trl", "--size", "128", "--output", str(tmp_path / "x"))
    assert code == 0, err
    text = out + err
    assert f'packs_dataset("{packs}", size=128)' in text and "PackedDPOTrainer" in text
    assert "nothing written" in text and "TRL SFT" not in text
    assert not list((tmp_path / "x").glob("*.parquet"))  # an SFT parquet of pairs would train on rejected too
