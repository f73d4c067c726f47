"""docs/HF.md's reward-model plain loop, run as written, and scripts/train_reward.py on the sample pairs.

The packs are the DPO pack store of the docs (`data/sample/preference.jsonl`, the sample tokenizer,
`pack --size 4096`, with `--share-prompt`, and without it but with `--pad-multiple 8`), made in tmp_path with `data/` linked beside them
so the recipe's relative paths resolve as they do in a checkout.
"""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
from support import cli

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]


def reward_blocks() -> list[str]:
    text = (ROOT / "docs" / "HF.md").read_text()
    section = text[text.index("## Reward models on the same packs") :]
    section = section[: section.index("\n## ", 5)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("reward")
    (work / "data").symlink_to(ROOT / "data")
    code, _, err = cli("tokenize", str(ROOT / "data/sample/preference.jsonl"), "--format", "preference",
                       "--tokenizer", str(ROOT / "data/sample/tokenizer"), "--output", str(work / "tokens"), "-q")  # fmt: skip
    assert code == 0, err
    for name, extra in (("packs", ("--share-prompt",)), ("packs_pairs", ("--pad-multiple", "8"))):
        code, _, err = cli("pack", str(work / "tokens"), "--size", "4096", *extra, "--output", str(work / name), "-q")
        assert code == 0, err
    return work


def test_the_plain_loop_recipe_runs_as_written(workdir: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    blocks = reward_blocks()
    assert len(blocks) == 2 and "PackedRewardTrainer" in blocks[1]  # the TRL one runs under `make interop`
    monkeypatch.chdir(workdir)
    scope: dict = {"__name__": "__recipe__"}
    exec(compile(blocks[0], "docs/HF.md (reward plain loop)", "exec"), scope)
    out = capsys.readouterr().out
    assert re.fullmatch(r"reward loss \d+\.\d{4}, accuracy \d\.\d\d\n", out), out
    scores = scope["scores"]
    assert scores.pair_ids.numel() > 10 and bool((scores.chosen_position > 0).all())
    model = scope["model"]
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("packs", [pytest.param("packs", marks=pytest.mark.slow), "packs_pairs"])  # ~25 s each
def test_train_reward_script_steps(workdir: Path, packs: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["train_reward.py", str(workdir / packs), "--steps", "2", "--batch-size", "1", "--center", "0.01"])
    runpy.run_path(str(ROOT / "scripts" / "train_reward.py"), run_name="__main__")
    lines = capsys.readouterr().out.splitlines()
    layout = "shared prompt" if packs == "packs" else "pairs"
    assert f"({layout}), tiny random Llama reward model" in lines[0] and "not pad id 1" in lines[0], lines
    assert [line.split(":")[0] for line in lines[1:]] == ["step 1", "step 2"], lines
    assert all(re.search(r"\d+ pairs, reward loss \d+\.\d{4}, accuracy \d\.\d\d, margin [+-]\d\.\d{4}$", x)
               for x in lines[1:])  # fmt: skip


def test_train_reward_script_refuses_a_plain_store_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "one two three"}\n{"text": "four five"}\n')
    code, _, err = cli("tokenize", str(text), "--tokenizer", str(ROOT / "data/sample/tokenizer"),
                       "--output", str(tmp_path / "s"), "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = cli("pack", str(tmp_path / "s"), "--size", "64", "--output", str(tmp_path / "p"), "-q")
    assert code == 0, err
    monkeypatch.setattr(sys, "argv", ["train_reward.py", str(tmp_path / "p")])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "scripts" / "train_reward.py"), run_name="__main__")
    assert str(exc.value).startswith("error: ") and "is not a preference pack store" in str(exc.value)
