"""Tiny transformers families for the `attn_implementation="packtool"` tests, and the batches real collators make.

Imported as `hf_support` (no test imports another test). Each family is built from transformers' own config
class, in float64, with the feature that makes it hard kept and made to bite: Mistral's and Qwen3's windows (4)
shorter than the documents (5-11 tokens), Gemma 2's logit softcapping (0.5) on local + global layers, gpt-oss's
sinks on sliding + full layers; Llama is the plain one.

`trl_collate` is TRL 1.16's `DataCollatorForLanguageModeling.torch_call` (trl/trainer/sft_trainer.py), kept
key for key for the dev environment, which has no TRL; where TRL is installed the tests check it is still the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

LENGTHS = (9, 7, 11, 5)  # two rows of two documents: 16 + 16
VOCAB = 96
SMALL = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64, "pad_token_id": 0,
         "bos_token_id": 1, "eos_token_id": 2}  # fmt: skip


def config(name: str) -> Any:
    import transformers

    if name == "llama":
        return transformers.LlamaConfig(**SMALL, num_hidden_layers=2)
    if name == "mistral":
        return transformers.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=4)
    if name == "qwen3":
        return transformers.Qwen3Config(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                        max_window_layers=1, layer_types=["sliding_attention", "full_attention"])
    if name == "gemma2":
        return transformers.Gemma2Config(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                         attn_logit_softcapping=0.5, final_logit_softcapping=None,
                                         layer_types=["sliding_attention", "full_attention"])
    if name == "gpt_oss":
        return transformers.GptOssConfig(**{**SMALL, "intermediate_size": 16}, num_hidden_layers=2, sliding_window=4,
                                         num_local_experts=4, num_experts_per_tok=2,
                                         layer_types=["sliding_attention", "full_attention"])
    small = {k: v for k, v in SMALL.items() if k != "head_dim"}
    pattern = ["sliding_attention", "full_attention"]
    if name == "gemma3":  # its own mask functions
        return transformers.Gemma3TextConfig(**SMALL, num_hidden_layers=2, sliding_window=4, query_pre_attn_scalar=8,
                                             layer_types=pattern)
    if name == "qwen2":  # sliding layers from max_window_layers
        return transformers.Qwen2Config(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=4,
                                        max_window_layers=1)
    if name == "cohere2":
        return transformers.Cohere2Config(**SMALL, num_hidden_layers=2, sliding_window=4, layer_types=pattern)
    if name == "olmo3":
        return transformers.Olmo3Config(**small, num_hidden_layers=2, sliding_window=4, layer_types=pattern)
    if name == "deepseek_v3":  # MLA: values narrower than queries
        return transformers.DeepseekV3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                                             moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                                             n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=16,
                                             kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                             max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    raise KeyError(name)


def build(name: str, attn: str = "eager") -> Any:
    import transformers

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(name), attn_implementation=attn,
                                                          dtype=torch.float64, experts_implementation="eager")
    return model.eval()


def documents(seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(3, VOCAB, n)) for n in LENGTHS]


def trl_collate(examples: list[dict[str, Any]], pad_token_id: int = 0, padding_free: bool = False,
                return_position_ids: bool = False, pad_to_multiple_of: int | None = None) -> dict[str, Any]:
    """TRL 1.16 `DataCollatorForLanguageModeling(pad_token_id, padding_free, return_position_ids,
    pad_to_multiple_of)(examples)`, as its `torch_call` builds it."""

    def pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
        width = max(len(r) for r in rows)
        if pad_to_multiple_of:
            width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
        out = torch.full((len(rows), width), value, dtype=rows[0].dtype)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out

    input_ids = [torch.tensor(e["input_ids"]) for e in examples]
    labels = [torch.tensor(e.get("labels", e["input_ids"])) for e in examples]
    position_ids = [torch.arange(len(ids)) for ids in input_ids]
    output: dict[str, Any] = {}
    if padding_free:
        input_ids, labels, position_ids = [torch.cat(input_ids)], [torch.cat(labels)], [torch.cat(position_ids)]
    output["input_ids"] = pad(input_ids, pad_token_id)
    output["labels"] = pad(labels, -100)
    if padding_free:
        output["position_ids"] = pad(position_ids, 0)
        output["labels"][output["position_ids"] == 0] = -100
        seq_starts = (output["position_ids"][0] == 0).nonzero().flatten()
        cu_seq_lens = torch.cat([seq_starts, torch.tensor([output["position_ids"].size(1)])]).to(torch.int32)
        output["cu_seq_lens_q"] = output["cu_seq_lens_k"] = cu_seq_lens
        output["max_length_q"] = output["max_length_k"] = int(cu_seq_lens.diff().max())
        output["seq_idx"] = torch.repeat_interleave(
            torch.arange(cu_seq_lens.numel() - 1, dtype=torch.int32), cu_seq_lens.diff()
        )[None]
    else:
        if return_position_ids:
            output["position_ids"] = pad(position_ids, 0)
        output["attention_mask"] = pad([torch.ones_like(ids) for ids in input_ids], 0)
    return output
