"""Paths built from data stay inside their root (`packtool.formats.paths`), through the CLI.

A hub PATH, the commit in a `refs/*` file, `state.json`'s `_data_files`, `dataset_dict.json`'s splits and
the links a directory walk or a glob finds: each hostile one is one `error:` line naming it, exit 1, and
nothing outside is read (the outside file holds records: reading it would tokenize them, exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from input_support import hub_repo
from support import cli, cli_error, write_jsonl

import packtool
from packtool.formats.paths import check_within, contained

ROWS = [{"text": f"inside record {i}"} for i in range(5)]
SECRET = [{"text": "a secret outside the root"}]


def _jsonl(rows: list[dict[str, str]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache with dataset org/ds (one jsonl) and, beside the cache, a secret jsonl outside it."""
    cache = tmp_path / "hub"
    hub_repo(cache, "datasets", "org/ds", {"data/train.jsonl": _jsonl(ROWS)})
    (tmp_path / "outside").mkdir()
    write_jsonl(tmp_path / "outside" / "secret.jsonl", SECRET)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a cache built by hand: read offline (online, the hub is asked for the file list)
    return cache


def _tokenize_error(tmp_path: Path, tok: Path, *inputs: str) -> str:
    line = cli_error("tokenize", *inputs, "--tokenizer", str(tok), "--output", str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
    return line


def test_hub_path_cannot_leave_the_snapshot(tmp_path: Path, bpe_tokenizer_dir: Path, hub: Path) -> None:
    secret = tmp_path / "outside" / "secret.jsonl"
    climb = "hf://datasets/org/ds/../../../../outside/secret.jsonl"  # snapshots/<rev>/ -> repo -> cache -> tmp
    assert (hub / "datasets--org--ds" / "snapshots" / "0f1e2d3c" / "../../../../outside/secret.jsonl").resolve() == secret
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, climb)
    assert "climbs out of the directory with '..'" in line and "../../../../outside/secret.jsonl" in line
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, f"hf://datasets/org/ds/{secret}")  # `//abs/path`
    assert "an absolute path" in line and str(secret) in line
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, "hf://datasets/org/ds/../../../../outside/*.jsonl")
    assert "climbs out" in line
    code, out, err = cli("tokenize", "hf://datasets/org/ds/data/train.jsonl", "--tokenizer", str(bpe_tokenizer_dir),
                         "--output", str(tmp_path / "ok"), "-q")
    assert code == 0 and out.startswith("tokenized 5 documents"), err


def test_a_link_in_a_snapshot_cannot_lead_out_of_the_repo(tmp_path: Path, bpe_tokenizer_dir: Path, hub: Path) -> None:
    snapshot = hub / "datasets--org--ds" / "snapshots" / "0f1e2d3c"
    (snapshot / "data" / "train_leak.jsonl").symlink_to(tmp_path / "outside" / "secret.jsonl")
    for spec in ("hf://datasets/org/ds", "hf://datasets/org/ds/data", "hf://datasets/org/ds/data/train_leak.jsonl",
                 "hf://datasets/org/ds/data/*.jsonl"):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, spec)
        assert "train_leak.jsonl" in line and f"outside {hub / 'datasets--org--ds'}" in line, (spec, line)


@pytest.mark.parametrize("ref", ["../../../outside", "../snapshots/../../../outside", "/abs/path", "a/b"])
def test_a_ref_cannot_name_a_path_out_of_snapshots(tmp_path: Path, bpe_tokenizer_dir: Path, hub: Path,
                                                   ref: str) -> None:
    (tmp_path / "outside" / "data.jsonl").write_bytes(_jsonl(SECRET))
    repo = hub / "datasets--org--ds"
    (repo / "refs" / "main").write_text(ref + "\n")
    (repo / "refs" / "v1").write_text(ref)
    for spec in ("hf://datasets/org/ds", "hf://datasets/org/ds@v1"):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, spec)
        assert "the ref file" in line and repr(ref) in line and "fetch it again" in line, line


def test_a_ref_holding_more_than_a_commit_is_refused_not_replaced(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                  hub: Path) -> None:
    """A 50 MB `refs/main` was cut to 40 characters, named no snapshot, and another revision was read in its
    place, silently (exit 0)."""
    other = hub / "datasets--org--ds" / "snapshots" / ("b" * 40)
    other.mkdir()
    write_jsonl(other / "old.jsonl", SECRET)
    (hub / "datasets--org--ds" / "refs" / "main").write_text("b" * 5000)
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, "hf://datasets/org/ds")
    assert "the ref file holds more than a commit hash (over 256 bytes)" in line and "refs/main" in line, line
    assert "fetch it again" in line


def test_a_revision_is_a_name_not_a_path(tmp_path: Path, bpe_tokenizer_dir: Path, hub: Path) -> None:
    """`@.` once named snapshots/ itself and tokenized every cached revision as one dataset."""
    other = hub / "datasets--org--ds" / "snapshots" / ("b" * 40)
    other.mkdir()
    write_jsonl(other / "old.jsonl", SECRET)
    for rev in (".", "./", "..", ".hidden", "HEAD~1", "a..b"):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, f"hf://datasets/org/ds@{rev}")
        assert "is not in the local Hugging Face cache: a revision is a branch, tag or commit name" in line, line
    code, out, err = cli("tokenize", f"hf://datasets/org/ds@{'b' * 40}", "--tokenizer", str(bpe_tokenizer_dir),
                         "--output", str(tmp_path / "ok"), "-q")
    assert code == 0 and out.startswith("tokenized 1 documents"), err


def test_tokenizer_by_name_reads_only_inside_its_repo(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The model side of the cache: `--tokenizer org/name` follows refs/main, which must name a snapshot."""
    cache = tmp_path / "hub"
    files = {name: (bpe_tokenizer_dir / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    repo = hub_repo(cache, "models", "org/tok", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    code, out, err = cli("tokenize", str(src), "--tokenizer", "org/tok", "--output", str(tmp_path / "ok"), "-q")
    assert code == 0, err
    stolen = tmp_path / "stolen"
    stolen.mkdir()
    for name, data in files.items():
        (stolen / name).write_bytes(data)
    (repo / "refs" / "main").write_text("../../../stolen")
    line = cli_error("tokenize", str(src), "--tokenizer", "org/tok", "--output", str(tmp_path / "bad"))
    assert "the ref file" in line and "'../../../stolen'" in line
    (repo / "refs" / "main").write_text("0f1e2d3c")
    (repo / "snapshots" / "0f1e2d3c" / "tokenizer.json").unlink()
    (repo / "snapshots" / "0f1e2d3c" / "tokenizer.json").symlink_to(stolen / "tokenizer.json")
    line = cli_error("tokenize", str(src), "--tokenizer", "org/tok", "--output", str(tmp_path / "bad"))
    assert "the cached tokenizer.json of org/tok" in line and f"outside {repo}" in line
    assert not (tmp_path / "bad").exists()


def test_snapshot_with_split_names_and_no_train_split_is_refused(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    hub_repo(cache, "datasets", "org/evals", {"validation.jsonl": _jsonl(ROWS), "test.jsonl": _jsonl(SECRET)})
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache answers; online, the hub would be asked for the split
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, "hf://datasets/org/evals")
    assert "org/evals has no train split" in line and "validation and test splits" in line
    assert "pass --split NAME with one of: validation, test" in line
    code, out, err = cli("tokenize", "hf://datasets/org/evals/validation.jsonl", "--tokenizer", str(bpe_tokenizer_dir),
                         "--output", str(tmp_path / "ok"), "-q")
    assert code == 0 and out.startswith("tokenized 5 documents"), err


# ---- save_to_disk directories ----


def _saved(root: Path, rows: list[dict[str, str]], shards: int = 1) -> Path:
    datasets.Dataset.from_list(rows).save_to_disk(str(root), num_shards=shards)
    return root


def _set_data_files(saved: Path, names: list[object]) -> None:
    state = json.loads((saved / "state.json").read_text())
    state["_data_files"] = [{"filename": n} for n in names]
    (saved / "state.json").write_text(json.dumps(state))


def test_state_json_cannot_name_files_outside_the_directory(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    saved = _saved(tmp_path / "ds", ROWS)
    outside = _saved(tmp_path / "outside_ds", SECRET)
    arrow = next(outside.glob("*.arrow"))
    for name, reason in ((f"../outside_ds/{arrow.name}", "climbs out"), (str(arrow), "an absolute path")):
        _set_data_files(saved, [name])
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
        assert "state.json's _data_files names" in line and reason in line and name in line, line
    (saved / "link.arrow").symlink_to(arrow)
    _set_data_files(saved, ["link.arrow"])
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
    assert "'link.arrow'" in line and f"outside {saved}" in line


def test_empty_data_files_says_so(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    saved = _saved(tmp_path / "ds", ROWS)
    _set_data_files(saved, [])
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
    assert "lists no data files (state.json's _data_files is empty)" in line and str(saved) in line
    assert ", ," not in line


@pytest.mark.parametrize(("state", "says"), [
    ('{"_data_files": 5}', "state.json has _data_files is a JSON number, expected a list of {\"filename\": NAME}"),
    ('{"_data_files": "x.arrow"}', "_data_files is a JSON string"),  # was "TypeError: string indices must be ..."
    ('{"_data_files": [{"filename": 5}]}', "_data_files[0] is an object without a string filename"),
    ('{"_data_files": [{"filename": "a.arrow"}, 3]}', "_data_files[1] is a JSON number"),
    ('{"_data_files": [{"filename": "a.arrow"}, {}]}', "_data_files[1] is an object without a string filename"),
    ("[1]", "state.json has no _data_files"),
    ("{not json", "state.json is not valid JSON"),
    ('{"_data_files": ' + "[" * 100_000 + "]" * 100_000 + "}", "state.json is not valid JSON: nested too deep to read"),
])
def test_a_hostile_state_json_is_one_line(tmp_path: Path, bpe_tokenizer_dir: Path, state: str, says: str) -> None:
    saved = _saved(tmp_path / "ds", ROWS)
    (saved / "state.json").write_text(state)
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
    assert "cannot read the file list of a save_to_disk directory" in line and says in line, line
    assert "Error:" not in line  # no Python exception names (TypeError: ..., KeyError: 'filename')


def test_a_state_json_larger_than_any_file_list_is_refused_unread(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A 75 MB state.json took 1 GB to parse before failing on its last entry as "KeyError: 'filename'"."""
    from packtool.stages.tokenize.inputs.locators import saved as saved_locator

    saved = _saved(tmp_path / "ds", ROWS)
    state = json.loads((saved / "state.json").read_text())
    state["padding"] = "x" * 3000
    (saved / "state.json").write_text(json.dumps(state))
    monkeypatch.setattr(saved_locator, "MAX_STATE_BYTES", 2000)
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
    assert "state.json is not read: it is 3," in line and "bytes, more than such a file holds (2,000)" in line, line


@pytest.mark.parametrize("which", ["state.json", "dataset_dict.json"])
def test_a_side_file_linked_to_a_device_is_refused_not_walked_around(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                                     which: str) -> None:
    """A `state.json` linked to /dev/zero made the directory no saved dataset at all: its Arrow files were
    tokenized as a plain directory, exit 0. The names decide what the directory is; the file is then refused.
    A `dataset_dict.json` linked so is never read (its splits are the subdirectories holding one)."""
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero")
    if which == "state.json":
        saved = _saved(tmp_path / "ds", ROWS)
    else:
        ds = datasets.Dataset.from_list(ROWS)
        datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(saved := tmp_path / "dd"))
    (saved / which).unlink()
    (saved / which).symlink_to("/dev/zero")
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(saved))
    if which == "state.json":
        assert "state.json is not read: it is not a regular file" in line and str(saved) in line, line
    else:
        assert "a DatasetDict directory (splits: test, train) is several datasets" in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("splits", ["null", "5", '"train"', '{"train": 1}', '"' + "[" * 100_000 + '"'])
def test_dataset_dict_json_splits_of_any_type(tmp_path: Path, bpe_tokenizer_dir: Path, splits: str) -> None:
    """Not a list of names: the splits are the subdirectories that hold one (never the letters of a string)."""
    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ' + splits + "}")
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(tmp_path / "dd"))
    assert "a DatasetDict directory (splits: test, train) is several datasets" in line


def test_dataset_dict_json_cannot_name_a_split_outside(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["../../etc"]}')
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(tmp_path / "dd"))
    assert "dataset_dict.json's splits names '../../etc'" in line


# ---- directory walks and globs ----


def test_a_walk_or_glob_follows_no_link_out_of_its_directory(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """An unpacked archive holding `leak.txt -> ~/.ssh/id_rsa` must not put the key into a token store."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", ROWS)
    secret = write_jsonl(tmp_path / "secret.jsonl", SECRET)
    (data / "leak.jsonl").symlink_to(secret)
    for spec in (str(data), str(data / "*.jsonl"), str(data / "**" / "*.jsonl")):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, spec)
        assert "leak.jsonl" in line and "leads outside" in line and "name the file itself to read it" in line, (spec, line)
    linked_dir = tmp_path / "walk"
    linked_dir.mkdir()
    (linked_dir / "sub").symlink_to(tmp_path / "outside_dir", target_is_directory=True)
    (tmp_path / "outside_dir").mkdir()
    write_jsonl(tmp_path / "outside_dir" / "x.jsonl", SECRET)
    write_jsonl(linked_dir / "in.jsonl", ROWS)
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(linked_dir / "**" / "*.jsonl"))  # `**` enters links
    assert "x.jsonl" in line and "leads outside" in line
    # a link inside the directory, and a link named on the command line, are read
    (data / "leak.jsonl").unlink()
    (data / "b.jsonl").symlink_to(data / "a.jsonl")
    (tmp_path / "named.jsonl").symlink_to(secret)
    for spec, documents in ((str(data), 5), (str(tmp_path / "named.jsonl"), 1)):  # b.jsonl is a.jsonl: read once
        code, out, err = cli("tokenize", spec, "--tokenizer", str(bpe_tokenizer_dir), "--output",
                             str(tmp_path / "ok"), "-q", "--overwrite")
        assert code == 0 and out.startswith(f"tokenized {documents} documents"), (spec, out, err)


def test_the_guard_itself(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    kw = {"hint": "fix it"}
    assert contained(root, "d/x.arrow", "test", **kw) == root / "d" / "x.arrow"
    for name, reason in (("", "empty"), ("../x", "'..'"), ("d/../../x", "'..'"), ("/etc/passwd", "absolute"),
                         ("a\x00b", "NUL")):
        with pytest.raises(packtool.errors.InputError, match=reason):
            contained(root, name, "test", **kw)
    with pytest.raises(packtool.errors.InputError, match="single name"):
        contained(root, "d/x", "test", one_part=True, **kw)
    (root / "out").symlink_to(tmp_path)
    with pytest.raises(packtool.errors.InputError, match="leads outside"):
        contained(root, "out/x", "test", **kw)
    assert contained(root, "out/x", "test", links_within=tmp_path, **kw) == root / "out" / "x"
    (root / "loop").symlink_to(root / "loop")
    with pytest.raises(packtool.errors.InputError):
        check_within(root / "loop", root, "a loop", **kw)


def test_a_walk_or_glob_refuses_links_to_nothing(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """A dangling link (an unmounted disk) or a link loop named like data was skipped silently: data lost, exit 0."""
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", ROWS)
    (data / "gone.jsonl").symlink_to(data / "missing.jsonl")
    for spec in (str(data), str(data / "*.jsonl")):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, spec)
        assert "a link that" in line and "leads to no file" in line and "gone.jsonl" in line, line
    (data / "gone.jsonl").unlink()
    (data / "loop.jsonl").symlink_to(data / "loop.jsonl")
    line = _tokenize_error(tmp_path, bpe_tokenizer_dir, str(data))
    assert "loop.jsonl" in line and "cannot be resolved" in line
    (data / "loop.jsonl").unlink()
    (data / "README.md").symlink_to(data / "missing.md")  # not a data file: not looked at
    code, out, err = cli("tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                         str(tmp_path / "ok"), "-q")
    assert code == 0 and out.startswith("tokenized 5 documents"), err


def test_an_empty_input_argument_reads_nothing(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """`packtool tokenize "$DATA"` with DATA unset tokenized the whole working directory."""
    write_jsonl(tmp_path / "private.jsonl", SECRET)
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        line = _tokenize_error(tmp_path, bpe_tokenizer_dir, empty)
        assert "an input argument is empty" in line
