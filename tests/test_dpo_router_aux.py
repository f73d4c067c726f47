"""A packed preference row seen as TRL's padded DPO batch (`packtool.hf.dpo_view`), and the router
load-balancing loss of a mixture-of-experts model over it (`packtool.hf.router_aux`), without TRL.

The padded batch (chosen rows then rejected, right-padded, its `attention_mask`) is what TRL 1.16's
DPOTrainer runs; its `aux_loss` is the reference. The packed row (`[P+C][P+R]` or `[P][C][R]`, plus a
padding tail) runs under attn_implementation="packtool", and `router_aux_loss` with the view's
`token_weight` must give the same loss and gradients (float64 model; transformers' function accumulates in
float32, hence 1e-6). The row's own `aux_loss` (no mask) is off by 1e-4..1e-2 on every family here.
Every MoE family of transformers whose layers are attention plus experts is checked (the slow ones with
`-m slow`); those that mix packed sequences outside attention (Jamba, MiniMax, GraniteMoeHybrid: Mamba or
linear attention) are no packing candidates at all, and the Gated-DeltaNet ones refuse packed rows themselves.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402,F401
from packtool.audit.tiny import tiny_config_dict  # noqa: E402
from packtool.errors import ConfigError  # noqa: E402
from packtool.hf.dpo_view import MODEL_KEYS, PaddedView  # noqa: E402
from packtool.hf.router_aux import router_aux_loss  # noqa: E402
from tests.pair_support import IGNORE, batch, make_pairs  # noqa: E402

FAST = ["mixtral", "qwen3_moe", "gpt_oss"]
SLOW = ["olmoe", "qwen2_moe", "dbrx", "ernie4_5_moe", "flex_olmo", "flint", "granitemoe", "granitemoe_swa",
        "granitemoeshared", "jetmoe", "laguna", "mellum", "minimax_m2", "minimax_m3_vl_text", "phimoe"]  # fmt: skip
#: families whose eager attention gives NaN on right padding under a window: their padded run uses "packtool"
PADDED_ATTN = {"granitemoe_swa": "packtool"}
#: config fields the family's default leaves unusable (scripts/check_hf_families.py's FIXES)
FIXES = {"dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}}}


def tiny_moe(model_type: str):
    config = transformers.AutoConfig.for_model(model_type)
    config = config.get_text_config(decoder=True)
    small, _ = tiny_config_dict({**config.to_dict(), **FIXES.get(model_type, {})}, dict(getattr(type(config), "attribute_map", {}) or {}))
    small.pop("use_cache", None)
    tiny = type(config).from_dict(small)
    tiny.use_cache = False
    tiny.output_router_logits = False
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(
        tiny, attn_implementation=PADDED_ATTN.get(model_type, "eager"), dtype=torch.float64,
        experts_implementation="eager",
    ).eval()  # fmt: skip


def grads(model, loss) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, got, strict=True)]


def packed_batch(pairs, shared: bool, pad: int = 3) -> dict:
    b = batch(pairs, shared, pad=pad)
    b["cu_seqlens"] = b["cu_seq_lens_q"]
    return b


def padded_aux(model, pairs) -> torch.Tensor:
    """TRL's padded DPO batch: [P+C] rows, then [P+R] rows, right-padded, with its attention_mask."""
    seqs = [p + c for p, c, _ in pairs] + [p + r for p, _, r in pairs]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    return model(input_ids=ids, attention_mask=mask, output_router_logits=True, use_cache=False).aux_loss


def check_family(model_type: str) -> None:
    model = tiny_moe(model_type)
    pairs = make_pairs(0, 3, model.config.vocab_size, prompt=(3, 6), completion=(2, 5))
    want = padded_aux(model, pairs)
    want_g = grads(model, want)
    model.set_attn_implementation("packtool")
    for shared in (False, True):
        b = packed_batch(pairs, shared)
        out = model(**{k: b[k] for k in MODEL_KEYS if k in b}, output_router_logits=True, use_cache=False)
        got = router_aux_loss(model, out, PaddedView(b).token_weight)
        assert abs(float(got) - float(want)) <= 1e-6 * abs(float(want)), (model_type, shared, float(got), float(want))
        for g, w in zip(grads(model, got), want_g, strict=True):
            assert float((g - w).abs().max()) <= 1e-6 * max(float(w.abs().max()), 1e-12), (model_type, shared)
        assert abs(float(out.aux_loss) - float(want)) > 1e-5 * abs(float(want))  # the row's own loss is another


@pytest.mark.parametrize("model_type", FAST)
def test_router_aux_loss_of_a_packed_row_equals_the_padded_batch(model_type: str) -> None:
    check_family(model_type)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", SLOW)
def test_router_aux_loss_of_every_moe_family_equals_the_padded_batch(model_type: str) -> None:
    check_family(model_type)


def test_a_model_whose_aux_loss_is_not_its_modules_function_is_refused() -> None:
    model = tiny_moe("mixtral")
    model.set_attn_implementation("packtool")
    b = packed_batch(make_pairs(0, 2, model.config.vocab_size), False)
    out = model(**{k: b[k] for k in MODEL_KEYS if k in b}, output_router_logits=True, use_cache=False)
    weight = PaddedView(b).token_weight
    out.aux_loss = out.aux_loss * 1.5  # another loss than load_balancing_loss_func's
    with pytest.raises(ConfigError, match="router_aux_loss_coef=0.0"):
        router_aux_loss(model, out, weight)
    out.router_logits = None
    with pytest.raises(ConfigError, match="returned no router_logits"):
        router_aux_loss(model, out, weight)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=16,
                                                                   num_hidden_layers=1, num_attention_heads=2))  # fmt: skip
    out.router_logits = (torch.zeros(weight.numel(), 4),)
    with pytest.raises(ConfigError, match="no load_balancing_loss_func"):
        router_aux_loss(llama, out, weight)


def pad_multiple(b: dict, m: int) -> dict:
    """`b` (pairs layout) with every pair segment padded to a multiple of m, as `pack --pad-multiple m` stores it
    (pad ids, no labels, positions running on), and `cu_seqlens_unpadded` (the loader's)."""
    cu = b["cu_seqlens"].tolist()
    ids, labels, pos, real, lens = [], [], [], [], []
    for s in range(len(cu) - 1):
        a, e = cu[s], cu[s + 1]
        n = e - a
        extra = (-n) % m if int(b["pair_ids"][s]) >= 0 else 0
        ids += b["input_ids"][0, a:e].tolist() + [0] * extra
        labels += b["labels"][0, a:e].tolist() + [IGNORE] * extra
        pos += b["position_ids"][0, a:e].tolist() + list(range(n, n + extra))
        lens.append(n + extra)
        real.append(n)
    out = dict(b)
    cum = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    out.update(input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), position_ids=torch.tensor([pos]),
               cu_seqlens=cum, cu_seq_lens_q=cum, cu_seq_lens_k=cum, max_length_q=max(lens), max_length_k=max(lens),
               cu_seqlens_unpadded=torch.tensor([0, *torch.tensor(real).cumsum(0).tolist()], dtype=torch.int32))  # fmt: skip
    return out


def test_the_padded_view_counts_tokens_as_trl_does() -> None:
    """FIXED (num_tokens): the view's attention_mask (TRL counts its sum) held the --pad-multiple padding inside
    segments; a shared prompt is held by two rows, the padding tail by none."""
    pairs = make_pairs(1, 3, 50)
    trl_tokens = sum(2 * len(p) + len(c) + len(r) for p, c, r in pairs)
    plain = PaddedView(packed_batch(pairs, False))
    shared = PaddedView(packed_batch(pairs, True))
    padded = PaddedView(pad_multiple(packed_batch(pairs, False), 8))
    for view in (plain, shared, padded):
        assert int(view.attention_mask.sum()) == trl_tokens
        assert int(view.token_weight.sum()) == trl_tokens
        assert torch.equal(view.completion_mask, plain.completion_mask)
        assert torch.equal(view.attention_mask, plain.attention_mask)
    first_prompt = len(pairs[0][0])
    assert shared.token_weight[:first_prompt].tolist() == [2] * first_prompt
    assert plain.token_weight[-3:].tolist() == [0, 0, 0]  # the padding tail
    no_key = pad_multiple(packed_batch(pairs, False), 8)
    del no_key["cu_seqlens_unpadded"]
    with pytest.raises(ConfigError, match="cu_seqlens_unpadded"):
        PaddedView(no_key)


def test_a_subclass_made_by_a_wrapper_finds_the_familys_function() -> None:
    """FSDP2's `fully_shard` swaps the model's class for `FSDP<Name>` defined in torch: the family's
    `load_balancing_loss_func` is found through the class's bases."""
    model = tiny_moe("mixtral")
    model.set_attn_implementation("packtool")
    b = packed_batch(make_pairs(0, 2, model.config.vocab_size), True)
    out = model(**{k: b[k] for k in MODEL_KEYS if k in b}, output_router_logits=True, use_cache=False)
    want = router_aux_loss(model, out, PaddedView(b).token_weight)
    model.__class__ = type(f"FSDP{type(model).__name__}", (type(model),), {"__module__": "torch.nn"})
    assert torch.equal(router_aux_loss(model, out, PaddedView(b).token_weight), want)
