"""`attn_implementation="packtool"` (`import packtool.hf`) on real transformers families, CPU, float64.

Each family is built from transformers' own config class, tiny, with the feature that makes it
hard kept and made to bite: Mistral's sliding window (4) shorter than the documents (5-11 tokens),
Qwen3 with sliding-window layers, Gemma 3's local + global layers, Gemma 2's logit softcapping
(0.5, so it changes the scores), gpt-oss's sinks + sliding layers (eager experts), Llama 4's
chunked attention (chunks of 4), GPTBigCode (its layers never see position_ids: packed documents
come from the mask), Qwen2-MoE and PhiMoE (windows of 4 declared in the mask only). The last
three were silently wrong before the family sweep (scripts/check_hf_families.py) found them. The same model
(same weights) runs each document alone under `eager`: that is the reference. Under "packtool"
the documents then run packed (restarting `position_ids` only, as TRL's padding_free passes;
`cu_seq_lens_*` as `PackedCollator(keys=HF_KEYS)` passes; two packed rows `[2, N]`), padded
(right and left, 2-D `attention_mask`) and plain (each alone; equal-length rows), and through
`model.generate` on a left-padded batch. Logits and every parameter gradient (of the summed
per-document losses) must equal the reference within 1e-6 x its largest |value|: eager computes
its softmax in float32 inside a float64 model (measured: 4e-8 on logits of size ~1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402
from packtool.errors import ConfigError  # noqa: E402
from packtool.hf.features import chunks_follow_documents  # noqa: E402
from packtool.loader import HF_KEYS, PackedCollator  # noqa: E402

LENGTHS = (9, 7, 11, 5)  # rows of two documents: 16 + 16
VOCAB = 96
RTOL = 1e-6
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}


def llama():
    return transformers.LlamaConfig(**SMALL, num_hidden_layers=2)


def qwen3():
    return transformers.Qwen3Config(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                    max_window_layers=1, layer_types=["sliding_attention", "full_attention"])


def mistral():
    return transformers.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=4)


def gemma3():
    return transformers.Gemma3TextConfig(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                         layer_types=["sliding_attention", "full_attention"])


def gemma2():
    return transformers.Gemma2Config(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                     attn_logit_softcapping=0.5, final_logit_softcapping=None,
                                     layer_types=["sliding_attention", "full_attention"])


def gpt_oss():
    small = {**SMALL, "intermediate_size": 16}
    return transformers.GptOssConfig(**small, num_hidden_layers=2, sliding_window=4, num_local_experts=4,
                                     num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"])


def llama4():
    """Chunked attention (chunks of 4 < the documents) in layer 0, a global no-RoPE layer 1, MoE in layer 1."""
    return transformers.Llama4TextConfig(**SMALL, intermediate_size_mlp=48, num_hidden_layers=2, attention_chunk_size=4,
                                         num_local_experts=2, interleave_moe_layer_step=2, no_rope_layers=[1, 0])


def gpt_bigcode():
    """Multi-query attention whose layers never see `position_ids`: packed documents come from the mask alone."""
    return transformers.GPTBigCodeConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                         multi_query=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def qwen2_moe():
    """A sliding layer whose window (4) is in the mask only: Qwen2-MoE never passes sliding_window to attention."""
    small = {k: v for k, v in SMALL.items() if k != "head_dim"}
    return transformers.Qwen2MoeConfig(**small, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                       max_window_layers=1, num_experts=4, num_experts_per_tok=2,
                                       moe_intermediate_size=16, shared_expert_intermediate_size=16)


def phimoe():
    """Every layer windowed (4) through the mask only, as Qwen2-MoE."""
    small = {k: v for k, v in SMALL.items() if k != "head_dim"}
    return transformers.PhimoeConfig(**small, num_hidden_layers=2, sliding_window=4, num_local_experts=4,
                                     num_experts_per_tok=2)


FAMILIES: dict[str, Callable[[], object]] = {"llama": llama, "qwen3": qwen3, "mistral": mistral, "gemma3": gemma3,
                                             "gemma2": gemma2, "gpt_oss": gpt_oss, "llama4": llama4,
                                             "gpt_bigcode": gpt_bigcode, "qwen2_moe": qwen2_moe, "phimoe": phimoe}


def build(name: str, attn: str = "eager", **overrides):
    config = FAMILIES[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch.float64,
                                                          experts_implementation="eager")
    return model.eval()


def documents(seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(3, VOCAB, n)) for n in LENGTHS]


def doc_loss(logits: torch.Tensor, doc: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:-1], doc[1:], reduction="sum")


def grads(model, loss: torch.Tensor) -> list[torch.Tensor]:
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, got, strict=True)]


def per_document(model, docs):
    """(logits of each document, gradients of the summed losses): each document run alone."""
    logits = [model(input_ids=d[None]).logits[0] for d in docs]
    loss = sum(doc_loss(lg, d) for lg, d in zip(logits, docs, strict=True))
    return [lg.detach() for lg in logits], grads(model, loss)


def packed_items(docs, groups):
    items = []
    for group in groups:
        parts = [docs[i] for i in group]
        ids = torch.cat(parts)
        items.append({"input_ids": ids, "labels": ids.clone(),
                      "position_ids": torch.cat([torch.arange(len(p)) for p in parts]),
                      "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum([len(p) for p in parts])]),
                                                 dtype=torch.int32)})
    return items


def batches(docs):
    """style -> (model kwargs, function picking each document's logits out of the output)."""
    flat = PackedCollator(flatten=True, keys=HF_KEYS)(packed_items(docs, [[i] for i in range(len(docs))]))
    rows = PackedCollator(keys=("input_ids", "position_ids"))(packed_items(docs, [[0, 1], [2, 3]]))
    bounds = np.concatenate([[0], np.cumsum([len(d) for d in docs])])

    def in_order(out):
        row = out.reshape(-1, out.shape[-1])
        return [row[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    width = max(len(d) for d in docs)
    right = torch.zeros(len(docs), width, dtype=torch.long)
    left = torch.zeros_like(right)
    mask_r, mask_l = torch.zeros_like(right), torch.zeros_like(right)
    for i, d in enumerate(docs):
        right[i, : len(d)], mask_r[i, : len(d)] = d, 1
        left[i, width - len(d) :], mask_l[i, width - len(d) :] = d, 1

    def unpad(mask):
        return lambda out: [out[i][mask[i].bool()] for i in range(len(docs))]

    return {
        "packed_position_ids": ({"input_ids": flat["input_ids"], "position_ids": flat["position_ids"]}, in_order),
        "packed_cu_seq_lens": (dict(flat), in_order),
        "packed_rows": (dict(rows), in_order),  # [2, 16]: documents 0+1 and 2+3
        "padded_right": ({"input_ids": right, "attention_mask": mask_r}, unpad(mask_r)),
        "padded_left": ({"input_ids": left, "attention_mask": mask_l,
                         "position_ids": (mask_l.cumsum(-1) - 1).clamp(min=0)}, unpad(mask_l)),
    }


def assert_equal_to(ref, got) -> None:
    (ref_logits, ref_grads), (logits, g) = ref, got
    scale = max(float(r.abs().max()) for r in ref_logits)
    worst = max(float((a - b).abs().max()) for a, b in zip(logits, ref_logits, strict=True))
    assert worst <= RTOL * scale, f"logits differ by {worst:.2e} (tolerance {RTOL * scale:.2e})"
    gscale = max(float(r.abs().max()) for r in ref_grads)
    gworst = max(float((a - b).abs().max()) for a, b in zip(g, ref_grads, strict=True))
    assert gworst <= RTOL * gscale, f"gradients differ by {gworst:.2e} (tolerance {RTOL * gscale:.2e})"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request):
    name = request.param
    if name == "llama4" and not chunks_follow_documents():
        pytest.skip(f"transformers {transformers.__version__} chunks a packed row, not each document: refused (below)")
    model = build(name)
    docs = documents()
    ref = per_document(model, docs)
    model.set_attn_implementation("packtool")
    return name, model, docs, ref


def test_every_batch_style_equals_each_document_alone_under_eager(family) -> None:
    name, model, docs, ref = family
    for style, (batch, pick) in batches(docs).items():
        # use_cache=True: a model left at its config default (transformers builds a cache, sdpa then leaks)
        for use_cache in (False, True) if style == "packed_position_ids" else (False,):
            if use_cache and name in ("llama4", "gpt_bigcode"):
                continue  # layers that never see position_ids: with a cache transformers drops the documents, as eager
            out = model(**batch, use_cache=use_cache).logits
            logits = pick(out)
            loss = sum(doc_loss(lg, d) for lg, d in zip(logits, docs, strict=True))
            try:
                assert_equal_to(ref, ([lg.detach() for lg in logits], grads(model, loss)))
            except AssertionError as exc:
                raise AssertionError(f"{name} {style} use_cache={use_cache}: {exc}") from None
    alone = per_document(model, docs)  # plain batches: one document, no mask, no position_ids
    assert_equal_to(ref, alone)
    if name != "llama":
        assert_the_feature_bites(model, docs, ref)


def assert_the_feature_bites(model, docs, ref) -> None:
    """The same packed batch (position_ids only) without what makes the family hard differs from the reference,
    so a kernel ignoring it would be caught above: the layers' window/softcap/sinks dropped, and flash-attention's
    mask (padding only) in place of packtool's segment mask (chunks; documents for a model whose layers never
    see position_ids)."""
    from transformers.masking_utils import flash_attention_mask

    batch, pick = batches(docs)["packed_position_ids"]
    calls = []

    def without(module, *args, **kwargs):
        calls.append(1)
        kwargs.update(sliding_window=None, softcap=None, s_aux=None)
        return packtool.hf.attention_forward(module, *args, **kwargs)

    transformers.AttentionInterface.register("packtool_plain_test", without)
    transformers.masking_utils.AttentionMaskInterface.register("packtool_plain_test", flash_attention_mask)
    model.set_attn_implementation("packtool_plain_test")
    try:
        with torch.no_grad():
            logits = pick(model(**batch).logits)
    finally:
        model.set_attn_implementation("packtool")
    assert calls and max(float((a - b).abs().max()) for a, b in zip(logits, ref[0], strict=True)) > 1e-3


def test_packed_chunks_under_a_transformers_that_chunks_the_row_are_refused(monkeypatch) -> None:
    """transformers before 5.23 chunks a packed row by its row positions under every attn_implementation (5.17's
    Llama 4 under eager and sdpa too): a document starting off the row's chunk phase gets chunks that are not its
    own. That release's mask is rebuilt here (the packed-document mask AND-ed with the row-phase chunks, as 5.17
    did): "packtool" refuses such a batch by name, and still runs what that mask chunks right: documents that
    start on the phase, plain and padded batches."""
    from transformers import masking_utils

    monkeypatch.setattr(masking_utils, "packed_sequence_compatibility_function",
                        lambda mask_function, position_ids, packed: masking_utils.and_masks(
                            mask_function, masking_utils.packed_sequence_mask_function(packed)),
                        raising=False)  # fmt: skip
    monkeypatch.setattr(packtool.hf.mask, "chunks_follow_documents", lambda: False)
    model = build("llama4")
    docs = documents()  # 9 + 7: the second document starts at 9, off the chunk phase of 4
    ref = per_document(model, docs)
    model.set_attn_implementation("eager")
    batch, pick = batches(docs)["packed_position_ids"]
    with torch.no_grad():  # eager too chunks the row: not each document alone
        eager = pick(model(**batch, use_cache=False).logits)
    assert max(float((a - b).abs().max()) for a, b in zip(eager, ref[0], strict=True)) > 1e-3
    model.set_attn_implementation("packtool")
    for style in ("packed_position_ids", "packed_cu_seq_lens", "packed_rows"):
        batch, _ = batches(docs)[style]
        with pytest.raises(ConfigError, match=r"chunked attention \(config.attention_chunk_size=4\) on packed "
                                              r"documents .* upgrade to transformers>=5.23"):  # fmt: skip
            model(**batch, use_cache=False)
    on_phase = [docs[0][:8], docs[1][:4], docs[2][:8], docs[3][:4]]  # starting at 0, 8, 12, 20: chunked alike
    ref = per_document(model, on_phase)
    for style in ("packed_position_ids", "packed_rows", "padded_right", "padded_left"):
        batch, pick = batches(on_phase)[style]
        logits = pick(model(**batch, use_cache=False).logits)
        loss = sum(doc_loss(lg, d) for lg, d in zip(logits, on_phase, strict=True))
        assert_equal_to(ref, ([lg.detach() for lg in logits], grads(model, loss)))
    assert_equal_to(ref, per_document(model, on_phase))


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3", "llama4", "phimoe"])
def test_generate_on_a_left_padded_batch_equals_eager_per_document(name: str) -> None:
    docs = documents(1)[:3]
    model = build(name)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    opts = {"max_new_tokens": 6, "do_sample": False, "return_dict_in_generate": True, "output_logits": True}
    want = [model.generate(input_ids=d[None], **opts) for d in docs]
    model.set_attn_implementation("packtool")
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, d in enumerate(docs):
        ids[i, width - len(d) :], mask[i, width - len(d) :] = d, 1
    for cache in (None, "static"):
        got = model.generate(input_ids=ids, attention_mask=mask, cache_implementation=cache, **opts)
        for i, w in enumerate(want):
            assert torch.equal(got.sequences[i, width:], w.sequences[0, len(docs[i]) :]), (name, cache, i)
            for a, b in zip(got.logits, w.logits, strict=True):
                torch.testing.assert_close(a[i], b[0], rtol=RTOL, atol=RTOL * float(b.abs().max()))
    alone = model.generate(input_ids=docs[0][None], **opts)  # no mask, a growing cache: bottom-right causal
    assert torch.equal(alone.sequences, want[0].sequences)


def test_attention_dropout_is_applied_in_training() -> None:
    model = build("llama", attention_dropout=0.5)
    model.set_attn_implementation("packtool")
    ids = documents()[2][None]
    with torch.no_grad():
        evaluated = model(input_ids=ids).logits
        model.train()
        torch.manual_seed(0)
        a = model(input_ids=ids).logits
        b = model(input_ids=ids).logits
    assert not torch.allclose(a, evaluated) and not torch.allclose(a, b)


def test_a_forced_kernel_that_lacks_a_model_feature_is_refused_with_its_name(monkeypatch) -> None:
    from packtool.attention.kernels import spec

    real = spec.load
    monkeypatch.setattr(spec, "load", lambda k: (lambda *a, **kw: None) if k.name == "native" else real(k))
    monkeypatch.setattr(spec, "capability", lambda device: (9, 0))
    packtool.hf.register("packtool_native_test", backend="native")
    model = build("gemma2").to(torch.bfloat16)
    model.set_attn_implementation("packtool_native_test")
    with pytest.raises(ConfigError, match=r"'native' cannot run here.*attention logit softcapping \(config\.attn_logit"):
        model(input_ids=documents()[0][None])
    with pytest.raises(ConfigError, match="unknown attention backend 'cudnn'"):
        packtool.hf.register("x", backend="cudnn")


def test_a_4d_mask_is_refused_not_misread() -> None:
    model = build("llama", attn="packtool")
    ids = documents()[0][None]
    mask = torch.ones(1, 1, len(ids[0]), len(ids[0]), dtype=torch.bool).tril()
    with pytest.raises(ConfigError, match=r"takes the 2-D padding mask.*attn_implementation='sdpa'"):
        model(input_ids=ids, attention_mask=mask[0, 0][None, None].expand(1, 1, -1, -1).clone()[:, :, :, :].float())


def test_the_mask_is_flash_attention_s() -> None:
    """The registered mask function returns what transformers gives flash-attention (the 2-D mask or None)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, flash_attention_mask

    assert ALL_MASK_ATTENTION_FUNCTIONS["packtool"] is packtool.hf.padding_mask
    padded = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    for mask, kv in ((padded, 4), (padded, 3), (torch.ones(2, 4, dtype=torch.bool), 4), (None, 4)):
        ours = packtool.hf.padding_mask(2, 4, kv, attention_mask=mask)
        theirs = flash_attention_mask(2, 4, kv, attention_mask=mask)
        assert (ours is None and theirs is None) or torch.equal(ours, theirs)
    static = packtool.hf.padding_mask(2, 1, 8, q_offset=4)  # a static cache of 8 slots, 5 tokens seen
    assert static.tolist() == [[True] * 5 + [False] * 3] * 2


def test_the_mask_reads_chunks_and_documents_from_the_model_s_pattern() -> None:
    """Llama 4's chunks and packed documents (transformers' own mask functions) become segments: int32
    `2 * segment + joined`, 0 on padding; a plain causal pattern stays flash-attention's mask."""
    from transformers.masking_utils import (
        causal_mask_function,
        chunked_causal_mask_function,
        packed_sequence_compatibility_function,
        sliding_window_causal_mask_function,
    )

    chunked = chunked_causal_mask_function(4, torch.zeros(1, dtype=torch.long))
    ids = packtool.hf.padding_mask(1, 9, 9, mask_function=chunked)
    assert ids.dtype == torch.int32 and (ids // 2).tolist() == [[1, 1, 1, 1, 2, 2, 2, 2, 3]]
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 5]])
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    packed = packed_sequence_compatibility_function(chunked, positions, documents)
    assert (packtool.hf.padding_mask(1, 9, 9, mask_function=packed) // 2).tolist() == [[1, 1, 1, 2, 2, 2, 2, 3, 3]]
    padded = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    assert packtool.hf.padding_mask(1, 9, 9, mask_function=causal_mask_function, attention_mask=padded).dtype == torch.bool
    assert packtool.hf.padding_mask(1, 9, 9, mask_function=causal_mask_function) is None
    sliding = packtool.hf.padding_mask(1, 9, 9, mask_function=sliding_window_causal_mask_function(3))
    assert (sliding // 2).tolist() == [[1] * 9] and getattr(sliding, packtool.hf.mask.WINDOW) == 3
    decode = packtool.hf.padding_mask(1, 1, 9, q_offset=8, mask_function=chunked)  # the last chunk's keys only
    assert decode.tolist() == [[False] * 8 + [True]]
    # position_ids restarting where the chunked pattern (counted from the row's start) does not cut: refused
    q = torch.zeros(1, 9, 2, 4)
    with pytest.raises(ConfigError, match=r"not the ones this layer's mask pattern cuts \(chunked attention"):
        packtool.hf.layout.read(q, q, q, ids, {"position_ids": positions})
    reading = packtool.hf.layout.read(q, q, q, ids, {"position_ids": torch.arange(9)[None]})  # positions that agree
    assert reading.rows.cu_q.tolist() == [0, 4, 8, 9]


def test_spawned_dataloader_workers_give_the_in_process_batches(tmp_path) -> None:
    """docs/HF.md's setup for workers once CUDA is up: multiprocessing_context="spawn" works because the
    dataset and collator pickle (no memory map travels); the batches equal num_workers=0's."""
    from support import write_pack_store, zipf_docs

    from packtool.loader import PackedDataset

    write_pack_store(tmp_path / "p", zipf_docs(200, seed=3, max_len=120), 256)
    ds = PackedDataset(tmp_path / "p")
    collate = PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS)
    runs = []
    for workers in (0, 1):
        context = {"multiprocessing_context": "spawn"} if workers else {}
        runs.append(list(torch.utils.data.DataLoader(ds, batch_size=4, num_workers=workers, collate_fn=collate,
                                                     **context)))
    assert len(runs[0]) == len(runs[1]) > 2
    for a, b in zip(*runs, strict=True):
        assert all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in HF_KEYS)


def test_the_trl_export_points_at_attn_implementation_packtool(tmp_path) -> None:
    """`packtool export --to trl` prints the next steps (CLI) and returns them (`export_store`): the attention
    line names `import packtool.hf` + `attn_implementation="packtool"`, and no longer says any implementation
    separates the sequences (sdpa/eager do so only by building a T*T mask)."""
    from support import cli, write_pack_store, zipf_docs

    from packtool.stages.export import ExportConfig, export_store

    write_pack_store(tmp_path / "p", zipf_docs(60, seed=4, max_len=100), 256)
    code, out, err = cli("export", str(tmp_path / "p"), "--to", "trl", "--output", str(tmp_path / "cli"))
    assert code == 0, err
    lines = export_store(ExportConfig(tmp_path / "p", "trl", tmp_path / "api")).lines
    for text in (out, "\n".join(lines)):
        assert 'import packtool.hf, then from_pretrained(..., attn_implementation="packtool")' in text
        assert "padding_free=True" in text and "any attn_implementation" not in text
