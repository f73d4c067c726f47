"""`packtool.loss.pair_scores` on packed preference batches equals each sequence run alone through its
`*ForSequenceClassification` model (whose own pooling reads the rightmost token that is not `pad_token_id`).

Tiny random Llama, Qwen3 (sliding window 4) and Gemma 2 (softcapping, sliding window) with `num_labels=1`,
float64. The reference runs each sequence alone under eager; the packed batch (both layouts, a padding tail)
runs `model.score(model.model(**batch).last_hidden_state)` under attn_implementation="packtool". Rewards and
every parameter gradient of TRL's reward loss must match within 1e-6, including a sequence that ends with the
pad id (TRL's pad = EOS case: both read the token before it) and an empty shared completion (its prompt's last
token).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402,F401
from packtool.errors import ConfigError, FormatError  # noqa: E402
from packtool.loss import pair_scores, reward_loss  # noqa: E402
from tests.pair_support import batch, make_pairs  # noqa: E402

VOCAB = 96
PAD = 2  # the EOS id: TRL's pad token when the tokenizer has none
RTOL = 1e-6
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": PAD,
         "bos_token_id": 1, "eos_token_id": 2, "num_labels": 1}  # fmt: skip
CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(**SMALL, num_hidden_layers=2),
    "qwen3": lambda: transformers.Qwen3Config(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                              max_window_layers=1, layer_types=["sliding_attention", "full_attention"]),
    "gemma2": lambda: transformers.Gemma2Config(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                                attn_logit_softcapping=0.5, final_logit_softcapping=None,
                                                layer_types=["sliding_attention", "full_attention"]),
}  # fmt: skip
MODEL_KEYS = ("input_ids", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k",
              "prefix_segment")  # fmt: skip


def build(name: str, attn: str):
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(CONFIGS[name](), attn_implementation=attn)
    return model.to(torch.float64).eval()


def grads(model) -> list[torch.Tensor]:
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max().detach() / want.abs().max().clamp(min=1e-30).detach())


def alone(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([prompt + completion]), use_cache=False).logits.reshape(())


def per_token(model, b: dict) -> torch.Tensor:
    hidden = model.model(**{k: b[k] for k in MODEL_KEYS if k in b}, use_cache=False).last_hidden_state
    return model.score(hidden)  # [1, T, 1]


def pairs_for_test(shared: bool) -> list[tuple[list[int], list[int], list[int]]]:
    pairs = make_pairs(3, 4, VOCAB)
    pairs[1] = (pairs[1][0], pairs[1][1] + [PAD], pairs[1][2] + [PAD, PAD])  # ends with EOS = pad: read before it
    pairs[2] = (pairs[2][0], pairs[2][1], list(pairs[2][1]))  # identical chosen and rejected
    if shared:
        pairs[3] = (pairs[3][0], pairs[3][1], [])  # an empty completion: its prompt's last token
    return pairs


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_pair_scores_equal_each_sequence_alone_with_gradients(name: str, shared: bool) -> None:
    pairs = pairs_for_test(shared)
    ref = build(name, "eager")
    want_c = torch.stack([alone(ref, p, c) for p, c, _ in pairs])
    want_r = torch.stack([alone(ref, p, r) for p, _, r in pairs])
    margin = torch.tensor([0.5, -0.25, 0.0, 1.0], dtype=torch.float64)
    want_loss = -torch.nn.functional.logsigmoid(want_c - want_r - margin).mean() + 0.01 * ((want_c + want_r) ** 2).mean()
    want_loss.backward()
    want_g = grads(ref)

    model = build(name, "packtool")
    model.load_state_dict(ref.state_dict())
    b = batch(pairs, shared, pad=3, first_pair=5)
    got = pair_scores(per_token(model, b), b, pad_token_id=PAD)
    assert got.pair_ids.tolist() == [5, 6, 7, 8]
    assert got.chosen_tokens.tolist() == [len(p) + len(c) for p, c, _ in pairs]
    assert got.rejected_tokens.tolist() == [len(p) + len(r) for p, _, r in pairs]
    assert rel(got.chosen, want_c) < RTOL and rel(got.rejected, want_r) < RTOL
    loss = reward_loss(got, margin=margin, center_rewards_coefficient=0.01)
    assert abs(loss.item() - want_loss.item()) <= RTOL * abs(want_loss.item())
    loss.backward()
    for g, w in zip(grads(model), want_g, strict=True):
        assert rel(g, w) < RTOL


def test_positions_read_the_last_token_or_the_rightmost_non_pad() -> None:
    pairs = [([5, 6, 7], [8, 9], [10, PAD]), ([11, 12], [13, PAD, PAD], [14])]
    for shared in (False, True):
        b = batch(pairs, shared, pad=2)
        scores = torch.arange(b["input_ids"].shape[1], dtype=torch.float64)[None]  # score = the row position
        last = pair_scores(scores, b)
        cu = b["cu_seq_lens_q"].tolist()
        ends = [cu[i + 1] - 1 for i in range(len(cu) - 1)]
        chosen_seg, rejected_seg = ((1, 4), (2, 5)) if shared else ((0, 2), (1, 3))
        assert last.chosen_position.tolist() == [ends[s] for s in chosen_seg]
        assert last.rejected_position.tolist() == [ends[s] for s in rejected_seg]
        assert torch.equal(last.chosen, last.chosen_position.double())
        non_pad = pair_scores(scores[..., None], b, pad_token_id=PAD)
        assert non_pad.chosen_position.tolist() == [ends[chosen_seg[0]], ends[chosen_seg[1]] - 2]
        assert non_pad.rejected_position.tolist() == [ends[rejected_seg[0]] - 1, ends[rejected_seg[1]]]


def test_an_all_pad_sequence_reads_its_first_token_as_the_model_pools() -> None:
    """`(arange * non_pad).argmax()` is 0 when every token is the pad id: the sequence's first token."""
    torch.manual_seed(0)
    cfg = CONFIGS["llama"]()
    model = transformers.AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager").double()
    model.eval()
    pairs = [([PAD, PAD], [PAD], [7, 8])]
    for shared in (False, True):
        b = batch(pairs, shared, pad=0)
        got = pair_scores(torch.arange(b["input_ids"].shape[1], dtype=torch.float64)[None], b, pad_token_id=PAD)
        assert got.chosen_position.tolist() == [0]
        seq = torch.tensor([[PAD, PAD, PAD]])
        with torch.no_grad():
            full = model.score(model.model(input_ids=seq).last_hidden_state)[0, :, 0]
            assert float(model(input_ids=seq).logits) == float(full[0])  # the model's own pooling: position 0


def test_a_repeated_pair_is_two_entries_in_order_of_first_appearance() -> None:
    pairs = [([5, 6], [7], [8]), ([9], [10], [11, 12])]
    b1, b2 = batch(pairs, False, pad=0, first_pair=4), batch(pairs[:1], False, pad=1, first_pair=4)
    cat = {k: torch.cat([b1[k], b2[k]], dim=-1) for k in ("input_ids", "pair_ids", "chosen")}
    t1 = b1["input_ids"].shape[1]
    cat["cu_seqlens"] = torch.cat([b1["cu_seq_lens_q"], b2["cu_seq_lens_q"][1:] + t1])
    got = pair_scores(torch.arange(cat["input_ids"].shape[1], dtype=torch.float64), cat)
    assert got.pair_ids.tolist() == [4, 5, 4]
    assert got.chosen.tolist() == [2.0, 7.0, 13.0] and got.rejected.tolist() == [5.0, 10.0, 16.0]


def test_refusals_name_what_is_wrong() -> None:
    pairs = [([5, 6, 7], [8, 9], [10])]
    b = batch(pairs, False, pad=2)
    t = b["input_ids"].shape[1]
    with pytest.raises(ConfigError, match=r"not one score per token.*\[1, T\] or \[1, T, 1\]"):
        pair_scores(torch.zeros(1, t, 2), b)
    with pytest.raises(ConfigError, match="not one score per token"):
        pair_scores(torch.zeros(1, t - 1), b)
    with pytest.raises(ConfigError, match="neither cu_seqlens nor cu_seq_lens_q, pair_scores"):
        pair_scores(torch.zeros(1, t), {k: v for k, v in b.items() if not k.startswith("cu_")})
    with pytest.raises(ConfigError, match="has no 'chosen', pair_scores"):
        pair_scores(torch.zeros(1, t), {k: v for k, v in b.items() if k != "chosen"})
    with pytest.raises(ConfigError, match="pad_token_id without the batch's input_ids"):
        pair_scores(torch.zeros(1, t), {k: v for k, v in b.items() if k != "input_ids"}, pad_token_id=0)
    lonely = dict(b, chosen=torch.tensor([True, True, False]))
    with pytest.raises(FormatError, match=r"pairs \[0, 0\] do not have exactly one chosen and one rejected.*pair_scores"):
        pair_scores(torch.zeros(1, t), lonely)
    empty = batch([([], [], [10])], False, pad=0)
    with pytest.raises(FormatError, match=r"pairs \[0\] hold an empty sequence"):
        pair_scores(torch.zeros(1, 1), empty)
    with pytest.raises(ConfigError, match="margin holds 2 values for 1 pairs"):
        reward_loss(pair_scores(torch.zeros(1, t), b), margin=torch.zeros(2))


def test_an_unflattened_batch_and_an_empty_one() -> None:
    pairs = [([5, 6], [7], [8, 9]), ([10], [11, 12], [13])]
    b = batch(pairs, False, pad=4)
    t = b["input_ids"].shape[1]  # 3 + 4 + 3 + 2 + 4 = 16 tokens: two rows of 8
    flat = pair_scores(torch.arange(t, dtype=torch.float64)[None], b)
    rows = pair_scores(torch.arange(t, dtype=torch.float64).reshape(2, 8, 1), b)
    assert torch.equal(rows.chosen, flat.chosen) and torch.equal(rows.rejected, flat.rejected)
    with pytest.raises(ConfigError, match=r"scores \(1, 8, 2\) are not one score per token"):
        pair_scores(torch.zeros(1, 8, 2), b)  # num_labels=2 over half the tokens: refused, not misread
    only_pad = batch([], False, pad=4)
    empty = pair_scores(torch.zeros(1, 4), only_pad)
    assert empty.pair_ids.numel() == 0
    with pytest.raises(ConfigError, match="no pairs to score"):
        reward_loss(empty)


def padded_to(b: dict, multiple: int) -> dict:
    """`b` as a `--pad-multiple` store lays it out: each segment padded to a multiple with pad tokens (id 0,
    labels -100, positions running on), and `cu_seqlens_unpadded` holding the real lengths."""
    cu = b["cu_seq_lens_q"].tolist()
    ids, labels, pos, new_cu = [], [], [], [0]
    for a, z in zip(cu[:-1], cu[1:], strict=True):
        extra = -(z - a) % multiple
        ids += b["input_ids"][0, a:z].tolist() + [0] * extra
        labels += b["labels"][0, a:z].tolist() + [-100] * extra
        start = int(b["position_ids"][0, a]) if z > a else 0
        pos += list(range(start, start + z - a + extra))
        new_cu.append(new_cu[-1] + z - a + extra)
    out = dict(b, input_ids=torch.tensor([ids]), labels=torch.tensor([labels]), position_ids=torch.tensor([pos]))
    out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = torch.tensor(new_cu, dtype=torch.int32)
    out["cu_seqlens_unpadded"] = b["cu_seq_lens_q"]
    return out


@pytest.mark.parametrize("shared", [False, True], ids=["pairs", "shared_prompt"])
def test_pad_multiple_padding_inside_segments_is_never_read(shared: bool) -> None:
    """A `--pad-multiple` store pads each segment with pad tokens: the last token of the segment is padding, and
    the sequence's score (and its token count, TRL's num_tokens) must come from its real tokens."""
    pairs = [([5, 6, 7], [8, 9], [10]), ([11], [12, 13, 14], [15, 16])]
    b = batch(pairs, shared, pad=2)
    p = padded_to(b, 4)
    assert p["input_ids"].shape[1] > b["input_ids"].shape[1]
    # scores: a token's position in the UNPADDED row, -1 on padding: the picked values must be the unpadded ones
    mapping = torch.full((p["input_ids"].shape[1],), -1.0, dtype=torch.float64)
    cu, cu_real = p["cu_seq_lens_q"].tolist(), b["cu_seq_lens_q"].tolist()
    for s in range(len(cu) - 1):
        n_real = cu_real[s + 1] - cu_real[s]
        mapping[cu[s] : cu[s] + n_real] = torch.arange(cu_real[s], cu_real[s] + n_real, dtype=torch.float64)
    want = pair_scores(torch.arange(b["input_ids"].shape[1], dtype=torch.float64), b)
    for key in ("cu_seqlens_unpadded", "cu_seqlens_q"):
        q = {k: v for k, v in p.items() if k != "cu_seqlens_unpadded"}
        q[key] = p["cu_seqlens_unpadded"]
        got = pair_scores(mapping[None], q)
        assert torch.equal(got.chosen, want.chosen) and torch.equal(got.rejected, want.rejected), key
        assert torch.equal(got.chosen_tokens, want.chosen_tokens) and torch.equal(got.rejected_tokens, want.rejected_tokens)
        with_pad = pair_scores(mapping[None], q, pad_token_id=0)
        assert torch.equal(with_pad.chosen, want.chosen)
    bare = {k: v for k, v in p.items() if k != "cu_seqlens_unpadded"}
    with pytest.raises(FormatError, match="ends on an unlabelled token and the batch has no cu_seqlens_unpadded"):
        pair_scores(mapping[None], bare)
    with pytest.raises(FormatError, match="does not fit cu_seqlens"):
        pair_scores(mapping[None], dict(p, cu_seqlens_unpadded=p["cu_seq_lens_q"][:-1]))
