"""`packtool run CONFIG.yaml`: a tiny config end to end through the CLI, the shipped configs parse,
and every config mistake (unknown key, missing key, bad type, invalid YAML, duplicate key) is one line, exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import cli, zipf_texts

from packtool.choices import Algorithm
from packtool.cli.runconfig import load_run_config
from packtool.errors import UsageError
from packtool.formats.pack_store import open_pack_split
from packtool.formats.token_store import open_token_store
from packtool.stages.run import run_pipeline

REPO = Path(__file__).resolve().parents[1]




@pytest.fixture
def corpus(tmp_path: Path, bpe_tokenizer_dir: Path) -> Path:
    """A work dir with data.jsonl (Zipf lengths, an empty doc, a long doc) and the tokenizer."""
    texts = zipf_texts(300, seed=5)
    texts[3] = ""
    texts[10] = " ".join(texts[:40])  # longer than the pack size: split into fragments
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), "utf-8")
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.write_text(text, "utf-8")
    return path


def test_end_to_end_relative_paths_and_dash_keys(corpus: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(corpus / "run.yaml", f"""
tokenize:
  inputs: data.jsonl
  tokenizer: {bpe_tokenizer_dir}
  output: out/tokens
  workers: 1
pack:
  size: 512
  output: out
  algorithm: mffd
  pad-multiple: 4
stats:
  plot: out/stats.png
  json: true
verify: {{}}
""")
    monkeypatch.chdir(corpus.parent)  # relative paths resolve against the YAML file, not the cwd
    code, out, err = cli("run", str(cfg), "--quiet")
    assert code == 0, err
    store = open_token_store(corpus / "out" / "tokens")
    assert store.n_documents == 300
    pack_dir = next((corpus / "out" / "packed").iterdir())
    ps = open_pack_split(pack_dir, "training", 512, check_hashes=True)
    assert ps.metadata["algorithm"] == "mffd" and ps.metadata["pad_multiple"] == 4
    assert ps.metadata["overlong"]["count"] >= 1
    assert int(np.asarray(ps.seg_lens).sum()) % 4 == 0
    stats = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert stats["n_packs"] == ps.n_packs and stats["size"] == 512
    assert (corpus / "out" / "stats.png").stat().st_size > 1000
    assert "verify" in out and "round-trips" in out
    # same config again: the token store is up to date, the packs are rewritten byte-identically
    before = (pack_dir / "training_512.npy").read_bytes()
    assert cli("run", str(cfg), "-q")[0] == 0
    assert (pack_dir / "training_512.npy").read_bytes() == before


def test_steps_list_runs_in_order_and_library_call(corpus: Path, bpe_tokenizer_dir: Path) -> None:
    (corpus / "docs").mkdir()
    for i, t in enumerate(zipf_texts(5, seed=9)):
        write(corpus / "docs" / f"d{i}.txt", t)
    cfg = write(corpus / "steps.yaml", f"""
steps:
  - name: jsonl
    tokenize: {{inputs: [data.jsonl], tokenizer: {bpe_tokenizer_dir}, output: t1, workers: 1}}
    pack: {{size: 256, output: p1, seed: 3, shuffle: false}}
  - name: docs
    tokenize: {{inputs: [docs], tokenizer: {bpe_tokenizer_dir}, output: t2, workers: 1}}
    stats: {{size: 128, batch_size: 2}}
""")
    seen: list[str] = []
    result = run_pipeline(load_run_config(cfg), lambda stage, done, total: seen.append(stage))
    assert [s.name for s in result.steps] == ["jsonl", "docs"]
    assert result.steps[0].pack.metadata["seed"] == 3 and result.steps[0].pack.metadata["shuffle"] is False
    assert result.steps[1].stats.n_documents == 5 and result.steps[1].stats.size == 128  # token-store stats
    assert seen.index("jsonl: pack") < seen.index("docs: tokenize")


def test_shipped_configs_parse() -> None:
    demo = load_run_config(REPO / "configs" / "demo.yaml")
    assert [s.name for s in demo] == ["chat", "text"]
    assert all(Path(s.tokenize.tokenizer).is_dir() for s in demo)  # resolved against configs/
    assert all(Path(p).exists() for s in demo for p in s.tokenize.inputs)
    assert demo[0].pack.tokens_dir == Path(demo[0].tokenize.output)
    sft = load_run_config(REPO / "configs" / "chat_sft.yaml")[0]
    assert sft.tokenize.tokenizer == "Qwen/Qwen2.5-7B-Instruct"  # no such path: a hub name, kept
    assert sft.pack.pad_multiple == 8 and sft.pack.algorithm is Algorithm.BFD
    assert load_run_config(REPO / "configs" / "pretrain.yaml")[0].pack.size == 8192


@pytest.mark.parametrize(("text", "expect"), [
    ("pack:\n  size: 8\n  output: o\n  tokens_dir: t\n  sise: 9\n",
     ["unknown key 'sise'", "section 'pack'", ":5", "valid keys:", "pad_multiple"]),
    ("tokenize:\n  inputs: a.jsonl\n  output: o\n", ["lacks the required key 'tokenizer'", "section 'tokenize'"]),
    ("pack:\n  size: 8\n  output: o\n", ["lacks the required key 'tokens_dir'"]),
    ("packk:\n  size: 8\n", ["unknown section 'packk'", ":1", "valid sections"]),
    ("pack:\n  size: big\n  output: o\n  tokens_dir: t\n", ["pack.size", "expected an integer", "'big'"]),
    ("pack:\n  size: 8\n  output: o\n  tokens_dir: t\n  shuffle: maybe\n", ["expected true or false"]),
    ("pack:\n  size: 8\n  pad-multiple: 2\n  pad_multiple: 2\n  output: o\n  tokens_dir: t\n", ["given twice"]),
    ("pack:\n  size: 8\n   output: o\n", ["invalid YAML", ":3:"]),
    ("tokenize: [\n", ["invalid YAML", ":2:"]),
    ("- 1\n- 2\n", ["must be a mapping"]),
    ("steps: []\n", ["non-empty list"]),
    # hostile YAML: complex keys (were TypeError tracebacks), nesting past the parser's recursion, aliased names
    ("? [a, b]\n: 1\n", ["a key must be a plain name, got a list", ":1:"]),
    ("pack:\n  ? {a: 1}\n  : 1\n", ["a key must be a plain name, got a mapping", ":2:"]),
    ("pack: {size: " + "[" * 5000 + "]" * 5000 + "}\n", ["nested too deep to read"]),
    ("steps:\n  - name: [x]\n    verify: {path: x}\n", ["the name of steps[0] must be a string", ":2"]),
    ("steps:\n  - name: true\n    verify: {path: x}\n", ["the name of steps[0] must be a string"]),
    ("steps:\n  - name: a\n    verify: {path: x}\n  - name: a\n    verify: {path: y}\n", ["used twice"]),
])
def test_config_errors_are_one_line_exit_2(tmp_path: Path, text: str, expect: list[str]) -> None:
    """SPEC: a bad config value is a usage error, exit 2 (an unknown key or a wrong type exited 1)."""
    cfg = write(tmp_path / "bad.yaml", text)
    with pytest.raises(UsageError):
        load_run_config(cfg)
    code, out, err = cli("run", str(cfg), "-q")
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for piece in expect:
        assert piece in err, (piece, err)
    assert not any(p.name != "bad.yaml" for p in tmp_path.iterdir())  # nothing ran


def test_missing_file_and_stage_failure_exit_1(corpus: Path, bpe_tokenizer_dir: Path) -> None:
    code, _, err = cli("run", str(corpus / "nope.yaml"))
    assert code == 1 and "does not exist" in err
    cfg = write(corpus / "fail.yaml", f"tokenize: {{inputs: [missing.jsonl], tokenizer: {bpe_tokenizer_dir}, output: t}}\n")
    code, _, err = cli("run", str(cfg), "-q")
    assert code == 1 and err.startswith("error: ") and err.count("\n") == 1
    assert cli("run")[0] == 2  # usage error: no config given


@pytest.mark.parametrize(
    ("section", "expect"),
    [  # a value outside its domain exits 2 as its flag does, located at the key's file:line; a malformed file 1
        ("pack:\n  size: 0\n  output: out\n", "pack.size, {cfg}:6: --size must be a positive integer"),
        ("pack:\n  size: 64\n  output: out\n  pad_multiple: 128\n", "pack.pad_multiple, {cfg}:8: --pad-multiple 128 is larger than --size 64"),
        ("pack:\n  size: 64\n  output: out\n  seed: -1\n", "pack.seed, {cfg}:8: --seed must be an integer >= 0"),
        ("pack:\n  size: 64\n  output: out\n  executor: rayy\n", "'rayy' is not one of local, ray"),
        ("pack:\n  size: 64\n  output: out\nstats:\n  batch_size: 0\n", "stats.batch_size, {cfg}:9: --batch-size must be an integer >= 1"),
        ("pack:\n  size: 64\n  output: out\nstats:\n  plot: out/waste.txt\n", "writes a PNG"),
        ("pack:\n  size: 64\n  size: 128\n  output: out\n", "key 'size' is given twice"),
        # the tokenize section's out-of-domain values and contradictions exited 1 (TokenizeConfig said ConfigError)
        ("  workers: 0\n", "tokenize.workers, {cfg}:5: --workers must be >= 1"),
        ("  chunk_bytes: -1\n", "tokenize.chunk_bytes, {cfg}:5: --chunk-bytes must be >= 1"),
        ("  separator: ''\n", "tokenize.separator, {cfg}:5: --separator is empty"),
        ("  num_shards: 2\n  shard_index: 3\n", "tokenize.shard_index, {cfg}:6: --shard-index 3 is outside 0..1"),
        ("  chat_template: t.jinja\n", "tokenize.chat_template, {cfg}:5: --chat-template does not apply to --format text"),
    ],
)
def test_every_section_is_checked_before_the_first_step_runs(corpus: Path, bpe_tokenizer_dir: Path, section: str,
                                                             expect: str) -> None:
    """A bad value in a later section fails before tokenize has written anything."""
    cfg = write(corpus / "run.yaml", f"tokenize:\n  inputs: data.jsonl\n  tokenizer: {bpe_tokenizer_dir}\n"
                                     f"  output: out/tokens\n{section}")
    code, _, err = cli("run", str(cfg), "--quiet")
    assert code == 2 and expect.format(cfg=cfg) in err, err  # a key given twice exited 1
    assert err.count("\n") == 1, err
    assert not (corpus / "out").exists() and not list(corpus.glob(".out*"))  # no step ran


def test_an_aliased_value_is_quoted_bounded_and_a_name_is_never_expanded(tmp_path: Path) -> None:
    """YAML aliases make a 9**k-item value of a few lines: an error quotes it bounded, and a step name is not
    stringified (9**8 items took 10 s and 0.5 GB before the first check; 9**10 would not finish)."""
    lines = ['steps:', '  - name: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
             '    verify: {path: x}']  # fmt: skip
    for prev, this in zip("abcde", "bcdef", strict=True):
        lines += [f"  - name: &{this} [{', '.join(['*' + prev] * 9)}]", "    verify: {path: x}"]
    cfg = write(tmp_path / "lol.yaml", "\n".join(lines) + "\n")
    code, _, err = cli("run", str(cfg), "-q")
    assert code == 2 and "the name of steps[0] must be a string" in err and len(err) < 400, err
    cfg = write(tmp_path / "big.yaml", f"pack: {{size: {list(range(100_000))}, output: o, tokens_dir: t}}\n")
    code, _, err = cli("run", str(cfg), "-q")
    assert code == 2 and "expected an integer, got [0, 1, 2, 3, 4, 5, ...]" in err and len(err) < 400, err
