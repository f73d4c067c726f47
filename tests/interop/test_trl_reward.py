"""TRL 1.16's RewardTrainer on packtool preference packs equals its own padded RewardTrainer.

Same pairs (TRL's own preprocessing of string records gives the ids), the same float64 tiny
`AutoModelForSequenceClassification` (num_labels=1) of Llama, Qwen3 (sliding window 4) and Gemma 2
(softcapping): TRL's `RewardTrainer` (padded; eager, sdpa for Qwen3) vs `packtool.hf.reward.PackedRewardTrainer`
on two packs of those pairs (both layouts) under attn_implementation="packtool". The first step's loss (with
per-record margins and `center_rewards_coefficient`), every metric TRL logs, every parameter gradient and
the evaluation metrics agree within 1e-6; also with TRL's pad token = EOS (each sequence then scored at the
token before its EOS), and on a real pack store through `packs_dataset`.

Baselines: transformers 5.23's eager attention in float64 gives NaN rewards on right-padded rows under a
sliding window (a padding query whose window holds only padding), and computes its softmax in float32
(7e-7 off on Gemma 2's gradients). So Llama and Qwen3 run sdpa (float64 throughout); Gemma 2 (eager only)
runs with a window longer than the rows and its softmax kept in float64 (`float64_softmax`); Gemma 2's
sliding window is checked against each sequence alone in tests/test_pair_scores.py. What remains is the
models' own float32 RMSNorm (Llama's, Gemma 2's), whose weight gradients sum in another order over a packed
row than over a padded batch: up to 3e-7 relative, under the 1e-6 asserted.
"""

from __future__ import annotations

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
from packtool.errors import ConfigError  # noqa: E402
from packtool.hf.dpo import packs_dataset  # noqa: E402
from packtool.hf.reward import PackedRewardTrainer, with_margins  # noqa: E402
from tests.pair_support import batch  # noqa: E402

VOCAB = 64
RTOL = 1e-6
METRICS = ("num_tokens", "min_reward", "mean_reward", "max_reward", "accuracy", "margin")
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2, "num_labels": 1, "num_hidden_layers": 2}  # fmt: skip
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                              layer_types=["sliding_attention", "full_attention"]),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, sliding_window=64, query_pre_attn_scalar=8,
                                                attn_logit_softcapping=0.5, final_logit_softcapping=None,
                                                layer_types=["sliding_attention", "full_attention"]),
}  # fmt: skip
BASELINE = {"llama": "sdpa", "qwen3": "sdpa", "gemma2": "eager"}


@pytest.fixture(autouse=True)
def float64_softmax(monkeypatch: pytest.MonkeyPatch) -> None:
    """eager attention asks softmax for float32 whatever the model's dtype: keep float64 inputs in float64."""
    softmax = torch.nn.functional.softmax

    def keep(x, dim=None, _stacklevel=3, dtype=None):
        return softmax(x, dim=dim, dtype=x.dtype if x.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", keep)


def tokenizer(directory: Path, pad: bool):
    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    special = {"eos_token": "<eos>", **({"pad_token": "<pad>"} if pad else {})}
    (directory / "tokenizer_config.json").write_text(json.dumps(special))
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def records(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)

    def words(lo: int, hi: int) -> str:
        k = int(torch.randint(lo, hi + 1, (1,), generator=g))
        return " ".join(f"w{int(i)}" for i in torch.randint(4, VOCAB, (k,), generator=g))

    return [{"prompt": words(4, 9) + " ", "chosen": words(1, 6) + " <eos>", "rejected": words(1, 7) + " <eos>",
             "margin": float(torch.rand((), generator=g)) - 0.3} for _ in range(n)]  # fmt: skip


def model(name: str):
    torch.manual_seed(0)
    m = transformers.AutoModelForSequenceClassification.from_config(CONFIGS[name](), attn_implementation=BASELINE[name])
    return m.to(torch.float64)


def config(tmp_path: Path, n: int, **kw):
    kw = {"max_length": None, **kw}
    return trl.RewardConfig(output_dir=str(tmp_path), per_device_train_batch_size=n, per_device_eval_batch_size=n,
                            bf16=False, use_cpu=True, report_to="none",
                            center_rewards_coefficient=0.01, **kw)  # fmt: skip


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
    return loss.item(), grads


def trl_run(tmp: Path, name: str, pad: bool):
    tok = tokenizer(tmp / f"tok{pad}", pad)
    rows = records(5)
    want = trl.RewardTrainer(model=model(name), args=config(tmp / "want", 5), train_dataset=datasets.Dataset.from_list(rows),
                             processing_class=tok)  # fmt: skip
    # TRL's ids of prompt + completion, split where the prompt's own ids end (for the pack layouts)
    prepared = []
    for row, done in zip(rows, want.train_dataset, strict=True):
        p = len(tok(row["prompt"])["input_ids"])
        assert done["chosen_ids"][:p] == done["rejected_ids"][:p]
        prepared.append((done["chosen_ids"][:p], done["chosen_ids"][p:], done["rejected_ids"][p:]))
    return tok, rows, want, prepared


def compare(want, got, w_inputs, g_inputs) -> None:
    w_loss, w_grads = step(want, w_inputs)
    g_loss, g_grads = step(got, g_inputs)
    assert abs(g_loss - w_loss) <= RTOL * max(abs(w_loss), 1e-12), (g_loss, w_loss)
    for g, w in zip(g_grads, w_grads, strict=True):
        assert float((g - w).abs().max()) <= RTOL * max(float(w.abs().max()), 1e-12)
    for key in METRICS:
        assert got._metrics["train"][key][-1] == pytest.approx(want._metrics["train"][key][-1], rel=RTOL, abs=1e-12), key


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_reward_trainer_equals_trl_padded(tmp_path: Path, name: str, shared: bool) -> None:
    tok, rows, want, prepared = trl_run(tmp_path, name, pad=True)
    packs = with_margins(datasets.Dataset.from_list([item(prepared[:3], shared, 0), item(prepared[3:], shared, 3)]),
                         [r["margin"] for r in rows])  # fmt: skip
    m = model(name)
    m.set_attn_implementation("packtool")
    got = PackedRewardTrainer(model=m, args=config(tmp_path / "got", 2), train_dataset=packs, processing_class=tok)
    padded = next(iter(want.get_train_dataloader()))
    inputs = next(iter(got.get_train_dataloader()))
    assert "margin" in padded and "margin" in inputs
    assert sorted(inputs["pair_ids"][inputs["pair_ids"] >= 0].unique().tolist()) == [0, 1, 2, 3, 4]
    compare(want, got, padded, inputs)
    # evaluation: TRL's prediction_step over compute_loss(return_outputs=True), the same metrics
    w_eval = want.evaluate(eval_dataset=datasets.Dataset.from_list(rows))
    g_eval = got.evaluate(eval_dataset=packs)
    for key in ("eval_loss", "eval_accuracy", "eval_margin", "eval_mean_reward", "eval_min_reward", "eval_max_reward"):
        assert g_eval[key] == pytest.approx(w_eval[key], rel=RTOL, abs=1e-12), key


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
def test_pad_token_eos_scores_the_token_before_eos_as_trl(tmp_path: Path, shared: bool) -> None:
    """No pad token: TRL pads with EOS and the model's pooling reads the rightmost non-EOS token."""
    tok, rows, want, prepared = trl_run(tmp_path, "llama", pad=False)
    assert want.model.config.pad_token_id == tok.eos_token_id == 2
    packs = datasets.Dataset.from_list([item(prepared[:3], shared, 0), item(prepared[3:], shared, 3)])
    m = model("llama")
    m.set_attn_implementation("packtool")
    got = PackedRewardTrainer(model=m, args=config(tmp_path / "got", 2), train_dataset=packs, processing_class=tok)
    padded = next(iter(want.get_train_dataloader()))
    padded.pop("margin")
    compare(want, got, padded, next(iter(got.get_train_dataloader())))


def test_a_real_pack_store_through_packs_dataset_trains_and_equals_trl(tmp_path: Path) -> None:
    import numpy as np

    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import write_pref_store

    tok, rows, want, prepared = trl_run(tmp_path, "qwen3", pad=True)
    store = write_pref_store(tmp_path / "store", [tuple(np.asarray(x, np.int64) for x in p) for p in prepared],
                             vocab=VOCAB)  # fmt: skip
    pack_store(PackConfig(store, 40, tmp_path / "packs", share_prompt=True, overlong="drop"))
    packs = with_margins(packs_dataset(tmp_path / "packs", size=40), [r["margin"] for r in rows])
    m = model("qwen3")
    m.set_attn_implementation("packtool")
    got = PackedRewardTrainer(model=m, args=config(tmp_path / "got", len(packs), max_steps=2, logging_steps=1),
                              train_dataset=packs, processing_class=tok)  # fmt: skip
    compare(want, got, next(iter(want.get_train_dataloader())), next(iter(got.get_train_dataloader())))
    got.train()
    logged = [h for h in got.state.log_history if "loss" in h]
    assert len(logged) == 2 and all(k in logged[0] for k in METRICS)


def test_refusals(tmp_path: Path) -> None:
    tok, rows, _want, prepared = trl_run(tmp_path, "llama", pad=True)
    packs = datasets.Dataset.from_list([item(prepared[:3], True, 0), item(prepared[3:], True, 3)])
    with pytest.raises(ConfigError, match="no pair_ids"):
        PackedRewardTrainer(model=model("llama"), args=config(tmp_path / "a", 2),
                            train_dataset=datasets.Dataset.from_list(rows), processing_class=tok)  # fmt: skip
    eager = PackedRewardTrainer(model=model("llama"), args=config(tmp_path / "b", 2), train_dataset=packs,
                                processing_class=tok)  # fmt: skip
    with pytest.raises(ConfigError, match="no attn_implementation='packtool' layer attended"):
        eager.compute_loss(eager.model, next(iter(eager.get_train_dataloader())))
    m = model("llama")
    m.set_attn_implementation("packtool")
    short = PackedRewardTrainer(model=m, args=config(tmp_path / "c", 2, max_length=8), train_dataset=packs,
                                processing_class=tok)  # fmt: skip
    with pytest.raises(ConfigError, match=r"longer than max_length 8.*max_length=None"):
        short.compute_loss(short.model, next(iter(short.get_train_dataloader())))
    with pytest.raises(ConfigError, match="margins has 2 values"):
        with_margins(packs, [0.0, 1.0])


def test_the_trl_recipe_of_hf_md_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from support import cli

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "HF.md").read_text()
    section = text[text.index("## Reward models on the same packs") :]
    block = re.findall(r"```python\n(.*?)```", section[: section.index("\n## ", 5)], re.S)[1]
    assert "PackedRewardTrainer(" in block
    (tmp_path / "data").symlink_to(root / "data")
    code, _, err = cli("tokenize", str(root / "data/sample/preference.jsonl"), "--format", "preference",
                       "--tokenizer", str(root / "data/sample/tokenizer"), "--output", str(tmp_path / "t"), "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = cli("pack", str(tmp_path / "t"), "--size", "4096", "--share-prompt", "--output",
                       str(tmp_path / "packs"), "-q")  # fmt: skip
    assert code == 0, err
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "__recipe__"}
    exec(compile(block, "docs/HF.md (reward TRL recipe)", "exec"), scope)
    trainer = scope["trainer"]
    logged = [h for h in trainer.state.log_history if "loss" in h or "train_loss" in h]
    assert trainer.state.global_step == 2 and logged, trainer.state.log_history
    assert trainer.model.config.pad_token_id == scope["tokenizer"].pad_token_id == 1


def test_the_outermost_score_head_is_read_and_an_empty_batch_is_refused(tmp_path: Path) -> None:
    from packtool.hf.reward import _score_head, packed_rewards

    m = model("llama")
    m.model.layers[0].mlp.score = torch.nn.Identity()  # a module deeper down that happens to be named score
    assert _score_head(m) is m.score
    m.set_attn_implementation("packtool")
    empty = {"input_ids": torch.zeros(1, 2, dtype=torch.long), "position_ids": torch.arange(2)[None],
             "cu_seqlens": torch.tensor([0, 2], dtype=torch.int32), "cu_seq_lens_q": torch.tensor([0, 2], dtype=torch.int32),
             "cu_seq_lens_k": torch.tensor([0, 2], dtype=torch.int32), "max_length_q": 2, "max_length_k": 2,
             "pair_ids": torch.tensor([-1]), "chosen": torch.tensor([False])}  # fmt: skip
    with pytest.raises(ConfigError, match="without a single pair"):
        packed_rewards(m, empty, 0)
    with pytest.raises(ConfigError, match="has no `score` head"):
        _score_head(torch.nn.Linear(2, 2))


def test_pad_multiple_packs_equal_trl_and_count_its_tokens(tmp_path: Path) -> None:
    """`--pad-multiple` pads every segment with pad tokens: the reward is read at the last REAL token and
    `num_tokens` counts what TRL's attention_mask counts (the packs carry `cu_seqlens_unpadded`)."""
    from tests.test_pair_scores import padded_to

    tok, rows, want, prepared = trl_run(tmp_path, "llama", pad=True)

    def padded_item(pairs, first: int) -> dict:
        b = batch(pairs, False, pad=2, first_pair=first)
        p = padded_to(b, 4)
        return {"input_ids": p["input_ids"][0].tolist(), "labels": p["labels"][0].tolist(),
                "position_ids": p["position_ids"][0].tolist(), "cu_seqlens": p["cu_seq_lens_q"].tolist(),
                "cu_seqlens_unpadded": b["cu_seq_lens_q"].tolist(), "pair_ids": b["pair_ids"].tolist(),
                "chosen": b["chosen"].tolist()}  # fmt: skip

    packs = datasets.Dataset.from_list([padded_item(prepared[:3], 0), padded_item(prepared[3:], 3)])
    assert sum(len(r["input_ids"]) for r in packs) > sum(len(p) + len(c) + len(r) + len(p) for p, c, r in prepared) + 4
    m = model("llama")
    m.set_attn_implementation("packtool")
    got = PackedRewardTrainer(model=m, args=config(tmp_path / "got", 2), train_dataset=packs, processing_class=tok)
    padded = next(iter(want.get_train_dataloader()))
    padded.pop("margin")
    inputs = next(iter(got.get_train_dataloader()))
    assert "cu_seqlens_unpadded" in inputs
    compare(want, got, padded, inputs)
    bare = {k: v for k, v in inputs.items() if k != "cu_seqlens_unpadded"}
    with pytest.raises(Exception, match="ends on an unlabelled token"):
        got.compute_loss(got.model, bare)
