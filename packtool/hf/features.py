"""Model features that no varlen kernel runs: refused by name, never silently dropped.

A varlen kernel attends each query to a contiguous run of keys of its own segment, scaled,
optionally windowed, softcapped and with per-head sinks. Some transformers models ask for more:
a dense score bias, a per-query choice of keys, keys that are not tokens. transformers' own
flash-attention path declines these models (`_supports_flash_attn = False`) or ignores the extra
argument; "packtool" says which feature it is and what to use instead (eager or sdpa, which
build the dense mask). Two places see them: the mask function (the model's config, once per
forward, before the model's own code would trip over a 2-D mask) and the attention function
(the arguments of each call).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch

from packtool.errors import ConfigError

INSTEAD = "use attn_implementation='sdpa' or 'eager' for this model"

#: config field -> the feature it declares, when set (not None / not empty)
CONFIG_FEATURES = {
    "index_topk": "DeepSeek sparse attention (config.index_topk: a learned top-k choice of keys per query, as in "
    "DeepSeek V3.2 / V4, GLM-MoE-DSA)",
    "compress_rates": "compressed-KV attention (config.compress_rates: DeepSeek V4's CSA/HCA layers attend to "
    "pooled keys under a per-query block bias)",
    "keep_window_size": "dynamic mask attention (config.keep_window_size: Doge adds a learned bias to every key's "
    "score)",
}

#: attention-call argument -> the feature it carries, when not None
CALL_FEATURES = {
    "position_bias": "an additive score bias (`position_bias`: relative-position logits, e.g. Inkling)",
    "indices": "sparse attention over a per-query choice of keys (`indices`: DeepSeek sparse attention)",
    "block_indices": "block-sparse attention over a per-query choice of key blocks (`block_indices`: MiniMax M3)",
    "cache": "a paged KV cache (continuous batching)",
    "block_table": "a paged KV cache (continuous batching)",
}

#: arguments transformers passes on to every attention function that change nothing packtool computes
#: (they are read elsewhere, or only where noted in attention.py)
KNOWN = frozenset(
    {
        "position_ids", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx",
        "num_items_in_batch", "output_hidden_states", "output_attentions", "output_router_logits",
        "use_cache", "cache_position", "return_dict", "deterministic", "layer_idx", "target_dtype",
        "token_type_ids", "mm_token_type_ids", "position_embeddings", "past_key_values", "past_key_value",
        "n_target_tokens", "lengths",
    }
)  # fmt: skip

#: keys of PackedCollator's full batch for Megatron / Transformer Engine (the documents under other names): a
#: model that gets them without `keys=HF_KEYS` would drop what they say, so they are refused, naming the fix
COLLATOR_KEYS = frozenset(
    {
        "cu_seqlens", "max_seqlen", "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv",
        "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "cu_seqlens_local",
    }
)  # fmt: skip


def refuse(feature: str) -> ConfigError:
    return ConfigError(f"{feature} cannot run as attn_implementation='packtool', packtool.hf, {INSTEAD}")


def refuse_config(config: Any) -> None:
    """Raise for a model whose config declares a feature no varlen kernel runs."""
    for field, feature in CONFIG_FEATURES.items():
        value = getattr(config, field, None)
        if value is not None and value != {} and value != 0:
            raise refuse(feature)
    if getattr(config, "is_encoder_decoder", False) is True:
        raise refuse(
            f"an encoder-decoder model ({type(config).__name__}: its decoder's cross-attention keys are the encoder's "
            "tokens, which the batch's padding mask and documents do not describe)"
        )


def refuse_call(kwargs: dict[str, Any], heads: int) -> None:
    """Raise for an attention call carrying a feature no varlen kernel runs, or an argument packtool does not know.

    An unknown argument whose value is None or False asks for nothing; any other is refused by its name, so a
    model that hands the attention function something new is never run as if it had not.
    """
    for name, value in kwargs.items():
        if value is None or value is False or name in KNOWN:
            continue
        if name in CALL_FEATURES:
            raise refuse(CALL_FEATURES[name])
        if name in COLLATOR_KEYS:
            raise ConfigError(
                f"PackedCollator's Megatron / Transformer Engine keys (`{name}`) reached the model, packtool.hf, "
                "pass PackedCollator(keys=HF_KEYS) for model(**batch) (the documents as transformers names them)"
            )
        if name == "sinks":
            shape = tuple(getattr(value, "shape", ()))
            raise refuse(f"attention sinks of shape {shape} (`sinks`: one logit per query, not per head)")
        raise refuse(f"the attention argument `{name}` ({type(value).__name__}), which packtool does not know,")


@cache
def chunks_follow_documents() -> bool:
    """Whether this transformers lays chunked attention out from each packed document's own start (5.23 and
    later remap a packed row's indices to per-document positions). Earlier releases chunk the packed ROW by
    its row positions under every attn_implementation, so a document's chunks there are not its chunks alone."""
    from transformers import masking_utils

    return hasattr(masking_utils, "packed_sequence_compatibility_function")


def misphased_chunks(chunk: int, start: torch.Tensor) -> ConfigError | None:
    """The refusal for a chunked layer's segment starts (`[B, T]` bool, no padding) that chunk packed documents by
    their ROW positions (see `chunks_follow_documents`): every multiple of `chunk` starts a segment, and so does
    some position that is not one (a document starting off the row's chunk phase, whose own chunks would start
    there). None when the chunks are each document's own (a document starting on the phase is chunked alike)."""
    length = start.shape[-1]
    if chunk >= length:
        return None
    phase = torch.arange(length, device=start.device) % chunk == 0
    off, every = torch.stack([(start[:, 1:] & ~phase[1:]).any(), start[:, phase].all()]).tolist()
    if not (off and every):
        return None
    import transformers

    return ConfigError(
        f"chunked attention (config.attention_chunk_size={chunk}) on packed documents cannot run as "
        f"attn_implementation='packtool' under transformers {transformers.__version__}, which chunks a packed row "
        "by its row positions, not each document from its start (as every attn_implementation of that release "
        "does), packtool.hf, upgrade to transformers>=5.23, or train this model on padded batches "
        "(DynamicBatchSampler(padded=True) + PaddedCollator)"
    )
