"""The shipped tiny VLM folder and the Trainer recipe (scripts/train_vision.py), met as a user meets them.

- data/sample/vision_model/qwen2_vl_tiny is exactly what scripts/make_vision_model.py writes;
- LLaMA-Factory's mllm demo tokenized with it, packed under a patch budget, loaded with PackedDataset and
  collated with PackedCollator(flatten=True, keys=HF_KEYS) runs through the model the recipe builds
  (random weights from config.json, seed 0) and equals each record alone (float64, "packtool");
- the recipe trains 2 steps (transformers Trainer, needs accelerate) and refuses what it cannot train on
  in one line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "data" / "sample" / "vision_model" / "qwen2_vl_tiny"
DEMO = ROOT / "data" / "sample" / "vision" / "mllm_demo.json"
SCRIPT = ROOT / "scripts" / "train_vision.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def load_script(name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "scripts" / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vtrain")
    code, _, err = cli("tokenize", str(DEMO), "--format", "auto", "--tokenizer", str(SHIPPED), "--output",
                       str(root / "s"), "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = cli("pack", str(root / "s"), "--size", "512", "--vision-budget", "256", "--output",
                       str(root / "p"), "-q")  # fmt: skip
    assert code == 0, err
    return root / "p"


def test_the_shipped_folder_is_what_the_script_builds(tmp_path: Path) -> None:
    load_script("make_vision_model.py").build(tmp_path)
    shipped = sorted(p.name for p in SHIPPED.iterdir() if p.is_file() and p.name != "README.md")
    assert shipped == sorted(p.name for p in tmp_path.iterdir())
    for name in shipped:
        assert (tmp_path / name).read_bytes() == (SHIPPED / name).read_bytes(), name
    assert sum((SHIPPED / n).stat().st_size for n in shipped) < 32_000  # a few KB, no weights
    assert not any(SHIPPED.glob("*.safetensors")) and not any(SHIPPED.glob("*.bin"))


def test_packed_demo_batches_equal_each_record_alone_in_the_recipes_model(packs: Path) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import packtool.hf  # noqa: F401
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset

    recipe = load_script("train_vision.py")
    model = recipe.build_model(SHIPPED, "packtool", 0).to(torch.float64)
    again = recipe.build_model(SHIPPED, "packtool", 0)
    assert all(torch.equal(a.double(), b) for a, b in zip(again.parameters(), model.parameters(), strict=True))
    ds = PackedDataset(packs)
    batch = PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS)([ds[i] for i in range(len(ds))])
    assert batch["position_ids"].shape == (4, *batch["input_ids"].shape)
    batch["pixel_values"] = batch["pixel_values"].double()
    with torch.no_grad():
        logits = model(**batch, use_cache=False).logits[0]
    image = model.config.image_token_id
    cu = batch["cu_seq_lens_q"].tolist()
    ids = batch["input_ids"][0]
    rows = grids = 0
    worst = 0.0
    n_docs = 0
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        doc = ids[a:b]
        if int((batch["labels"][0, a:b] != -100).sum()) == 0 and not bool((doc == image).any()):
            continue  # a pack's padding segment
        k = int(((doc[1:] == image) & (doc[:-1] != image)).sum()) + int(doc[0] == image)
        alone = {"input_ids": doc[None], "mm_token_type_ids": (doc == image).int()[None]}
        if k:
            grid = batch["image_grid_thw"][grids : grids + k]
            n = int(grid.prod(-1).sum())
            alone.update(pixel_values=batch["pixel_values"][rows : rows + n], image_grid_thw=grid)
            rows, grids = rows + n, grids + k
        with torch.no_grad():
            want = model(**alone, use_cache=False).logits[0]
        worst = max(worst, float((logits[a:b] - want).abs().max() / want.abs().max()))
        n_docs += 1
    assert n_docs == 6 and grids == len(batch["image_grid_thw"]) == 8
    assert worst < 1e-6


def test_the_trainer_recipe_trains_two_steps(packs: Path, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, str(SCRIPT), str(packs), "--model-dir", str(SHIPPED), "--steps", "2",
                           "--batch-size", "1", "--output-dir", str(tmp_path / "run"), "--json"],
                          capture_output=True, text=True, env=ENV, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["trainer"] == "hf" and got["steps"] == 2 and len(got["losses"]) == 2
    assert all(3.0 < loss < 8.0 for loss in got["losses"])  # ln(384) = 5.95 for random weights


def run_script(*args: str, hide: str = "") -> subprocess.CompletedProcess[str]:
    code = (f"import runpy, sys; {hide} sys.argv = ['train_vision.py', *{list(args)!r}];"
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")  # fmt: skip
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return lines[0]


def test_without_accelerate_the_recipe_names_the_extra(packs: Path) -> None:
    line = one_line(run_script(str(packs), "--model-dir", str(SHIPPED), hide="sys.modules['accelerate'] = None;"))
    assert line.startswith("error: accelerate not installed") and 'pip install "packtool[hf]"' in line


def test_the_recipe_refuses_a_folder_without_config_and_text_only_packs(packs: Path, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    line = one_line(run_script(str(packs), "--model-dir", str(tmp_path)))
    assert "has no config.json" in line
    chats = (ROOT / "data" / "sample" / "chat.jsonl").read_text("utf-8").splitlines()[:4]
    (tmp_path / "chat.jsonl").write_text("\n".join(chats) + "\n", "utf-8")
    code, _, err = cli("tokenize", str(tmp_path / "chat.jsonl"), "--format", "chat", "--tokenizer",
                       str(ROOT / "data" / "sample" / "tokenizer"), "--output", str(tmp_path / "t"), "-q")  # fmt: skip
    assert code == 0, err
    assert cli("pack", str(tmp_path / "t"), "--size", "2048", "--output", str(tmp_path / "tp"), "-q")[0] == 0
    assert "text-only pack store" in one_line(run_script(str(tmp_path / "tp"), "--model-dir", str(SHIPPED)))


def test_a_vision_store_batch_without_images_runs_through_the_model(tmp_path: Path) -> None:
    """Text-only records tokenized with the VLM folder: the batch has no pixel keys, and the recipe's model runs
    (it failed on pixel_values of 0 rows before PackedCollator left them out)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import packtool.hf  # noqa: F401
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset

    chats = (ROOT / "data" / "sample" / "chat.jsonl").read_text("utf-8").splitlines()[:2]
    (tmp_path / "chat.jsonl").write_text("\n".join(chats) + "\n", "utf-8")
    assert cli("tokenize", str(tmp_path / "chat.jsonl"), "--format", "chat", "--tokenizer", str(SHIPPED),
               "--output", str(tmp_path / "t"), "-q")[0] == 0  # fmt: skip
    assert cli("pack", str(tmp_path / "t"), "--size", "2048", "--output", str(tmp_path / "p"), "-q")[0] == 0
    ds = PackedDataset(tmp_path / "p")
    batch = PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS)([ds[0]])
    assert "pixel_values" not in batch and batch["position_ids"].shape[0] == 4
    model = load_script("train_vision.py").build_model(SHIPPED, "packtool", 0)
    with torch.no_grad():
        assert torch.isfinite(model(**batch, use_cache=False).logits).all()
