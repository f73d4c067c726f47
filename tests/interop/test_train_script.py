"""scripts/train_hf_trainer.py as docs/HF.md runs it: "final loss" is the last step's loss, the mean is labelled."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _stores import SAMPLE
from support import cli

pytestmark = pytest.mark.interop

pytest.importorskip("accelerate")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def test_final_loss_is_the_last_steps_and_the_mean_is_named(tmp_path: Path) -> None:
    for args in (("tokenize", str(SAMPLE / "prompt_completion.jsonl"), "--format", "prompt-completion",
                  "--tokenizer", str(SAMPLE / "tokenizer"), "--output", str(tmp_path / "s"), "-q"),
                 ("pack", str(tmp_path / "s"), "--size", "256", "--output", str(tmp_path / "p"), "-q")):  # fmt: skip
        code, _, err = cli(*args)
        assert code == 0, err
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_hf_trainer.py"), str(tmp_path / "p"),
                           "--steps", "3", "--output-dir", str(tmp_path / "run")], capture_output=True, text=True,
                          cwd=tmp_path, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r"trained 3 steps, final loss ([\d.]+) \(step 3\), mean loss ([\d.]+)", done.stdout)
    assert found, done.stdout
    logged = [float(x) for x in re.findall(r"'loss': '?([\d.]+)", done.stdout + done.stderr)]
    assert len(logged) == 3, (done.stdout, done.stderr[-2000:])
    final, mean = float(found.group(1)), float(found.group(2))
    assert final == pytest.approx(logged[-1], abs=1e-3)
    assert mean == pytest.approx(sum(logged) / 3, abs=2e-3)
    assert final != pytest.approx(mean, abs=1e-4)  # the two are different numbers, and each is named
