"""Proof that the document-level modes equal running each document alone (CPU, float32 and float64).

Padding-free minibatches (`DocumentDataset` + `PackedCollator(flatten=True)`) and padded batches
(`PaddedCollator`), on the project's tiny model (`scripts/train_plain.py`'s TinyLM: RoPE from
position_ids, GQA, `varlen_attention`) and on transformers' `LlamaForCausalLM`: every document's
logits are those it gets alone, and `packed_cross_entropy` and its gradients equal the loss of the
documents run one by one (1e-5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from packtool.attention import varlen_attention
from packtool.loader import DocumentDataset, PackedCollator, PaddedCollator
from packtool.loss import packed_cross_entropy

VOCAB, TOL = 600, 1e-5
DTYPES = [torch.float32, torch.float64]


def pick(ds: DocumentDataset, n: int = 9) -> list[int]:
    """A Zipf-shaped minibatch: the longest documents, short ones, one target-free one and an empty one."""
    by_len = sorted(range(len(ds)), key=lambda d: int(ds.lengths[d]))
    nonempty = [d for d in by_len if ds.lengths[d] > 1]
    chosen = nonempty[-3:] + nonempty[:3] + nonempty[len(nonempty) // 2 : len(nonempty) // 2 + n - 6]
    empty = [d for d in by_len if ds.lengths[d] == 0]
    return chosen + empty[:1]


def reference(model_logits, ds: DocumentDataset, idx: list[int]) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """Each document alone: its logits, and the summed HF loss over all of them, and the target count."""
    logits, total, count = [], 0.0, 0
    for d in idx:
        item = ds[d]
        n = item["input_ids"].numel()
        if n == 0:
            logits.append(None)
            continue
        lg = model_logits(item)
        logits.append(lg)
        total = total + F.cross_entropy(lg[:-1], item["labels"][1:], ignore_index=-100, reduction="sum")
        count += int((item["labels"][1:] != -100).sum())
    return logits, total, count


def assert_same(packed_logits: list[torch.Tensor], alone: list[torch.Tensor], how: str) -> float:
    worst = max(float((p - a).detach().abs().max()) for p, a in zip(packed_logits, alone, strict=True) if a is not None)
    print(f"{how}: max abs logit diff {worst:.2e}")
    assert worst <= TOL, f"{how}: {worst}"
    return worst


def assert_grads(model: torch.nn.Module, packed_loss: torch.Tensor, ref_loss: torch.Tensor, how: str) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    torch.testing.assert_close(packed_loss, ref_loss, rtol=TOL, atol=TOL, msg=how)
    gp = torch.autograd.grad(packed_loss, params)
    gr = torch.autograd.grad(ref_loss, params, retain_graph=True)  # the reference serves two modes
    for (name, _), a, b in zip(model.named_parameters(), gp, gr, strict=True):
        torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m, name=name: f"{how} {name}: {m}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["pc", "text"])
def test_tiny_model_flattened_minibatch_and_padded_batch(document_stores, tiny_lm, kind, dtype):
    ds = DocumentDataset(document_stores[kind])
    idx = pick(ds)
    torch.manual_seed(0)
    model = tiny_lm(VOCAB).to(dtype)

    def run_alone(item):  # noqa: ANN001, ANN202
        n = item["input_ids"].numel()
        return model(item["input_ids"], item["position_ids"], item["cu_seqlens"], n)

    alone, ref_sum, n_target = reference(run_alone, ds, idx)
    ref_loss = ref_sum / n_target

    # padding-free: one row, global cu_seqlens (an empty document is a zero-length segment)
    flat = PackedCollator(flatten=True)(ds.__getitems__(idx))
    logits = model(flat["input_ids"][0], flat["position_ids"][0], flat["cu_seqlens"], flat["max_seqlen"])
    cu = flat["cu_seqlens"].tolist()
    assert_same([logits[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)], alone, f"tiny {kind} {dtype} flattened")
    assert flat["n_target_tokens"] == n_target
    loss = packed_cross_entropy(logits, flat["labels"], flat["cu_seqlens"], "token")
    assert_grads(model, loss, ref_loss, "flattened")

    # padded [B, L]: every row is one causal sequence; padding sits after the real tokens
    padded = PaddedCollator(pad_id=ds.pad_id, round_to=8)(ds.__getitems__(idx))
    b, width = padded["input_ids"].shape
    rows_cu = torch.arange(0, (b + 1) * width, width, dtype=torch.int32)
    logits = model(padded["input_ids"].reshape(-1), padded["position_ids"].reshape(-1), rows_cu, width).view(b, width, -1)
    lens = padded["lengths"].tolist()
    assert_same([logits[r, :n] for r, n in enumerate(lens)], alone, f"tiny {kind} {dtype} padded")
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), padded["labels"][:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum") / padded["n_target_tokens"]
    assert_grads(model, loss, ref_loss, "padded")


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")

    def packtool_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):  # noqa: ANN001, ANN202
        """transformers' AttentionInterface -> varlen_attention with the collator's kwargs."""
        q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))
        return varlen_attention(q, k, v, kwargs["cu_seq_lens_q"], kwargs["max_length_q"], softmax_scale=scaling)[None], None

    transformers.AttentionInterface.register("packtool_varlen", packtool_attention)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                                      attn_implementation="sdpa")
    return transformers, config


@pytest.mark.parametrize("dtype", DTYPES)
def test_llama_flattened_minibatch_and_padded_batch(document_stores, llama, dtype):
    transformers, config = llama
    ds = DocumentDataset(document_stores["pc"])
    idx = pick(ds)[:-1]  # the pc store has no empty document
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    model.set_attn_implementation("sdpa")
    alone, ref_sum, n_target = reference(lambda item: model(input_ids=item["input_ids"][None]).logits[0], ds, idx)
    ref_loss = ref_sum / n_target

    flat = PackedCollator(flatten=True)(ds.__getitems__(idx))
    cu = flat["cu_seqlens"].tolist()
    split = lambda lg: [lg[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]  # noqa: E731
    # sdpa with packed position_ids (transformers derives the block mask), then varlen kwargs
    logits = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"]).logits[0]
    assert_same(split(logits), alone, f"llama {dtype} flattened sdpa")
    model.set_attn_implementation("packtool_varlen")
    kwargs = {k: flat[k] for k in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")}
    logits = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"], **kwargs).logits[0]
    assert_same(split(logits), alone, f"llama {dtype} flattened varlen")
    assert_grads(model, packed_cross_entropy(logits, flat["labels"], flat["cu_seqlens"], "token"), ref_loss, "llama flat")

    model.set_attn_implementation("sdpa")
    padded = PaddedCollator(pad_id=ds.pad_id, round_to=8)(ds.__getitems__(idx))
    out = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"],
                position_ids=padded["position_ids"], labels=None).logits
    assert_same([out[r, :n] for r, n in enumerate(padded["lengths"].tolist())], alone, f"llama {dtype} padded")
    loss = F.cross_entropy(out[:, :-1].reshape(-1, VOCAB), padded["labels"][:, 1:].reshape(-1), ignore_index=-100,
                           reduction="sum") / padded["n_target_tokens"]
    assert_grads(model, loss, ref_loss, "llama padded")
