"""A second hostile pass over `attn_implementation="packtool"`: cases the collator sweep (test_hf_combinations.py)
does not hold.

Float64, tiny models from transformers' own config classes, each document run alone under eager as the
reference (logits within 1e-6 x their largest value):
- a KV cache filled by a packed forward (a row of several documents), then continued (`model(next, past_key_values=
  cache)`, or `generate` on a packed prompt): the cache holds every document of the row, so the continued one
  would attend to the others (eager does, silently). Refused by name; `generate(use_cache=False)` on the packed
  prompt is each document alone, and a fresh prefill after it runs again;
- an encoder-decoder (Bart): its cross-attention was read as queries after a cache; refused by name;
- windowed families the collator sweep's fast families do not include (Gemma 3's own mask functions, Qwen2 with `max_window_layers`,
  Cohere2, OLMo 3) and MLA (DeepSeek-V3: values narrower than queries) under `cu_seq_lens` without
  `position_ids`, with int64 / 2-D offsets, `max_length` as a tensor, int32 positions, bool/float masks;
- `generate` on a left-padded batch with sinks (gpt-oss) and softcapping (Gemma 2), dynamic and static caches.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_support import build, documents  # noqa: E402

import packtool.hf  # noqa: E402, F401
from packtool.errors import ConfigError  # noqa: E402

RTOL = 1e-6


def flat(docs):
    ids = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    cu = torch.tensor(np.concatenate([[0], np.cumsum([len(d) for d in docs])]), dtype=torch.int32)
    return ids, pos, cu


@pytest.mark.parametrize("name", ["llama", "mistral", "gpt_oss"])
def test_continuing_a_kv_cache_filled_by_a_packed_forward_is_refused(name: str) -> None:
    """The continued document would attend to every other document of its row (eager does: 1e-2 .. 1e-1 off
    the document alone); packtool ran it silently. Refused, through a hand-driven cache and through generate."""
    model = build(name, attn="packtool")
    docs = documents()
    ids, pos, cu = flat(docs)
    nxt, at = torch.tensor([[5]]), torch.tensor([[len(docs[-1])]])
    for keys in ({"position_ids": pos}, {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu}):
        cache = transformers.DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True, **keys)  # the packed forward itself is exact
            with pytest.raises(ConfigError, match=r"1 query after a KV cache filled by a packed forward .*packtool.hf"):
                model(input_ids=nxt, past_key_values=cache, use_cache=True, position_ids=at)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with pytest.raises(ConfigError, match=r"after a KV cache filled by a packed forward"):
        model.generate(input_ids=ids, position_ids=pos, max_new_tokens=3, do_sample=False)
    # the refusal's advice: use_cache=False re-reads the packed prompt every step, each document alone
    opts = {"max_new_tokens": 3, "do_sample": False, "output_logits": True, "return_dict_in_generate": True}
    packed = model.generate(input_ids=ids, position_ids=pos, use_cache=False, **opts)
    # a prefill of one document per row after it is read again: generation right, as under eager
    got = model.generate(input_ids=docs[-1][None], **opts)
    model.set_attn_implementation("eager")
    want = model.generate(input_ids=docs[-1][None], **opts)
    assert torch.equal(got.sequences, want.sequences) and torch.equal(packed.sequences[0, -3:], want.sequences[0, -3:])
    for a, b, c in zip(packed.logits, got.logits, want.logits, strict=True):
        torch.testing.assert_close(a, c, rtol=RTOL, atol=RTOL * float(c.abs().max()))
        torch.testing.assert_close(b, c, rtol=RTOL, atol=RTOL * float(c.abs().max()))


MORE = ("gemma3", "qwen2", "cohere2", "olmo3", "deepseek_v3")  # hf_support.config: beyond the collator sweep


@pytest.mark.parametrize("name", MORE)
def test_more_windowed_families_and_mla_pack_exactly_from_every_key_spelling(name: str) -> None:
    model = build(name)
    docs = documents()
    with torch.no_grad():
        ref = [model(input_ids=d[None]).logits[0] for d in docs]
    want = torch.cat(ref)
    scale = float(want.abs().max())
    ids, pos, cu = flat(docs)
    ones = torch.ones_like(ids)
    spellings = {
        "cu_seq_lens, no position_ids": {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu},
        "cu_seq_lens int64, 2-D, max_length tensors": {"cu_seq_lens_q": cu.long()[None], "cu_seq_lens_k": cu.long()[None],
                                                       "max_length_q": torch.tensor(11), "max_length_k": torch.tensor(11)},
        "cu_seq_lens_q alone + a bool all-ones mask": {"cu_seq_lens_q": cu, "attention_mask": ones.bool()},
        "int32 position_ids + a float all-ones mask": {"position_ids": pos.int(), "attention_mask": ones.double()},
        "position_ids": {"position_ids": pos},
    }  # fmt: skip
    model.set_attn_implementation("packtool")
    for label, keys in spellings.items():
        for use_cache in (False, True):
            with torch.no_grad():
                got = model(input_ids=ids, use_cache=use_cache, **keys).logits[0]
            worst = float((got - want).abs().max())
            assert worst <= RTOL * scale, f"{name} {label} use_cache={use_cache}: {worst:.2e}"


@pytest.mark.parametrize("name", ["gpt_oss", "gemma2"])
def test_generate_left_padded_with_sinks_or_softcapping_equals_each_prompt_alone(name: str) -> None:
    docs = documents(1)[:3]
    model = build(name)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    opts = {"max_new_tokens": 5, "do_sample": False, "return_dict_in_generate": True, "output_logits": True}
    want = [model.generate(input_ids=d[None], **opts) for d in docs]
    model.set_attn_implementation("packtool")
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, width - len(d) :], mask[i, width - len(d) :] = d, 1
    for cache in ("dynamic", "static"):
        got = model.generate(input_ids=ids, attention_mask=mask.bool(), cache_implementation=cache, **opts)
        for i, w in enumerate(want):
            assert torch.equal(got.sequences[i, width:], w.sequences[0, len(docs[i]) :]), (name, cache, i)
            for a, b in zip(got.logits, w.logits, strict=True):
                torch.testing.assert_close(a[i], b[0], rtol=RTOL, atol=RTOL * float(b.abs().max()))


def test_an_encoder_decoder_is_refused_not_run_with_its_cross_attention_misread() -> None:
    """Bart under "packtool": the cross-attention call (decoder queries, encoder keys) was read as queries after a
    KV cache, its queries taken from the encoder's padding mask: decoder logits 1e-3 off eager, silently."""
    config = transformers.BartConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32,
                                     decoder_ffn_dim=32, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation="packtool",
                                                           dtype=torch.float64).eval()  # fmt: skip
    docs = documents()[:2]
    ids = torch.zeros(2, 9, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, : len(d)], mask[i, : len(d)] = d, 1
    for keys in ({"attention_mask": mask}, {}):
        with pytest.raises(ConfigError, match=r"an encoder-decoder model \(BartConfig.*cannot run as "
                                              r"attn_implementation='packtool'"):  # fmt: skip
            model(input_ids=ids, decoder_input_ids=ids[:, :5], **keys)


@pytest.mark.parametrize("name", ["llama", "gpt_oss"])
def test_packed_documents_after_a_cache_are_refused_and_a_continued_chunk_is_exact(name: str) -> None:
    """Queries after a KV cache are one sequence per row: a packed batch after a prefix in the cache (PEFT's prefix
    tuning keeps one there) and a packed prompt prefilled in chunks (`prefill_chunk_size`) ran as one sequence,
    every document attending to the others and to the cache. Refused where position_ids restart inside the
    queries; a left-padded second turn (positions continuing each row) stays exact."""
    model = build(name, attn="packtool")
    docs = documents()
    ids, pos, _ = flat(docs)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([[7, 8, 9]]), past_key_values=cache, use_cache=True)
        continued = pos.clone()
        continued[0, : len(docs[0])] += 3  # the first document continues the cached prefix, the next ones restart
        with pytest.raises(ConfigError, match=r"position_ids start a new document at row 0, token 9 of 32 queries "
                                              r"after a KV cache of 35 keys.*packtool.hf"):  # fmt: skip
            model(input_ids=ids, position_ids=continued, past_key_values=cache, use_cache=True)
        with pytest.raises(ConfigError, match=r"row 0, token 0 of 32 queries \(position 0\) after a KV cache"):
            model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with pytest.raises(ConfigError, match=r"position_ids start a new document at row 0, token 1 of 8 queries"):
        model.generate(input_ids=ids, position_ids=pos, max_new_tokens=2, prefill_chunk_size=8)
    # two turns of two left-padded rows: the second turn after the cache, each row one sequence
    first, second = docs[2], docs[0]
    turn1 = torch.zeros(2, 6, dtype=torch.long)
    mask1 = torch.zeros_like(turn1)
    turn1[0], mask1[0] = first[:6], 1
    turn1[1, 2:], mask1[1, 2:] = second[:4], 1
    turn2 = torch.stack([first[6:11], second[4:9]])
    mask2 = torch.cat([mask1, torch.ones(2, 5, dtype=torch.long)], 1)
    pos1 = (mask1.cumsum(-1) - 1).clamp(min=0)
    pos2 = pos1[:, -1:] + 1 + torch.arange(5)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        a = model(input_ids=turn1, attention_mask=mask1, position_ids=pos1, past_key_values=cache, use_cache=True)
        b = model(input_ids=turn2, attention_mask=mask2, position_ids=pos2, past_key_values=cache, use_cache=True)
        got = [torch.cat([a.logits[0], b.logits[0]]), torch.cat([a.logits[1, 2:], b.logits[1]])]
        model.set_attn_implementation("eager")
        want = [model(input_ids=first[None]).logits[0], model(input_ids=second[None]).logits[0]]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=RTOL * float(w.abs().max()))


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_a_document_starting_on_a_chunk_start_after_a_cache_is_refused(name: str) -> None:
    """A packed prompt prefilled in chunks whose chunk starts on a document's first token (its position 0): no
    restart inside the chunk, so the refusal above missed it, and the document attended to the cache's documents
    (off the document alone, silently). The same for a document after a prefix cache. A row whose cache holds
    only padding (left padding in chunked prefill) still runs."""
    model = build(name, attn="packtool")
    docs = documents()
    first, second = docs[0], docs[1]
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=first[None], past_key_values=cache, use_cache=True)
        with pytest.raises(ConfigError, match=rf"position_ids start a new document at row 0, token 0 of "
                                              rf"{len(second)} queries \(position 0\) after a KV cache of "
                                              r"\d+ keys holding [1-9]"):  # fmt: skip (a sliding cache keeps fewer)
            model(input_ids=second[None], position_ids=torch.arange(len(second))[None], past_key_values=cache,
                  use_cache=True)  # fmt: skip
    ids, pos, _ = flat([first, second])
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with pytest.raises(ConfigError, match=r"position_ids start a new document at row 0, token 0 of"):
        model.generate(input_ids=ids, position_ids=pos, max_new_tokens=2, prefill_chunk_size=len(first))
    # a left-padded row whose first chunk is all padding: position 0 after a cache of padding only, exact
    n = len(second)
    row = torch.cat([torch.zeros(4, dtype=torch.long), second])[None]
    mask = torch.cat([torch.zeros(4, dtype=torch.long), torch.ones(n, dtype=torch.long)])[None]
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=row[:, :4], attention_mask=mask[:, :4], position_ids=pos[:, :4], past_key_values=cache,
              use_cache=True)  # fmt: skip
        got = model(input_ids=row[:, 4:], attention_mask=mask, position_ids=pos[:, 4:], past_key_values=cache,
                    use_cache=True).logits[0]  # fmt: skip
        model.set_attn_implementation("eager")
        want = model(input_ids=second[None]).logits[0]
    torch.testing.assert_close(got, want, rtol=0, atol=RTOL * float(want.abs().max()))
