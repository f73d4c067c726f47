"""`packtool stats` explained and plotted so a person reads it at a glance (issue 34, items 8 and 9).

The rows read as "sorting is nearly as good as packing": each strategy now says what it keeps and gives
up, the `rows` column says what it counts, and a default N is named as a default. The plot's packing bars
were invisible beside padding's 96.6% and the lower-bound line sat on the axis; the pack-store plot was
one 99.88% bar."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import cli, write_random_store

from packtool.core.packing import ALGORITHMS

OLD_TOKEN_KEYS = {"path", "size", "batch_size", "n_documents", "n_tokens", "n_empty_documents", "n_overlong",
                  "n_items", "lengths", "waste", "rows", "kind", "overlong_note"}  # fmt: skip


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token store with Zipf-like lengths: packers differ from each other and from the bound at N=512."""
    rng = np.random.default_rng(3)
    lengths = np.minimum(rng.zipf(1.5, 600) * 20, 3000).tolist()
    return write_random_store(tmp_path_factory.mktemp("explain") / "tokens", lengths)


def _run(*args: str) -> str:
    code, out, err = cli("stats", *args)
    assert code == 0, err
    return out


def test_a_default_n_is_named_as_a_default(store: Path) -> None:
    """`stats TOKENS` measured at N=4096 without a word when the store had been packed at 2048."""
    out = _run(str(store))
    assert "N=4096: the default, no --size given" in out and "pass --size N" in out
    data = json.loads(_run(str(store), "--json"))
    assert data["size"] == 4096 and data["size_source"] == "default" and "default" in data["notes"]["size"]
    given = json.loads(_run(str(store), "--size", "2048", "--json"))
    assert given["size_source"] == "given" and "the default" not in _run(str(store), "--size", "2048")


def test_every_row_says_what_it_keeps_and_gives_up(store: Path) -> None:
    out = _run(str(store), "--size", "512")
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("strategy (N="))
    assert "keeps / gives up" in lines[header]
    data = json.loads(_run(str(store), "--size", "512", "--json"))
    rows = lines[header + 1 : header + 1 + len(data["waste"])]
    for row in rows:  # each row carries its note
        name = next(n for n in data["waste"] if row.strip().startswith(n + " "))
        assert row.rstrip().endswith(data["strategies"][name]["short"]), row
    sorted_row = next(line for line in lines if line.lstrip().startswith("sorted batches of B"))
    assert "NO randomness" in sorted_row
    text = " ".join(out.split())
    assert "rows: sequences computed" in text and "waste: padding / computed positions" in text
    assert "global length sort" in text and "cu_seqlens" in text
    assert max(len(line) for line in lines[header:]) <= 80  # the table and its notes fit 80 columns


def test_json_keeps_its_keys_and_gains_the_notes_as_data(store: Path) -> None:
    data = json.loads(_run(str(store), "--size", "512", "--json"))
    assert set(data) >= OLD_TOKEN_KEYS
    assert set(data["strategies"]) == set(data["waste"]) == set(data["rows"])
    for name, note in data["strategies"].items():
        assert set(note) == {"keeps", "gives_up", "short"} and all(note.values()), name
    assert "no randomness" in data["strategies"]["sorted batches of B"]["gives_up"].replace("all randomness", "no randomness")
    for algorithm in ALGORITHMS:  # every packer of the registry has its own note, not the fallback
        keeps = data["strategies"][f"pack {algorithm}"]["keeps"]
        assert "cu_seqlens" in keeps and f"the {algorithm} packer" not in keeps, algorithm
    assert {"rows", "waste", "size", "sorting"} <= set(data["notes"])


# ---- plots ----------------------------------------------------------------------------------------


def _figure(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """Run `stats ... --plot` and keep the matplotlib figure it saved."""
    import matplotlib.figure

    saved: list[Any] = []
    original = matplotlib.figure.Figure.savefig

    def keep(self: Any, *a: Any, **k: Any) -> None:
        saved.append(self)
        original(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    code, _, err = cli("stats", *args)
    assert code == 0, err
    (fig,) = saved
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()  # pyplot closed it: a canvas to measure text and bars on
    return fig


def _overlaps(boxes: list[Any]) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_waste_plot_shows_every_packer_and_the_bound(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fig = _figure(monkeypatch, str(store), "--size", "512", "--plot", str(tmp_path / "w.png"))
    waste = next(ax for ax in fig.axes if ax.get_title().startswith("waste per strategy"))
    renderer = fig.canvas.get_renderer()
    width = waste.get_window_extent(renderer).width
    bars = list(waste.patches)
    names = [t.get_text() for t in waste.get_yticklabels()]
    assert len(bars) == len(names) and any(n.startswith("pack ") for n in names)
    for name, bar in zip(names, bars, strict=True):  # the smallest waste is a bar one can see, not a hairline
        assert bar.get_window_extent(renderer).width > 0.05 * width, name
    bound_x = [line.get_xdata()[0] for line in waste.get_lines()]
    data = json.loads(_run(str(store), "--size", "512", "--json"))
    assert bound_x and bound_x[0] == pytest.approx(100 * data["waste"]["lower bound"])
    lo, hi = waste.get_xlim()
    assert waste.get_xscale() == "log" and lo < bound_x[0] < hi and bound_x[0] / lo > 5  # well off the axis
    labels = [t for t in waste.texts if t.get_text()]
    assert len(labels) == len(bars)
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not _overlaps(boxes)
    legend = waste.get_legend().get_window_extent(renderer)
    assert not any(legend.overlaps(b) for b in boxes)
    packers = next(ax for ax in fig.axes if ax.get_title() == "packers vs the lower bound")
    texts = [t.get_text() for t in packers.texts]
    assert len(texts) == len(ALGORITHMS) and all(t == "at the bound" or t.startswith("+") for t in texts)
    extra = {n.removeprefix("pack "): data["rows"][n] - data["rows"]["lower bound"] for n in data["rows"] if n.startswith("pack ")}
    for name, text in zip([t.get_text() for t in packers.get_yticklabels()], texts, strict=True):
        assert text == "at the bound" if extra[name] == 0 else text.startswith(f"+{extra[name]} pack"), (name, text)
    assert any(v > 0 for v in extra.values())  # the store makes the packers differ from the bound


def test_pack_store_plot_shows_the_fill_of_the_packs(store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = cli("pack", str(store), "--size", "512", "--output", str(tmp_path / "packs"), "--pad-multiple", "8", "-q")
    assert code == 0, err
    fig = _figure(monkeypatch, str(tmp_path / "packs"), "--plot", str(tmp_path / "p.png"))
    titles = [ax.get_title() for ax in fig.axes]
    assert any(t.startswith("pack fill:") for t in titles) and any(t.startswith("documents per pack") for t in titles)
    fill = fig.axes[titles.index(next(t for t in titles if t.startswith("pack fill:")))]
    data = json.loads(_run(str(tmp_path / "packs"), "--json"))
    assert sum(p.get_height() for p in fill.patches) == data["n_packs"]  # one count per pack, no 2-bar chart
    assert not any(t.get_text() in ("real tokens", "padding") for t in fill.get_xticklabels())
    box = next(t.get_text() for t in fill.texts if "positions" in t.get_text())
    assert "--pad-multiple pad" in box and "empty pack tails" in box and "lower bound" in box
    docs = fig.axes[titles.index(next(t for t in titles if t.startswith("documents per pack")))]
    assert sum(p.get_height() for p in docs.patches) == data["n_packs"]
