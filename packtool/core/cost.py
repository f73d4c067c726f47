"""`CostModel`: what a document, a segment or a pack costs a transformer, in FLOPs (torch-free).

A pack of N tokens always holds N tokens, but attention work grows with the square of each
segment's length: on a 7B-shaped model (h = 4096) a pack holding one 16k-token document costs a
third more than a pack of forty 400-token documents, and a data-parallel step waits for its
slowest rank. The model prices a segment of `s` tokens as

    cost(s) = per_token * s + per_token_sq * s**2

and a pack (or a batch of documents) as the sum over its segments. Per transformer layer, in
forward FLOPs (one multiply-add = 2 FLOPs), with hidden size h, `q` query heads and `k` key/value
heads of width d, and an MLP of width I:

- linear layers, per token: Q and O projections 2·2·h·q·d, K and V projections 2·2·h·k·d, the
  MLP 2·3·h·I when gated (SwiGLU: gate, up, down) or 2·2·h·I when not. With multi-head attention
  (q·d = k·d = h) and a plain 4h MLP this is the classic 24·h² per token;
- causal attention, per segment: scores (QKᵀ) and the weighted sum (AV) each take 2·q·d FLOPs per
  (query, key) pair and a causal segment has about s²/2 pairs, so 2·q·d·s² (= 2·h·s² with MHA).
  Grouped-query attention shrinks the K/V projections, never this term;
- once per token (not per layer): the LM head, 2·h·V for a vocabulary of V.

`from_shape` and `from_config` multiply by 3 for forward + backward (the backward pass costs about
twice the forward; `training=False` gives forward only). Any constant factor, this one or the layer
count, cancels in every ratio packtool reports (step efficiency = mean rank cost / max rank cost,
time saved); only per_token_sq / per_token (= s / (12·h) per token for the classic shape) decides
which packs are heavy. Measured coefficients (e.g. a fit of step times on your cluster against
Σs and Σs²) go straight into `CostModel(per_token, per_token_sq)`.

Not modelled: sliding-window attention (its cost stops growing quadratically past the window),
embedding lookups, norms and softmax (O(h) per token), and kernels' fixed per-segment overheads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.formats.model_config import MAX_SIZE, config_path, first_int, int_field, read_model_config

TRAINING_FACTOR = 3.0
"""Forward + backward ≈ 3 x forward (the backward computes gradients of activations and weights)."""

_NOT_GATED = frozenset(
    {"gpt2", "gpt_bigcode", "gpt_neox", "gptj", "gpt_neo", "opt", "bloom", "falcon", "phi", "starcoder2", "mpt"}
)
"""`model_type`s whose MLP is up -> activation -> down (two matrices); every other type with an
`intermediate_size` is taken as gated (gate, up, down: Llama, Mistral, Qwen, Gemma, ...)."""


@dataclass(frozen=True)
class CostModel:
    """Price of a segment of s tokens: `per_token * s + per_token_sq * s**2` (module docstring)."""

    per_token: float
    """Cost per token that does not depend on the segment's length (linear layers, LM head)."""
    per_token_sq: float
    """Cost per squared segment length (causal attention: 2·q·d FLOPs per layer, forward)."""

    def __post_init__(self) -> None:
        for name in ("per_token", "per_token_sq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise ConfigError(f"CostModel.{name} must be a number, got {value!r}, pass e.g. CostModel(1.0, 1e-4)")
            if not np.isfinite(value) or value < 0:
                raise ConfigError(f"CostModel.{name} must be finite and >= 0, got {value!r}, pass a measured cost")
        if self.per_token == 0 and self.per_token_sq == 0:
            raise ConfigError("CostModel has both coefficients 0, CostModel, give at least one a positive value")
        object.__setattr__(self, "per_token", float(self.per_token))
        object.__setattr__(self, "per_token_sq", float(self.per_token_sq))

    # -- presets ---------------------------------------------------------------------------
    @classmethod
    def from_shape(
        cls,
        hidden_size: int,
        num_layers: int = 1,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        *,
        head_dim: int | None = None,
        intermediate_size: int | None = None,
        gated_mlp: bool | None = None,
        vocab_size: int = 0,
        training: bool = True,
    ) -> CostModel:
        """The FLOP model of a decoder of this shape (module docstring for the formulas).

        Defaults give the classic shape: multi-head attention and a plain 4h MLP, so
        `CostModel.from_shape(h)` is 24·h² per token and 2·h per squared segment length per
        layer (times 3 with `training`). `intermediate_size` without `gated_mlp` is taken as gated.
        """
        h = _positive(hidden_size, "hidden_size")
        layers = _positive(num_layers, "num_layers")
        heads = _positive(num_heads, "num_heads") if num_heads is not None else None
        if head_dim is not None:
            d = _positive(head_dim, "head_dim")
            q = heads if heads is not None else max(1, h // d)
        else:
            q = heads if heads is not None else 1
            d = h // q if heads is not None else h
            if d < 1:
                raise ConfigError(f"num_heads {q} exceeds hidden_size {h}, CostModel.from_shape, pass head_dim")
        kv = _positive(num_kv_heads, "num_kv_heads") if num_kv_heads is not None else q
        if intermediate_size is None:
            width, gated = 4 * h, bool(gated_mlp) if gated_mlp is not None else False
        else:
            width, gated = _positive(intermediate_size, "intermediate_size"), True if gated_mlp is None else gated_mlp
        vocab = int(vocab_size)
        if vocab < 0:
            raise ConfigError(f"vocab_size must be >= 0, got {vocab}, CostModel.from_shape, pass the vocabulary size")
        attn_proj = 2 * 2 * h * q * d + 2 * 2 * h * kv * d
        mlp = 2 * (3 if gated else 2) * h * width
        per_token = layers * (attn_proj + mlp) + 2 * h * vocab
        per_token_sq = layers * 2 * q * d
        factor = TRAINING_FACTOR if training else 1.0
        return cls(factor * per_token, factor * per_token_sq)

    @classmethod
    def from_config(cls, config: str | os.PathLike[str] | dict[str, Any], *, training: bool = True) -> CostModel:
        """The FLOP model of a transformers `config.json` (a path, a model directory or the dict).

        Reads `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`
        (grouped-query attention), `head_dim`, `intermediate_size`, `vocab_size` (and GPT-2's
        `n_embd`/`n_layer`/`n_head`/`n_inner`); a mixture of experts counts the MLPs of the
        `num_experts_per_tok` experts a token visits (`moe_intermediate_size` when given) plus a
        shared expert. A multimodal config's `text_config` is used when the top level has no
        hidden size.
        """
        where = "CostModel.from_config"
        if isinstance(config, dict):
            raw: Any = config
        else:
            where = str(config_path(config))
            raw = read_model_config(config)
        if not isinstance(raw, dict):
            raise ConfigError(f"model config is not a JSON object, {where}, pass a transformers config.json")
        if first_int(raw, _HIDDEN, where) is None and isinstance(raw.get("text_config"), dict):
            raw = raw["text_config"]
        hidden = first_int(raw, _HIDDEN, where)
        layers = first_int(raw, _LAYERS, where)
        if hidden is None or layers is None:
            missing = "hidden_size" if hidden is None else "num_hidden_layers"
            raise ConfigError(
                f"model config has no {missing}, {where}, pass a transformers config.json of a decoder model"
            )
        heads = first_int(raw, _HEADS, where)
        kv = first_int(raw, ("num_key_value_heads", "num_kv_heads"), where, low=0) or None  # 0: not given
        if kv is None and raw.get("multi_query"):
            kv = 1
        width = _width(raw, where)
        experts = int_field(raw, "num_experts_per_tok", where, low=0)
        n_experts = [int_field(raw, k, where, low=0) for k in ("num_local_experts", "num_experts")]
        if experts and any(n_experts):
            per_expert = int_field(raw, "moe_intermediate_size", where, low=0) or width
            if per_expert:
                shared = int_field(raw, "shared_expert_intermediate_size", where, low=0) or 0
                width = int(experts) * int(per_expert) + int(shared)  # type: ignore[arg-type]
        gated = None if width is None else str(raw.get("model_type", "")) not in _NOT_GATED
        return cls.from_shape(
            hidden,
            layers,
            heads,
            kv,
            head_dim=first_int(raw, ("head_dim",), where),
            intermediate_size=width,
            gated_mlp=gated,
            vocab_size=first_int(raw, ("vocab_size",), where, low=0) or 0,
            training=training,
        )

    @classmethod
    def coerce(cls, value: Any, where: str) -> CostModel:
        """`value` as a CostModel: a CostModel, a `(per_token, per_token_sq)` pair, or any object with
        those two attributes (a cost model of another library); anything else is refused."""
        if isinstance(value, CostModel):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        if hasattr(value, "per_token") and hasattr(value, "per_token_sq"):
            return cls(value.per_token, value.per_token_sq)
        raise ConfigError(
            f"balance must be a packtool.CostModel, got {type(value).__name__}, {where}, pass e.g. CostModel.from_config('config.json')"
        )

    # -- prices ----------------------------------------------------------------------------
    def document(self, length: Any) -> Any:
        """Cost of a document (or segment) of `length` tokens; an array of lengths gives an array."""
        s = np.asarray(length, dtype=np.float64)
        out = self.per_token * s + self.per_token_sq * s * s
        return float(out) if out.ndim == 0 else out

    def pack(self, seg_lens: Any) -> float:
        """Cost of one pack (or one batch of documents): the sum over its segments' lengths."""
        s = np.asarray(seg_lens, dtype=np.int64).reshape(-1)
        return float(self.combine(np.array([s.sum()]), np.array([(s * s).sum()]))[0])

    def packs(self, pack_offsets: np.ndarray, seg_lens: np.ndarray, prefix: np.ndarray | None = None) -> np.ndarray:
        """float64 cost of every pack of a CSR segment table (`seg_lens[pack_offsets[p]:pack_offsets[p+1]]`).

        `prefix` (per segment, optional): tokens of another segment the segment's queries also attend (a
        shared-prompt completion's prompt, `formats.pack_store.attended_prefix`); its attention term is then
        `(prefix + s)² - prefix²`, what the completion adds to its prompt's causal attention."""
        return self.combine(*segment_sums(pack_offsets, seg_lens, prefix=prefix))

    def combine(self, tokens: np.ndarray, squares: np.ndarray) -> np.ndarray:
        """Costs from exact integer sums: `per_token * Σs + per_token_sq * Σs²` (one float op each,
        so every process on every machine gets bit-identical costs from the same sums)."""
        return self.per_token * np.asarray(tokens, np.float64) + self.per_token_sq * np.asarray(squares, np.float64)

    def to_dict(self) -> dict[str, float]:
        return {"per_token": self.per_token, "per_token_sq": self.per_token_sq}


def segment_sums(
    pack_offsets: np.ndarray, seg_lens: np.ndarray, block: int = 1 << 20, prefix: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`(Σs, Σs²)` per pack as exact int64, vectorised over a CSR segment table (empty packs give 0); with
    `prefix` (tokens each segment also attends outside itself) a segment's square is `s² + 2·prefix·s`.

    Reads `seg_lens` (a memory map is fine) in blocks of `block` packs, so the int64 temporaries
    stay bounded whatever the store's size."""
    po = np.asarray(pack_offsets, dtype=np.int64)
    if po.ndim != 1 or po.size < 1 or int(po[-1]) > len(seg_lens) or (po.size > 1 and np.any(np.diff(po) < 0)):
        raise ConfigError(
            f"pack_offsets ({po.size} entries) do not index {len(seg_lens)} segments, CostModel.packs, pass a pack store's CSR arrays"
        )
    n = po.size - 1
    tokens = np.zeros(n, np.int64)
    squares = np.zeros(n, np.int64)
    for a in range(0, n, block):
        b = min(a + block, n)
        s = np.asarray(seg_lens[po[a] : po[b]], dtype=np.int64)
        rel = po[a : b + 1] - po[a]
        cum = np.concatenate(([0], np.cumsum(s)))
        tokens[a:b] = cum[rel[1:]] - cum[rel[:-1]]
        sq = s * s
        if prefix is not None:
            sq += 2 * s * np.asarray(prefix[po[a] : po[b]], dtype=np.int64)
        cum = np.concatenate(([0], np.cumsum(sq)))
        squares[a:b] = cum[rel[1:]] - cum[rel[:-1]]
    return tokens, squares


_HIDDEN = ("hidden_size", "n_embd", "d_model")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads")
_WIDTH = ("intermediate_size", "n_inner", "ffn_dim")


def _width(raw: dict[str, Any], where: str) -> int | None:
    """The MLP width; a per-layer list (Gemma 3n) counts as its mean, which gives the same total cost."""
    for key in _WIDTH:
        if raw.get(key) is not None:
            value = int_field(raw, key, where, per_layer=True)
            return round(sum(value) / len(value)) if isinstance(value, list) else value
    return None


def _positive(value: Any, name: str) -> int:
    """A model width as an int in 1..MAX_SIZE: a larger one (10**200) overflowed the float cost, a traceback."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= MAX_SIZE:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConfigError(
            f"{name} must be an integer from 1 to {MAX_SIZE}, got {shown}, CostModel.from_shape, pass the model's {name}"
        )
    return int(value)
