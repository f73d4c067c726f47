"""What a new user met on a fresh clone (after issue 34): `stats --plot` says where the PNG went, and a
choice typed in the wrong case is named back in the right one."""

from __future__ import annotations

import json
from pathlib import Path

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
