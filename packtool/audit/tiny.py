"""A model's config shrunk to a few thousand parameters, keeping what decides packing correctness.

Packing leaks through the layer TYPES (attention, sliding window, convolution, linear attention,
state-space, experts), not their sizes; so every width (hidden, heads, intermediate, experts,
vocabulary, SSM and linear-attention dims) shrinks, the sliding window and SSM chunk shrink below the
probe's document lengths (so a window or a chunk boundary is actually crossed), and the layer stack
keeps the first layer of every distinct kind (a kind = the layer's entries in every per-layer
field: `layer_types`, `layers_block_type`, attention / expert index lists, sparse steps) in order,
and at least two layers. A whole audit of one model then runs in seconds on a CPU.
"""

from __future__ import annotations

from typing import Any

from packtool.errors import InputError

HIDDEN = 64
HEADS = 4
HEAD_DIM = HIDDEN // HEADS
VOCAB = 128
WINDOW = 4  # sliding window / attention chunk: below the probe's documents (4..12 tokens)
SSM_CHUNK = 8  # SSM chunk: documents straddle chunk boundaries

#: width fields set when the config has them (and they are not None)
SIZES: dict[str, int] = {
    "hidden_size": HIDDEN,
    "d_model": HIDDEN,
    "intermediate_size": 96,
    "ffn_hidden_size": 96,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "shared_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "num_attention_heads": HEADS,
    "head_dim": HEAD_DIM,
    "vocab_size": VOCAB,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "sliding_window": WINDOW,
    "attention_chunk_size": WINDOW,
    "query_pre_attn_scalar": HEAD_DIM,
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    # linear attention (gated delta net: Qwen3.5, Qwen3-Next, OLMo hybrid)
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    # Mamba-2 mixers (Bamba, Falcon-H1, GraniteMoeHybrid, NemotronH, Mamba2, Jamba)
    "mamba_n_heads": 4,
    "mamba_num_heads": 4,
    "mamba_d_head": 32,
    "mamba_head_dim": 32,
    "mamba_d_ssm": 128,
    "mamba_d_state": 16,
    "ssm_state_size": 16,
    "state_size": 16,
    "mamba_n_groups": 1,
    "n_groups": 1,
    "mamba_chunk_size": SSM_CHUNK,
    "chunk_size": SSM_CHUNK,
    "mamba_dt_rank": 8,
    "time_step_rank": 8,
    "mamba_expand": 2,
    "expand": 2,
    "block_multiple_of": 32,  # LFM2 rounds its FFN width up to this
    # per-layer input embeddings (Gemma 3n, Gemma 4): a vocabulary and a width of their own
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "num_nextn_predict_layers": 0,
    # widths under names of their own (not in any attribute_map): GPT-2 / OPT MLPs, GPT-J / CodeGen rotary dims
    "n_inner": 96,
    "ffn_dim": 96,
    "rotary_dim": HEAD_DIM,
}
#: layer-count fields (and every name a config class's `attribute_map` gives `num_hidden_layers`)
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
#: no config names more layers than this: the per-layer loops stay bounded whatever a config says
MAX_LAYERS = 1 << 14
#: position-table sizes, capped (learned position embeddings are `positions x hidden` parameters): GPT-2's
#: names (learned positions) at 4096, the others at 2**20; every released family's default is at or below
#: its cap (transformers 5.23), so only a config beyond it changes
POSITION_CAPS = {"max_position_embeddings": 1 << 20, "max_seq_len": 1 << 20, "seq_length": 1 << 20,
                 "n_positions": 4096, "n_ctx": 4096}  # fmt: skip
POSITION_KEYS = tuple(POSITION_CAPS)
#: integer fields the shrink reads or replaces: a non-integer there is refused by name before transformers sees it
INT_FIELDS = (*SIZES, *LAYER_KEYS, *POSITION_KEYS, "num_key_value_heads")
#: head counts transformers divides by when it builds the config (0 was "integer division or modulo by zero")
HEAD_COUNTS = ("num_attention_heads", "num_key_value_heads")
#: parameters of the shrunk model (counted on the meta device, nothing allocated) above which the audit refuses:
#: a size field the shrink does not know stayed large. Causal-LM families shrink to 0.07-8M parameters
#: (transformers 5.23); a few multimodal ones keep a vision tower (git: 86M); 2**27 float64 weights are 1 GiB
MAX_PARAMS = 1 << 27
#: fields switched off: randomness, extra outputs, kernels the CPU lacks
OFF: dict[str, Any] = {
    "router_jitter_noise": 0.0,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "dropout": 0.0,
    "output_router_logits": False,
    "use_mamba_kernels": False,
    "use_cache": False,
}
#: per-layer lists of layer indices, remapped to the kept layers
INDEX_LISTS = ("attn_layer_indices", "full_attn_idxs", "mlp_only_layers", "no_rope_layers_idx")
#: derived fields dropped so the config class recomputes them from what is kept
DERIVED = ("_sliding_window_pattern", "sliding_window_pattern", "max_window_layers")
TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id", "decoder_start_token_id")


def layer_kinds(d: dict[str, Any], n: int) -> list[tuple[Any, ...]]:
    """Each layer's kind: its entry in every per-layer field of the config dict `d`."""
    kinds: list[list[Any]] = [[] for _ in range(n)]
    for key, value in sorted(d.items()):
        if isinstance(value, list) and len(value) == n and key not in INDEX_LISTS and not key.startswith("mtp_"):
            for i in range(n):
                kinds[i].append((key, _hashable(value[i])))
    for key in INDEX_LISTS:
        if isinstance(d.get(key), list):
            members = {int(x) % n for x in d[key]}  # negative indices count from the end
            for i in range(n):
                kinds[i].append((key, i in members))
    overrides = _per_layer(d, n)
    if overrides:
        for i in range(n):
            kinds[i].append(("per_layer_config", _hashable(overrides.get(i))))
    for period, offset in (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset")):
        if d.get(period):
            for i in range(n):
                kinds[i].append((period, i % int(d[period]) == int(d.get(offset) or 0)))
    step = d.get("decoder_sparse_step")
    if isinstance(step, int) and step > 1:
        for i in range(n):
            kinds[i].append(("sparse", (i + 1) % step == 0))
    dense = d.get("first_k_dense_replace")
    if isinstance(dense, int) and dense > 0:
        for i in range(n):
            kinds[i].append(("dense", i < dense))
    return [tuple(k) for k in kinds]


def keep_layers(kinds: list[tuple[Any, ...]]) -> list[int]:
    """The first layer of every distinct kind, in order; at least two layers when there are two."""
    keep: list[int] = []
    seen: set[tuple[Any, ...]] = set()
    for i, kind in enumerate(kinds):
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    if len(keep) < 2 and len(kinds) >= 2:
        keep = sorted({*keep, next(i for i in range(len(kinds)) if i not in keep)})
    return keep


def aliased(keys: tuple[str, ...] | list[str], aliases: dict[str, str]) -> list[str]:
    """`keys` and the names a config class's `attribute_map` stores them under (GPT-2: `n_embd` for `hidden_size`)."""
    return list(dict.fromkeys([*keys, *(aliases[k] for k in keys if k in aliases)]))


def tiny_config_dict(d: dict[str, Any], aliases: dict[str, str] | None = None) -> tuple[dict[str, Any], list[int]]:
    """The shrunk config dict and the original indices of the layers it keeps.

    `aliases`: the config class's `attribute_map` (canonical name -> the field it is stored in), so that a
    size stored under another name (`n_embd`, `n_head`, `n_positions`, `n_routed_experts`, ...) shrinks too.
    """
    aliases = aliases or {}
    d = {k: v for k, v in d.items() if k not in DERIVED and k not in ("dtype", "torch_dtype", "_name_or_path")}
    n = _n_layers(d, aliases)
    kinds = layer_kinds(d, n)
    keep = keep_layers(kinds)
    new_index = {old: new for new, old in enumerate(keep)}
    for key, value in list(d.items()):
        if isinstance(value, list) and len(value) == n and key not in INDEX_LISTS and not key.startswith("mtp_"):
            d[key] = [value[i] for i in keep]
    for key in INDEX_LISTS:
        if isinstance(d.get(key), list):
            d[key] = [new_index[int(x) % n] for x in d[key] if int(x) % n in new_index]
    overrides = _per_layer(d, n)
    if overrides:  # Gemma 4's global layers, DOTS3's indexed layers: kept layers' overrides, shrunk like the rest
        d["per_layer_config"] = {
            str(new_index[i]): _shrink_layer(layer) for i, layer in overrides.items() if i in new_index
        }
    for period, offset in (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset")):
        if d.get(period):  # Jamba: the pattern is periodic; a period of 2 keeps both kinds in two layers
            d[period], d[offset] = 2, 1
            keep = list(range(2))
    if isinstance(d.get("decoder_sparse_step"), int) and d["decoder_sparse_step"] > 1:
        sparse = [(i + 1) % d["decoder_sparse_step"] == 0 for i in keep]
        d["decoder_sparse_step"] = 1
        d["mlp_only_layers"] = sorted({*(j for j, s in enumerate(sparse) if not s), *d.get("mlp_only_layers", [])})
    if isinstance(d.get("first_k_dense_replace"), int):
        d["first_k_dense_replace"] = sum(1 for i in keep if i < d["first_k_dense_replace"])
    for key in aliased(LAYER_KEYS, aliases):
        if key in d:
            d[key] = len(keep)
    heads = next((d[k] for k in aliased(["num_attention_heads"], aliases) if d.get(k) is not None), None)
    kv_heads = d.get("num_key_value_heads")
    for key, value in SIZES.items():
        for name in aliased([key], aliases):
            if d.get(name) not in (None, 0):  # 0 switches a part off (no shared experts, no per-layer inputs)
                d[name] = value
    if isinstance(d.get("qk_rope_head_dim"), int):  # MLA: rotary dims are head_dim, queries/keys nope + rope wide
        if "head_dim" in d:
            d["head_dim"] = d["qk_rope_head_dim"]
        if "qk_head_dim" in d and isinstance(d.get("qk_nope_head_dim"), int):
            d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    if isinstance(d.get("num_kv_shared_layers"), int):  # layers reusing an earlier layer's KV: none in two layers
        d["num_kv_shared_layers"] = 0
    for canonical, cap in POSITION_CAPS.items():
        for key in aliased([canonical], aliases):
            if isinstance(d.get(key), int) and d[key] > cap:
                d[key] = cap
    for key, value in OFF.items():
        if key in d:
            d[key] = value
    if d.get("num_key_value_heads") is not None:  # keep grouped-query attention grouped
        grouped = isinstance(heads, int) and isinstance(kv_heads, int) and kv_heads < heads
        d["num_key_value_heads"] = HEADS // 2 if grouped else HEADS
    if "num_heads" in d and "num_attention_heads" not in d:  # a pure SSM (Mamba2): heads x head_dim = expand x hidden
        d["num_heads"] = 4
        d["head_dim"] = int(d.get("expand") or 2) * HIDDEN // 4
    if isinstance(d.get("num_experts_per_tok"), int):
        experts = [d[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if isinstance(d.get(k), int)]
        d["num_experts_per_tok"] = min([d["num_experts_per_tok"], *experts])
    for key in TOKEN_IDS:
        d[key] = _clamp_ids(d.get(key))
    return d, keep


def _shrink_layer(layer: dict[str, Any]) -> dict[str, Any]:
    """One layer's overrides, shrunk like the config (its key/value heads grouped where they were)."""
    out = {k: SIZES[k] if k in SIZES and v not in (None, 0) else v for k, v in layer.items()}
    kv, heads = layer.get("num_key_value_heads"), layer.get("num_attention_heads")
    if isinstance(kv, int) and kv > 0:
        out["num_key_value_heads"] = HEADS // 2 if isinstance(heads, int) and kv < heads else HEADS
    return out


def _per_layer(d: dict[str, Any], n: int) -> dict[int, dict[str, Any]]:
    """`per_layer_config` ({layer index (int or "05"): {field: value}}) by integer layer index; {} when absent."""
    raw = d.get("per_layer_config")
    if not isinstance(raw, dict):
        return {}
    out: dict[int, dict[str, Any]] = {}
    for key, value in raw.items():
        try:
            index = int(key) % max(n, 1)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            out[index] = value
    return out


def _n_layers(d: dict[str, Any], aliases: dict[str, str]) -> int:
    for key in aliased(LAYER_KEYS, aliases):
        if isinstance(d.get(key), int):
            return min(int(d[key]), MAX_LAYERS)  # the config's fields were checked (`check_fields`): a guard
    for key in ("layer_types", "layers_block_type"):
        if isinstance(d.get(key), list):
            return len(d[key])
    return 1


def _clamp_ids(value: Any) -> Any:
    if isinstance(value, int):
        return value % VOCAB
    if isinstance(value, list):
        return [int(v) % VOCAB for v in value if isinstance(v, int)]
    return value


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


def check_size(model: Any) -> None:
    """Refuse a shrunk model (built on the meta device) with more than MAX_PARAMS parameters, naming the largest."""
    params = dict(model.named_parameters())
    total = sum(int(p.numel()) for p in params.values())
    if total <= MAX_PARAMS:
        return
    name, biggest = max(params.items(), key=lambda kv: int(kv[1].numel()))
    raise InputError(
        f"the tiny model of this config would still have {total:,} parameters (largest: {name} "
        f"{list(biggest.shape)}), more than the audit's {MAX_PARAMS:,}: a size field it does not shrink is that large",
        hint="fix that field of config.json, or audit a config with the model's usual sizes",
    )
