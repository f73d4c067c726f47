"""TRL's SFTTrainer on packtool's packed image batches (scripts/train_vision.py --trainer trl), TRL 1.16.

TRL refuses `packing` and `padding_free` for image datasets. The recipe hands TRL our batches instead: its
dataset is the pack indices (no image column, nothing to prepare: `skip_prepare_dataset`), its collator
reads those packs from `PackedDataset` and collates them with `PackedCollator(flatten=True, keys=HF_KEYS)`.
Same model (the shipped tiny Qwen2-VL folder, seed 0), same sampler order: the loss of every step equals
the transformers `Trainer` recipe's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli

pytestmark = pytest.mark.interop

pytest.importorskip("trl")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "data" / "sample" / "vision_model" / "qwen2_vl_tiny"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def train(packs: Path, out: Path, trainer: str) -> list[float]:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_vision.py"), str(packs), "--model-dir",
                           str(SHIPPED), "--trainer", trainer, "--steps", "3", "--batch-size", "1", "--output-dir",
                           str(out / trainer), "--json"], capture_output=True, text=True, env=ENV, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["trainer"] == trainer and got["steps"] == 3
    return list(got["losses"])


def test_sft_trainer_on_our_packed_image_batches_equals_the_trainer_recipe(tmp_path: Path) -> None:
    demo = ROOT / "data" / "sample" / "vision" / "mllm_demo.json"
    assert cli("tokenize", str(demo), "--format", "auto", "--tokenizer", str(SHIPPED), "--output",
               str(tmp_path / "s"), "-q")[0] == 0  # fmt: skip
    assert cli("pack", str(tmp_path / "s"), "--size", "512", "--vision-budget", "256", "--output",
               str(tmp_path / "p"), "-q")[0] == 0  # fmt: skip
    hf = train(tmp_path / "p", tmp_path, "hf")
    trl = train(tmp_path / "p", tmp_path, "trl")
    assert len(hf) == len(trl) == 3
    # float32 training: equal to a few float32 roundings (the first step measured bit-equal)
    assert all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(trl, hf, strict=True)), (trl, hf)
    assert hf[0] != hf[-1]  # the steps did train
