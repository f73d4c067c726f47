"""`packtool.CostModel`: the FLOP formulas by hand, presets from transformers' own config classes
(dense, grouped-query, mixture of experts, GPT-2 names, nested text configs), prices of documents and
packs, the issue's worked example, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from packtool import CostModel
from packtool.core.balance import epoch_order, step_costs, step_efficiency
from packtool.core.cost import segment_sums
from packtool.errors import ConfigError


def save(tmp_path: Path, config: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config.to_dict() if hasattr(config, "to_dict") else config))
    return path


def test_classic_shape_is_24_h_squared_and_2_h_per_layer() -> None:
    h = 4096
    fwd = CostModel.from_shape(h, training=False)
    assert fwd.per_token == 24 * h * h and fwd.per_token_sq == 2 * h
    train = CostModel.from_shape(h, num_layers=32)
    assert train.per_token == 3 * 32 * 24 * h * h and train.per_token_sq == 3 * 32 * 2 * h


def test_prices_of_documents_and_packs() -> None:
    m = CostModel(2.0, 0.5)
    assert m.document(10) == 2 * 10 + 0.5 * 100
    np.testing.assert_array_equal(m.document(np.array([0, 4])), [0.0, 8 + 8])
    assert m.pack([10, 4]) == m.document(10) + m.document(4)
    po, lens = np.array([0, 2, 2, 3]), np.array([10, 4, 7], np.int32)  # pack 1 is empty
    np.testing.assert_array_equal(m.packs(po, lens), [m.pack([10, 4]), 0.0, m.document(7)])


def test_segment_sums_are_exact_in_any_block_size() -> None:
    """Σs and Σs² per pack, read in blocks of packs (bounded memory on big stores), equal a plain loop."""
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 5, size=300)
    po = np.concatenate(([0], np.cumsum(counts)))
    lens = rng.integers(1, 1 << 17, size=int(po[-1])).astype(np.int32)  # s² overflows int32
    want = [(int(lens[a:b].astype(np.int64).sum()), int((lens[a:b].astype(np.int64) ** 2).sum()))
            for a, b in zip(po[:-1], po[1:], strict=True)]
    for block in (1, 7, 1 << 20):
        tokens, squares = segment_sums(po, lens, block)
        assert list(zip(tokens.tolist(), squares.tolist(), strict=True)) == want


def test_the_issues_worked_example() -> None:
    """h = 4096: one 16k-token document costs about a third more than forty 400-token documents."""
    m = CostModel.from_shape(4096)
    ratio = m.pack([16384]) / m.pack([400] * 40)
    assert ratio == pytest.approx(16384 / 16000 * (1 + 16384 / (12 * 4096)) / (1 + 400 / (12 * 4096)))
    assert 1.3 < ratio < 1.4


def _expected(h: int, layers: int, q: int, kv: int, d: int, width: int, gated: bool, vocab: int) -> tuple[float, float]:
    per_token = layers * (4 * h * q * d + 4 * h * kv * d + 2 * (3 if gated else 2) * h * width) + 2 * h * vocab
    return 3.0 * per_token, 3.0 * layers * 2 * q * d


def test_from_config_of_transformers_llama_and_qwen2(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    llama = CostModel.from_config(save(tmp_path, transformers.LlamaConfig()))
    assert (llama.per_token, llama.per_token_sq) == _expected(4096, 32, 32, 32, 128, 11008, True, 32000)
    qwen = CostModel.from_config(save(tmp_path, transformers.Qwen2Config()))  # head_dim absent: h / heads
    assert (qwen.per_token, qwen.per_token_sq) == _expected(4096, 32, 32, 32, 128, 22016, True, 151936)
    assert CostModel.from_config(tmp_path) == qwen  # a model directory holding config.json
    assert CostModel.from_config(transformers.Qwen2Config().to_dict()) == qwen  # or the dict itself


def test_grouped_query_attention_and_experts(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    small = {"num_hidden_layers": 2, "vocab_size": 1000}
    mha = CostModel.from_config(transformers.LlamaConfig(num_key_value_heads=32, **small).to_dict())
    gqa = CostModel.from_config(transformers.LlamaConfig(num_key_value_heads=8, **small).to_dict())
    assert gqa.per_token < mha.per_token and gqa.per_token_sq == mha.per_token_sq  # GQA never cuts attention
    assert mha.per_token - gqa.per_token == 3 * 2 * 4 * 4096 * (32 - 8) * 128
    mixtral = CostModel.from_config(save(tmp_path, transformers.MixtralConfig()))  # 2 of 8 experts per token
    assert mixtral.per_token == _expected(4096, 32, 32, 8, 128, 2 * 14336, True, 32000)[0]
    qwen_moe = CostModel.from_config(transformers.Qwen3MoeConfig().to_dict())  # 8 experts of 768
    assert qwen_moe.per_token == _expected(2048, 24, 32, 4, 64, 8 * 768, True, 151936)[0]


def test_gpt2_names_and_a_plain_mlp(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    gpt2 = CostModel.from_config(save(tmp_path, transformers.GPT2Config()))
    assert (gpt2.per_token, gpt2.per_token_sq) == _expected(768, 12, 12, 12, 64, 4 * 768, False, 50257)


def test_multimodal_text_config_and_explicit_head_dim() -> None:
    text = {"hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 256,
            "intermediate_size": 1024, "vocab_size": 10}
    m = CostModel.from_config({"model_type": "some_vlm", "text_config": text}, training=False)
    assert m.per_token_sq == 2 * 2 * 4 * 256  # q·d = 1024 != h: the query width counts, not h
    assert m.per_token == 2 * (4 * 512 * 1024 + 4 * 512 * 1024 + 6 * 512 * 1024) + 2 * 512 * 10


def test_constant_factors_cancel_in_step_efficiency() -> None:
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 4000, size=600)
    po = np.arange(0, 601, 3)
    a, b = CostModel(7.0, 0.01), CostModel(21.0, 0.03)
    order = epoch_order(200, 0, 0, world=4)
    ea = step_efficiency(step_costs(order, a.packs(po, lens), 4))
    eb = step_efficiency(step_costs(order, b.packs(po, lens), 4))
    assert ea.mean == pytest.approx(eb.mean) and ea.p5 == pytest.approx(eb.p5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1.0, 1.0), "per_token must be finite and >= 0"),
        ((1.0, float("nan")), "per_token_sq must be finite"),
        ((0, 0), "both coefficients 0"),
        (("1", 0), "must be a number"),
    ],
)
def test_bad_coefficients_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CostModel(*args)


def test_bad_configs_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        CostModel.from_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read the model config"):
        CostModel.from_config(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="has no hidden_size"):
        CostModel.from_config({"num_hidden_layers": 2})
    with pytest.raises(ConfigError, match="not a JSON object"):
        CostModel.from_config(save(tmp_path, [1, 2], "list.json"))
    with pytest.raises(ConfigError, match="hidden_size must be an integer from 1 to 2147483647, got 0"):
        CostModel.from_shape(0)
    with pytest.raises(ConfigError, match=r"hidden_size must be an integer from 1 to 2147483647, got 1000.*\.\.\."):
        CostModel.from_shape(10**200)  # was an OverflowError (int too large to convert to float)
    with pytest.raises(ConfigError, match="do not index"):
        CostModel(1, 1).packs(np.array([0, 5]), np.array([1, 2]))
