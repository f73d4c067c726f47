"""`attn_implementation="packtool"` on what the family sweep (scripts/check_hf_families.py) found, CPU, float64.

The sweep builds every causal-LM family of transformers from its own config class and compares
packed / padded / plain batches and generation under "packtool" with each document alone under
eager. The families it caught are pinned here: Gemma 3's image tokens, which attend to their
whole image (a bidirectional block inside a causal layer), Gemma 3's bidirectional mode, and the
features no varlen kernel runs, which are refused with one line naming them instead of being
dropped (Inkling's score bias, DeepSeek's sparse attention, Doge's dynamic mask, an argument
packtool does not know). The whole sweep is the `slow` test at the end (about 5 minutes on 2 cores); the
default suite checks that the sweep measures this checkout's packtool (`test_the_sweep_checks_this_checkout`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402
from packtool.errors import ConfigError  # noqa: E402

RTOL = 1e-6
IMAGE = 5
SMALL = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip
ROOT = Path(__file__).resolve().parent.parent


def close(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    """Worst |got - want| over the pairs, relative to want's largest value."""
    scale = max(float(w.abs().max()) for w in want)
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) / scale


def gemma3_vision():
    """Gemma 3 with its SigLIP tower, tiny: 4 tokens per image, a local layer (window 4) and a global one."""
    text = transformers.Gemma3TextConfig(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                         layer_types=["sliding_attention", "full_attention"])
    vision = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=16, patch_size=4)
    config = transformers.Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                       mm_tokens_per_image=4, image_token_index=IMAGE, boi_token_index=6,
                                       eoi_token_index=7)
    torch.manual_seed(0)
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float64).eval()
    model.set_attn_implementation("eager")
    return model


def test_gemma3_image_tokens_see_their_whole_image_as_under_eager() -> None:
    """Image tokens attend bidirectionally within their image (transformers' blockwise overlay), text causally:
    packtool reads the blocks from the model's mask and runs their queries in a second, non-causal varlen call.
    Each document alone, and padded right and left, equal eager's documents alone; without the blocks they differ."""
    model = gemma3_vision()
    rng = np.random.default_rng(0)
    docs = [torch.from_numpy(np.concatenate([rng.integers(8, 96, a), [IMAGE] * 4, rng.integers(8, 96, b)]))
            for a, b in ((3, 5), (6, 2))]  # fmt: skip
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)

    def run(ids: torch.Tensor, pixels: torch.Tensor, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE).long(), use_cache=False,
                         **kwargs).logits  # fmt: skip

    want = [run(d[None], images[i : i + 1])[0] for i, d in enumerate(docs)]
    with torch.no_grad():
        causal_only = [model(input_ids=d[None], pixel_values=images[i : i + 1]).logits[0] for i, d in enumerate(docs)]
    assert close(causal_only, want) > 1e-3  # the blocks change the result: the check below can fail
    model.set_attn_implementation("packtool")
    assert close([run(d[None], images[i : i + 1])[0] for i, d in enumerate(docs)], want) < RTOL
    width = max(len(d) for d in docs)
    for side in ("right", "left"):
        ids = torch.zeros(2, width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, d in enumerate(docs):
            cols = slice(0, len(d)) if side == "right" else slice(width - len(d), width)
            ids[i, cols], mask[i, cols] = d, 1
        out = run(ids, images, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        assert close([out[i][mask[i].bool()] for i in range(2)], want) < RTOL, side


def gemma3_bidirectional():
    config = transformers.Gemma3TextConfig(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                           layer_types=["sliding_attention", "full_attention"],
                                           use_bidirectional_attention=True)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                         dtype=torch.float64).eval()


def test_gemma3_bidirectional_mode_packs_documents_apart_with_or_without_a_cache() -> None:
    """`use_bidirectional_attention` (EmbeddingGemma): every token sees its whole document, local layers a
    window both ways. Packed with restarting position_ids, each document equals itself alone; with a KV cache
    transformers builds the mask without the documents (one bidirectional row), and "packtool" cuts the row
    where the positions restart instead of mixing them."""
    model = gemma3_bidirectional()
    rng = np.random.default_rng(1)
    docs = [torch.from_numpy(rng.integers(3, 96, n)) for n in (7, 10, 5)]
    with torch.no_grad():
        want = [model(input_ids=d[None]).logits[0] for d in docs]
        model.set_attn_implementation("packtool")
        ids = torch.cat(docs)[None]
        positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
        out = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        bounds = np.cumsum([0] + [len(d) for d in docs])
        assert close([out[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], want) < RTOL
        assert close([model(input_ids=d[None]).logits[0] for d in docs], want) < RTOL
        cached = model(input_ids=ids, position_ids=positions, use_cache=True).logits[0]
        assert close([cached[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)], want) < RTOL


def attention_call(**kwargs):
    """One direct call of the registered function: [1, 4 heads, 6 tokens, 8] q/k/v, causal."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    module = torch.nn.Module()
    module.is_causal = True
    return packtool.hf.attention_forward(module, q, k, v, None, scaling=0.3, **kwargs)[0]


def test_features_no_varlen_kernel_runs_are_refused_by_name() -> None:
    """A dense score bias, a per-query choice of keys, per-query sinks, an argument packtool does not know:
    refused in one line that names it (transformers' flash path drops them silently); arguments that change
    nothing pass, and a per-head `sinks` is gpt-oss's `s_aux` under another name."""
    bias = torch.zeros(1, 4, 6, 6, dtype=torch.float64)
    for kwargs, feature in ((dict(position_bias=bias), r"additive score bias \(`position_bias`"),
                            (dict(indices=torch.zeros(1, 6, 2, dtype=torch.long)), r"per-query choice of keys"),
                            (dict(block_indices=torch.zeros(1, 1, 6, 2, dtype=torch.long)), r"block-sparse"),
                            (dict(sinks=torch.zeros(1, 4, 6, 1, dtype=torch.float64)), r"sinks of shape \(1, 4, 6, 1\)"),
                            (dict(alibi=bias), r"attention argument `alibi` \(Tensor\)")):  # fmt: skip
        with pytest.raises(ConfigError, match=feature + r".*use attn_implementation='sdpa' or 'eager'"):
            attention_call(**kwargs)
    plain = attention_call()
    harmless = attention_call(output_attentions=True, num_items_in_batch=3, position_bias=None, indices=None)
    assert torch.equal(plain, harmless)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], dtype=torch.float64)
    assert torch.equal(attention_call(sinks=sinks), attention_call(s_aux=sinks))
    assert not torch.allclose(attention_call(s_aux=sinks), plain)


@pytest.mark.parametrize(
    ("config", "feature"),
    [
        (lambda: transformers.DogeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, keep_window_size=4),
         "dynamic mask attention"),
        (lambda: transformers.DeepseekV32Config(**{**SMALL, "head_dim": 8}, num_hidden_layers=1, kv_lora_rank=16,
                                                q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                                                n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                                moe_intermediate_size=16, index_topk=4, index_n_heads=2,
                                                index_head_dim=16, first_k_dense_replace=1),
         "DeepSeek sparse attention"),
    ],
    ids=["doge", "deepseek_v32"],
)  # fmt: skip
def test_models_whose_attention_needs_a_dense_mask_are_refused_before_their_code_trips(config, feature) -> None:
    """Their own code reads a 4-D mask (Doge's dynamic bias, DeepSeek's indexer) and would fail, or build a
    pattern no varlen kernel runs: the mask function refuses them first, padded or not."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(), attn_implementation="packtool").eval()
    ids = torch.arange(3, 12)[None]
    for extra in ({}, {"attention_mask": torch.tensor([[0, 0] + [1] * 7])}):
        with pytest.raises(ConfigError, match=feature + r".*cannot run as attn_implementation='packtool'"):
            model(input_ids=ids, **extra)


def test_roberta_packs_exactly_given_its_own_positions() -> None:
    """RoBERTa-style models count positions from padding_idx + 1 (their embeddings read them), so 0-based
    position_ids change the model, not its attention: packed with position_ids offset by padding_idx + 1
    (docs/HF.md), each document under "packtool" equals itself alone under eager; 0-based ones do not."""
    config = transformers.RobertaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, max_position_embeddings=64, is_decoder=True,
                                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float64)
    rng = np.random.default_rng(2)
    docs = [torch.from_numpy(rng.integers(3, 96, n)) for n in (9, 7, 11)]
    bounds = np.cumsum([0] + [len(d) for d in docs])
    with torch.no_grad():
        want = [model(input_ids=d[None]).logits[0] for d in docs]
        model.set_attn_implementation("packtool")
        zero = torch.cat([torch.arange(len(d)) for d in docs])[None]

        def packed(positions: torch.Tensor) -> list[torch.Tensor]:
            out = model(input_ids=torch.cat(docs)[None], position_ids=positions, use_cache=False).logits[0]
            return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        assert close(packed(zero + config.pad_token_id + 1), want) < RTOL
        assert close(packed(zero), want) > 1e-3


def test_the_sweep_checks_this_checkout(tmp_path: Path) -> None:
    """The sweep's worker imports the packtool of the checkout the script is in, not whichever one the environment
    has installed (scripts/ is sys.path[0] of a script: another checkout's editable install was measured, and its
    verdicts were reported for this one). One family, its verdict and the packtool it ran."""
    out = tmp_path / "llama.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_hf_families.py"), "llama", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    (result,) = json.loads(out.read_text())
    assert result["verdict"] == "exact", result
    assert Path(result["packtool"]).resolve() == (ROOT / "packtool" / "__init__.py").resolve()
    assert all(style["ok"] for style in result["styles"].values()) and len(result["styles"]) == 8


#: the floor of the sweep's counts on transformers 5.23 (docs/HF.md has the table: 110 exact, 26 limited, 10 refused)
FLOOR = {"exact": 110, "limited": 26, "refused": 10}


@pytest.mark.slow
def test_every_causal_lm_family_is_exact_limited_refused_or_not_applicable(tmp_path: Path) -> None:
    """scripts/check_hf_families.py over every family of the installed transformers: none WRONG, none crashing,
    none running out of time; each limited, refused and not-applicable one says why (a limited family is exact
    in attention and differs only where the model itself does: under eager on the same batch, or by its own
    positions); at least FLOOR["exact"] exact, and no more limited or refused ones than their ceilings."""
    out = tmp_path / "families.json"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_hf_families.py"), "--json", str(out)],
                         capture_output=True, text=True, timeout=3 * 3600)  # fmt: skip
    results = json.loads(out.read_text())
    bad = [(r["family"], r["verdict"], r.get("reason")) for r in results
           if r["verdict"] not in ("exact", "limited", "refused", "n/a")]  # fmt: skip
    assert not bad and run.returncode == 0, bad
    counts = {v: sum(r["verdict"] == v for r in results) for v in FLOOR}
    assert counts["exact"] >= FLOOR["exact"], counts
    assert counts["limited"] <= FLOOR["limited"] and counts["refused"] <= FLOOR["refused"], counts
    assert all(r.get("reason") for r in results if r["verdict"] in ("limited", "refused", "n/a"))
    assert all(Path(r["packtool"]).resolve().parent == (ROOT / "packtool").resolve() for r in results if "packtool" in r)


# ---- the same paths on a GPU's kernels (bf16; `pytest -m gpu`) --------------------------------------------


def _gpu_models():
    from test_hf import gpt_bigcode, llama4, phimoe

    def build(config):
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.bfloat16,
                                                             experts_implementation="eager").cuda().eval()  # fmt: skip

    return {"llama4": lambda: build(llama4()), "gpt_bigcode": lambda: build(gpt_bigcode()),
            "phimoe": lambda: build(phimoe())}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("family", ["llama4", "gpt_bigcode", "phimoe", "gemma3_images"])
def test_on_a_gpu_the_mask_read_paths_run_a_kernel_and_equal_each_document_alone(family: str) -> None:
    """Chunks (Llama 4), documents from the mask alone (GPTBigCode), a window from the mask (PhiMoE) and image
    blocks (Gemma 3: a second, non-causal call with keys of their own) on CUDA in bf16: packed (position_ids
    only) or padded under "packtool" equal each document alone under eager within bf16 noise, and the calls ran
    on a varlen kernel, not the exact fallback, where torch has one."""
    from packtool.attention import select_backend
    from packtool.attention.kernels import spec
    from packtool.hf.features import chunks_follow_documents

    if family == "llama4" and not chunks_follow_documents():
        pytest.skip(f"transformers {transformers.__version__} chunks a packed row, not each document: refused")
    seen: list[str] = []
    real = spec.run
    rng = np.random.default_rng(0)
    with torch.no_grad():
        if family == "gemma3_images":
            model = gemma3_vision().to(torch.bfloat16).cuda()
            docs = [torch.from_numpy(np.concatenate([rng.integers(8, 96, a), [IMAGE] * 4, rng.integers(8, 96, b)]))
                    for a, b in ((3, 5), (6, 2))]  # fmt: skip
            images = torch.randn(2, 3, 16, 16, dtype=torch.bfloat16, device="cuda")
            extra = [{"pixel_values": images[i : i + 1], "token_type_ids": (d == IMAGE).long()[None].cuda()}
                     for i, d in enumerate(docs)]  # fmt: skip
            want = [model(input_ids=d[None].cuda(), **e).logits[0].float() for d, e in zip(docs, extra, strict=True)]
            width = max(len(d) for d in docs)
            ids = torch.zeros(2, width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, d in enumerate(docs):
                ids[i, : len(d)], mask[i, : len(d)] = d, 1
            batch = {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "pixel_values": images,
                     "token_type_ids": (ids == IMAGE).long().cuda()}  # fmt: skip

            def pick(out: torch.Tensor) -> list[torch.Tensor]:
                return [out[i][mask[i].bool().cuda()].float() for i in range(2)]
        else:
            model = _gpu_models()[family]()
            docs = [torch.from_numpy(rng.integers(3, 96, n)) for n in (9, 7, 11, 5)]
            want = [model(input_ids=d[None].cuda()).logits[0].float() for d in docs]
            batch = {"input_ids": torch.cat(docs)[None].cuda(),
                     "position_ids": torch.cat([torch.arange(len(d)) for d in docs])[None].cuda()}  # fmt: skip
            bounds = np.cumsum([0] + [len(d) for d in docs])

            def pick(out: torch.Tensor) -> list[torch.Tensor]:
                return [out[0, a:b].float() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        model.set_attn_implementation("packtool")
        spec.run = lambda kernel, call: seen.append(kernel.name) or real(kernel, call)
        try:
            got = pick(model(**batch, use_cache=False).logits)
        finally:
            spec.run = real
        model.set_attn_implementation("sdpa")
        noise = close([model(input_ids=d[None].cuda(), **(extra[i] if family == "gemma3_images" else {})).logits[0]
                       .float() for i, d in enumerate(docs)], want)  # fmt: skip
    assert close(got, want) <= max(2 * noise, 0.02), (family, close(got, want), noise)
    if select_backend(torch.zeros(8, 4, 8, device="cuda", dtype=torch.bfloat16)) != "fallback":
        assert seen and "fallback" not in seen, seen
