"""What a new user met on a fresh clone (after issue 34): `stats --plot` says where the PNG went, and a
choice typed in the wrong case is named back in the right one, a chat file tokenized without `--format` is told
which format reads it, and the training scripts of `make demo` say what their numbers are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import cli, cli_error, write_random_store

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_stats_plot_says_where_it_wrote_and_json_stays_one_object(tmp_path: Path) -> None:
    store = write_random_store(tmp_path / "s", [300, 100, 100, 50])
    png = tmp_path / "waste.png"
    code, out, err = cli("stats", str(store), "--size", "512", "--plot", str(png))
    assert code == 0, err
    assert err.strip() == f"plot -> {png}" and png.read_bytes()[:8] == PNG_SIGNATURE
    code, out, err = cli("stats", str(store), "--size", "512", "--json", "--plot", str(png))
    assert code == 0 and json.loads(out)["n_documents"] == 4 and f"plot -> {png}" in err


def test_a_choice_in_the_wrong_case_is_suggested() -> None:
    line = cli_error("pack", "store", "--size", "64", "--output", "out", "--algorithm", "BFD", code=2)
    assert "did you mean 'bfd'?" in line, line
    line = cli_error("tokenize", "in.jsonl", "--tokenizer", "t", "--output", "o", "--format", "Chat", code=2)
    assert "did you mean 'chat'?" in line, line


def test_a_record_of_another_shape_names_the_format_that_reads_it(tmp_path: Path) -> None:
    tok = Path(__file__).resolve().parent.parent / "data" / "sample" / "tokenizer"
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
                    + "\n")  # fmt: skip
    line = cli_error("tokenize", str(chat), "--tokenizer", str(tok), "--output", str(tmp_path / "a"), "-q")
    assert "missing field 'text' (the record is chat: pass --format chat, or --format auto)" in line, line
    assert f"{chat}:1" in line
    line = cli_error("tokenize", str(chat), "--format", "prompt-completion", "--tokenizer", str(tok), "--output",
                     str(tmp_path / "b"), "-q")  # fmt: skip
    assert "missing field 'prompt' (the record is chat: pass --format chat" in line, line
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"body": "x"}) + "\n")  # no shape of its own: nothing to suggest
    line = cli_error("tokenize", str(other), "--tokenizer", str(tok), "--output", str(tmp_path / "c"), "-q")
    assert line.startswith("error: bad record: missing field 'text', ") and "--format" not in line, line


def test_an_over_long_pair_names_its_token_store(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    pairs = tmp_path / "pairs"
    code, _, err = cli("tokenize", str(root / "data/sample/preference.jsonl"), "--format", "preference",
                       "--tokenizer", str(root / "data/sample/tokenizer"), "--output", str(pairs), "-q")  # fmt: skip
    assert code == 0, err
    line = cli_error("pack", str(pairs), "--size", "256", "--output", str(tmp_path / "p"), "-q")
    assert f"over-long pairs in all), {pairs}, a pair cannot be split" in line, line


def _figure(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """Run `stats ... --plot` and keep the matplotlib figure it saved (as tests/test_stats_explain.py does)."""
    import matplotlib.figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    saved: list[Any] = []
    original = matplotlib.figure.Figure.savefig

    def keep(self: Any, *a: Any, **k: Any) -> None:
        saved.append(self)
        original(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    code, _, err = cli("stats", *args)
    assert code == 0, err
    (fig,) = saved
    FigureCanvasAgg(fig).draw()
    return fig


def test_pack_fill_bars_agree_with_the_title_and_counts_tick_as_integers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo`'s chat packs (2048, --pad-multiple 8): a bar straddling 99% read 39 under a title of 38."""
    root = Path(__file__).resolve().parent.parent
    code, _, err = cli("tokenize", str(root / "data/sample/chat.jsonl"), "--format", "chat", "--tokenizer",
                       str(root / "data/sample/tokenizer"), "--output", str(tmp_path / "t"), "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = cli("pack", str(tmp_path / "t"), "--size", "2048", "--pad-multiple", "8", "--output",
                       str(tmp_path / "p"), "-q")  # fmt: skip
    assert code == 0, err
    fig = _figure(monkeypatch, str(tmp_path / "p"), "--plot", str(tmp_path / "p.png"))
    fill = next(ax for ax in fig.axes if ax.get_title().startswith("pack fill:"))
    full = int(fill.get_title().split()[2])  # "pack fill: 38 of 40 packs at least 99% full ..."
    bars = [(p.get_x(), p.get_x() + p.get_width(), p.get_height()) for p in fill.patches]
    assert not any(lo < 99 - 1e-9 and hi > 99 + 1e-9 and h for lo, hi, h in bars), bars
    assert sum(h for lo, _, h in bars if lo >= 99 - 1e-9) == full
    for ax in (fill, next(ax for ax in fig.axes if ax.get_title().startswith("documents per pack"))):
        assert all(float(t).is_integer() for t in ax.get_yticks()), ax.get_yticks()


@pytest.mark.slow  # two training scripts in subprocesses: ~25 s on 2 shared cores
def test_train_scripts_count_steps_from_1_and_say_what_they_print(tmp_path: Path) -> None:
    """`make demo`'s two training lines: DPO steps counted as the plain loop counts them (from 1), the vocab
    named for what it is (not the tokenizer's 8,192), and the plain loop's resume state in words."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    tok, pairs, packs = root / "data" / "sample" / "tokenizer", tmp_path / "pairs", tmp_path / "packs"
    code, _, err = cli("tokenize", str(root / "data/sample/preference.jsonl"), "--format", "preference",
                       "--tokenizer", str(tok), "--output", str(pairs), "-q")  # fmt: skip
    assert code == 0, err
    code, _, err = cli("pack", str(pairs), "--size", "2048", "--output", str(packs), "-q")
    assert code == 0, err
    run = subprocess.run([sys.executable, str(root / "scripts" / "train_dpo.py"), str(packs), "--steps", "1"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "(the largest id in the packs + 1)" in lines[0] and lines[1].startswith("step 1: "), lines
    run = subprocess.run([sys.executable, str(root / "scripts" / "train_plain.py"), str(packs), "--steps", "1",
                          "--batch-size", "2"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1].endswith("resumes at epoch 0 after 2 packs"), run.stdout


def test_a_mistyped_run_config_key_or_section_is_suggested(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("tokenize:\n  inputs: [a.jsonl]\n  tokenizer: t\n  output: o\n  fromat: chat\n")
    line = cli_error("run", str(cfg), code=2)
    assert "unknown key 'fromat' in section 'tokenize'" in line and "did you mean 'format'? valid keys:" in line, line
    cfg.write_text("tokenze:\n  inputs: [a.jsonl]\n")
    assert "did you mean 'tokenize'? valid sections:" in cli_error("run", str(cfg), code=2)
    cfg.write_text("tokenize:\n  inputs: [a.jsonl]\n  tokenizer: t\n  output: o\n  workers: two\n")
    assert "write e.g. `workers: 8`" in cli_error("run", str(cfg), code=2)  # not `workers: 4096`


def test_the_waste_plot_says_whose_lower_bound_its_line_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorted batches can pad less than packing's bound (their rows are shorter than N): a bar left of a line
    labelled plain "lower bound" read as a contradiction."""
    store = write_random_store(tmp_path / "s", [300, 100, 100, 50, 20, 700])
    fig = _figure(monkeypatch, str(store), "--size", "512", "--plot", str(tmp_path / "w.png"))
    waste = next(ax for ax in fig.axes if ax.get_title().startswith("waste per strategy"))
    labels = [line.get_label() for line in waste.get_lines()]
    assert any(label.startswith("lower bound of packing ") and label.endswith("(rows of N)") for label in labels), labels
