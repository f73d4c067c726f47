"""`packtool stats PACKS --world-size W --micro-batches B --model CONFIG.json | --hidden-size H`: the
step efficiency of the plain and the balanced order, in text, --json (`step_efficiency`), the plot and
`packtool run`; the numbers are those of the samplers a training job builds; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import cli, cli_error, write_random_store

from packtool import CostModel
from packtool.core.balance import DEFAULT_WINDOW, step_costs
from packtool.errors import ConfigError
from packtool.loader import PackedDataset, PackedSampler

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"



@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pack store of long-tailed documents (lognormal mixture, a few longer than N) at N = 2048."""
    d = tmp_path_factory.mktemp("stats_balance")
    rng = np.random.default_rng(7)
    n = 1500
    lens = np.where(rng.random(n) < 0.85, rng.lognormal(np.log(120), 1.0, n), rng.lognormal(np.log(900), 1.2, n))
    store = write_random_store(d / "tokens", np.clip(lens, 1, 5000).astype(int).tolist())
    code, _, err = cli("pack", str(store), "--size", "2048", "--output", str(d / "out"), "--quiet")
    assert code == 0, err
    return d / "out"


def sampler_efficiency(ds: PackedDataset, world: int, micro: int, seed: int, balance: CostModel | None,
                       model: CostModel) -> tuple[float, float]:
    """(mean, p5) step efficiency of the orders the training job's samplers hand out, ranks built apart."""
    shares = [PackedSampler(ds, num_replicas=world, rank=r, seed=seed, balance=balance, micro_batches=micro).indices()
              for r in range(world)]
    order = np.empty(sum(s.size for s in shares), np.int64)
    for r, share in enumerate(shares):
        order[r::world] = share
    from packtool.formats.pack_store import open_pack_split

    ps = open_pack_split(ds.directory, ds.split, ds.size)
    ranks = step_costs(order, model.packs(np.asarray(ps.pack_offsets), np.asarray(ps.seg_lens)), world, micro)
    eff = ranks.mean(axis=1) / ranks.max(axis=1)
    return float(eff.mean()), float(np.percentile(eff, 5))


@pytest.mark.parametrize("micro", [1, 2])
def test_json_matches_the_samplers_a_job_builds(packs: Path, tmp_path: Path, micro: int) -> None:
    transformers = pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(transformers.LlamaConfig(hidden_size=256, num_attention_heads=4,
                                                          num_key_value_heads=2, intermediate_size=704,
                                                          num_hidden_layers=2).to_dict()))
    code, out, err = cli("stats", str(packs), "--world-size", "4", "--micro-batches", str(micro), "--model",
                         str(config), "--seed", "3", "--json")
    assert code == 0, err
    s = json.loads(out)["step_efficiency"]
    model = CostModel.from_config(config)
    assert s["cost_model"]["per_token"] == model.per_token and s["cost_model"]["source"] == str(config)
    ds = PackedDataset(packs)
    per_rank = -(-len(ds) // 4)  # padded by wrapping around to a multiple of the world size
    assert s["steps"] == -(-per_rank // micro)
    plain = sampler_efficiency(ds, 4, micro, 3, None, model)
    balanced = sampler_efficiency(ds, 4, micro, 3, model, model)
    assert (s["plain"]["mean"], s["plain"]["p5"]) == pytest.approx(plain)
    assert (s["balanced"]["mean"], s["balanced"]["p5"]) == pytest.approx(balanced)
    assert s["balanced"]["mean"] > s["plain"]["mean"] and s["time_saved"] > 0
    assert s["window"] == DEFAULT_WINDOW and s["max_moved_steps"] == DEFAULT_WINDOW - 1 and s["world_size"] == 4


def test_text_plot_and_hidden_size(packs: Path, tmp_path: Path) -> None:
    png = tmp_path / "steps.png"
    code, out, err = cli("stats", str(packs), "--world-size", "8", "--hidden-size", "1024", "--plot", str(png))
    assert code == 0, err
    assert "step efficiency (W=8, B=1" in out and "hidden size 1024" in out
    assert "plain     mean" in out and "balanced  mean" in out and "step time saved by balancing" in out
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 1000
    code, out, _ = cli("stats", str(packs), "--json")
    assert code == 0 and json.loads(out)["step_efficiency"] is None  # not asked: no cost model, no steps


def test_run_config_keys(packs: Path, tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"hidden_size": 512, "num_hidden_layers": 2,
                                                                "num_attention_heads": 8, "vocab_size": 100}))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"stats:\n  path: {packs}\n  world-size: 2\n  micro_batches: 2\n  model: model\n  json: true\n")
    code, out, err = cli("run", str(cfg), "-q")  # `model` resolves against the YAML file's directory
    assert code == 0, err
    s = json.loads(next(line for line in out.splitlines() if line.startswith("{")))["step_efficiency"]
    assert s["world_size"] == 2 and s["micro_batches"] == 2 and s["cost_model"]["source"].endswith("model")
    cfg.write_text(f"stats:\n  path: {packs}\n  world_size: 2\n  model: missing.json\n")
    code, _, err = cli("run", str(cfg), "-q")
    assert code == 1 and "does not exist" in err


def test_bad_flags_exit_2_and_bad_data_exit_1_with_one_line(packs: Path, tmp_path: Path) -> None:
    """Out-of-domain or contradictory flags are usage errors (exit 2), as everywhere else; a missing file is 1."""
    usage = lambda *a: cli_error("stats", str(packs), *a, code=2)  # noqa: E731
    assert "pass --model CONFIG.json or --hidden-size H" in usage("--world-size", "8")
    assert "pass --world-size too" in usage("--hidden-size", "64")
    assert "pass one of them" in usage("--world-size", "2", "--hidden-size", "64", "--model", str(tmp_path / "c.json"))
    for flag, value in (("--world-size", "0"), ("--world-size", "-1"), ("--micro-batches", "-1"),
                        ("--micro-batches", "0"), ("--hidden-size", "0")):  # fmt: skip
        args = {"--world-size": "2", "--hidden-size": "8", flag: value}
        assert f"{flag} must be an integer >= 1, got {value}" in usage(*(x for kv in args.items() for x in kv))
    # a width no model has: 10**200 was an OverflowError traceback in CostModel.from_shape
    line = usage("--world-size", "2", "--hidden-size", "1" + "0" * 200)
    assert "--hidden-size must be at most 2147483647 (no model is wider)" in line and len(line) < 300, line
    assert "does not exist" in cli_error("stats", str(packs), "--world-size", "2", "--model", str(tmp_path / "no.json"))
    tokens = packs.parent / "tokens"
    assert "pack it first" in cli_error("stats", str(tokens), "--world-size", "2", "--hidden-size", "8", code=2)


def test_world_size_is_bounded_by_the_store(packs: Path) -> None:
    """`--world-size 1000000000` on a store of fewer packs: a usage error naming the pack count, not 7.45 GiB."""
    n = json.loads(cli("stats", str(packs), "--json")[1])["n_packs"]
    line = cli_error("stats", str(packs), "--world-size", "1000000000", "--hidden-size", "8", code=2)
    assert f"--world-size 1000000000 is more ranks than the split has packs ({n})" in line
    assert f"pass --world-size {n} or fewer" in line
    code, out, err = cli("stats", str(packs), "--world-size", str(n), "--hidden-size", "8", "--json")
    assert code == 0 and json.loads(out)["step_efficiency"]["world_size"] == n, err
    # a step larger than the epoch: --micro-batches 10**30 was a ValueError traceback in numpy's reshape
    for micro in (str(n), "1" + "0" * 30):
        line = cli_error("stats", str(packs), "--world-size", "2", "--micro-batches", micro, "--hidden-size", "8", code=2)
        assert f"x --world-size 2 is more packs per step than the split has ({n})" in line, line
        assert f"pass --micro-batches {n // 2} or fewer" in line and len(line) < 300
    code, out, err = cli("stats", str(packs), "--world-size", "2", "--micro-batches", str(n // 2), "--hidden-size", "8")
    assert code == 0, err


BAD_FIELDS = [  # (config.json text, the field the error must name)
    ('{"hidden_size": "abc", "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": NaN, "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": [64], "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": 1e400, "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": 64.5, "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": true, "num_hidden_layers": 2}', "'hidden_size'"),
    ('{"hidden_size": 64, "num_hidden_layers": -2}', "'num_hidden_layers'"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_key_value_heads": "x"}', "'num_key_value_heads'"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "vocab_size": "big"}', "'vocab_size'"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "num_experts_per_tok": "two", "num_experts": 8}',
     "'num_experts_per_tok'"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": {"a": 1}}', "'intermediate_size'"),
    ('{"hidden_size": 64, "num_hidden_layers": 2, "head_dim": 1e30}', "'head_dim'"),
    ('{"text_config": {"hidden_size": "abc", "num_hidden_layers": 2}}', "'hidden_size'"),
]


@pytest.mark.parametrize(("text", "field"), BAD_FIELDS)
def test_a_bad_model_config_field_is_named_in_one_line(packs: Path, tmp_path: Path, text: str, field: str) -> None:
    config = tmp_path / "config.json"
    config.write_text(text)
    line = cli_error("stats", str(packs), "--world-size", "2", "--model", str(config))
    assert f"model config field {field} must be an integer from" in line and str(config) in line
    with pytest.raises(ConfigError, match=f"field {field}"):
        CostModel.from_config(config)


def test_integral_floats_and_per_layer_widths_are_read(tmp_path: Path) -> None:
    """`4096.0` is 4096; Gemma 3n's per-layer `intermediate_size` list costs as its mean (the same total)."""
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    plain = CostModel.from_config({**base, "intermediate_size": 96})
    assert CostModel.from_config({**base, "hidden_size": 64.0, "intermediate_size": 96.0}) == plain
    assert CostModel.from_config({**base, "intermediate_size": [64, 128]}) == plain


def test_a_model_config_that_is_no_small_regular_file_is_refused_unread(packs: Path, tmp_path: Path) -> None:
    """`--model /dev/zero` read forever (memory grows until killed); a 20 MB file is no config.json either."""
    big = tmp_path / "config.json"
    with open(big, "wb") as fh:
        fh.truncate(20 << 20)  # sparse: nothing is written
    line = cli_error("stats", str(packs), "--world-size", "2", "--model", str(big))
    assert "model config is not read: it is 20,971,520 bytes, more than such a file holds (16,777,216)" in line
    if Path("/dev/zero").exists():
        line = cli_error("stats", str(packs), "--world-size", "2", "--model", "/dev/zero")
        assert "model config is not read: it is not a regular file" in line and "/dev/zero" in line
