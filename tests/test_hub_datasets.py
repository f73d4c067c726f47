"""`hf://datasets/ORG/NAME[@REV]`: what is missing is fetched from the hub (a loopback one: `hub_loopback.py`,
never the network) into the hub cache, selected as `load_dataset(NAME, SUBSET, split=SPLIT)` selects it.

The selection is checked against `datasets` itself: its own resolution of the same files in a local directory
(`load_dataset_builder`), and `load_dataset` reading the loopback hub and, offline, the cache packtool filled."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_loopback import Hub, loopback_hub
from support import CHATML_TEMPLATE, cli, write_jsonl

from packtool.errors import InputError
from packtool.formats.token_store import open_token_store
from packtool.stages.tokenize.inputs.locators import expand_inputs
from packtool.stages.tokenize.inputs.locators.hub import HubOptions
from packtool.stages.tokenize.inputs.locators.hub_select import select

pytest.importorskip("huggingface_hub")
ROOT = Path(__file__).resolve().parents[1]
WORDS = ["the", "a", "model", "data", "token", "pack", "train", "loss", "GPU", "batch", "sequence", "answer", "question", "why", "how"]


def chats(n: int, seed: int) -> list[dict[str, object]]:
    """ShareGPT-like records: a system turn now and then, 1-3 human/gpt exchanges."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        turns = [{"from": "system", "value": "You are helpful."}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            turns.append({"from": "human", "value": " ".join(rng.choices(WORDS, k=rng.randint(2, 12))) + "?"})
            turns.append({"from": "gpt", "value": " ".join(rng.choices(WORDS, k=rng.randint(3, 30))) + "."})
        out.append({"id": f"{seed}-{i}", "conversations": turns})
    return out


def parquet(rows: list[dict[str, object]]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


TRAIN, TEST = chats(40, 1), chats(7, 2)
CARD = b"---\nlicense: cc0-1.0\n---\n# chat\n"


@pytest.fixture
def hub() -> Iterator[Hub]:
    with loopback_hub(lifetime=300) as state:
        state.dataset("acme/chat", {"README.md": CARD,
                                    "data/train-00000-of-00002.parquet": parquet(TRAIN[:25]),
                                    "data/train-00001-of-00002.parquet": parquet(TRAIN[25:]),
                                    "data/test-00000-of-00001.parquet": parquet(TEST),
                                    ".gitattributes": b"*.parquet filter=lfs"})  # fmt: skip
        yield state


def env(tmp_path: Path, hub: Hub, **extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))}
    base.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "home"), HF_HUB_DISABLE_TELEMETRY="1",
                PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")  # fmt: skip
    base.update(extra)
    return base


class Run:
    """`packtool tokenize SPEC --format sharegpt ...` in-process (`support.cli`), with the hub's settings in the
    environment as a user sets them (packtool reads them at each call)."""

    def __init__(self, tmp_path: Path, hub: Hub, tok: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path, self.hub, self.tok, self.mp = tmp_path, hub, tok, monkeypatch
        (tmp_path / "chatml.jinja").write_text(CHATML_TEMPLATE)
        for key in [k for k in os.environ if k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_"))]:
            monkeypatch.delenv(key)
        for key, value in env(tmp_path, hub).items():
            if key.startswith("HF_"):
                monkeypatch.setenv(key, value)

    def __call__(self, spec: str, out: str, *flags: str, **extra: str) -> tuple[int, str, str]:
        with self.mp.context() as mp:
            for key, value in extra.items():
                mp.setenv(key, value)
            return cli("tokenize", spec, "--format", "sharegpt", "--chat-template", str(self.tmp_path / "chatml.jinja"),
                       "--tokenizer", str(self.tok), "--output", str(self.tmp_path / out), "-q", *flags)  # fmt: skip

    def ok(self, spec: str, out: str, *flags: str, **extra: str) -> bytes:
        code, _, err = self(spec, out, *flags, **extra)
        assert code == 0 and err == "", err
        return (self.tmp_path / out / "tokens.bin").read_bytes()

    def error(self, spec: str, *flags: str, **extra: str) -> str:
        code, _, err = self(spec, "x", *flags, **extra)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
        return lines[0]

    def local(self, rows: list[dict[str, object]], out: str) -> bytes:
        return self.ok(str(write_jsonl(self.tmp_path / f"{out}.jsonl", rows)), out)


@pytest.fixture
def run(tmp_path: Path, hub: Hub, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    return Run(tmp_path, hub, bpe_tokenizer_dir, monkeypatch)


def python(tmp_path: Path, hub: Hub, code: str, **extra: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env(tmp_path, hub, **extra), capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_chat_dataset_is_fetched_as_load_dataset_selects_it(tmp_path: Path, hub: Hub, run: Run) -> None:
    first = run.ok("hf://datasets/acme/chat", "s")
    commit = hub.repo("dataset", "acme/chat").refs["main"]
    assert sorted(hub.fetched()) == ["README.md", "data/train-00000-of-00002.parquet",
                                     "data/train-00001-of-00002.parquet"]  # fmt: skip  (never the test split)
    manifest = open_token_store(tmp_path / "s").manifest
    assert manifest["hub"] == [{"dataset": "acme/chat", "revision": "main", "commit": commit, "subset": "default",
                                "split": "train", "files": 2}]  # fmt: skip
    assert first == run.local(TRAIN, "ref")
    repo = tmp_path / "home" / "hub" / "datasets--acme--chat"
    assert (repo / "refs" / "main").read_text() == commit
    # offline: the cache alone, not one request, the same bytes
    hub.requests.clear()
    assert run.ok("hf://datasets/acme/chat", "s2", HF_HUB_OFFLINE="1") == first and hub.requests == []
    # --split test fetches the test shard only
    hub.requests.clear()
    assert run.ok("hf://datasets/acme/chat", "t", "--split", "test") == run.local(TEST, "rt")
    assert hub.fetched() == ["data/test-00000-of-00001.parquet"]
    # datasets and hf see what packtool fetched: load_dataset offline on the cache gives the same records
    code = (
        "import json, datasets, huggingface_hub\n"
        f"snap = {str(repo / 'snapshots' / commit)!r}\n"
        "d = datasets.load_dataset(snap, split='train')\n"
        "info = huggingface_hub.scan_cache_dir()\n"
        "revs = [(r.repo_id, r.repo_type, sorted(x.commit_hash for x in r.revisions)) for r in info.repos]\n"
        "print(json.dumps({'rows': d.to_list(), 'repos': revs}))\n"
    )
    seen = json.loads(python(tmp_path, hub, code, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    assert seen["rows"] == TRAIN
    assert seen["repos"] == [["acme/chat", "dataset", [commit]]]
    # and load_dataset through the same hub reads the same records for each split, from the files packtool
    # fetched: it downloads none of them again
    hub.requests.clear()
    online = python(tmp_path, hub, "import json, datasets\nd = datasets.load_dataset('acme/chat')\n"
                                   "print(json.dumps({k: v.to_list() for k, v in d.items()}))")  # fmt: skip
    assert json.loads(online) == {"train": TRAIN, "test": TEST}
    assert not [p for p in hub.fetched() if p.endswith(".parquet")], hub.fetched()


def test_revisions_and_the_parquet_export(tmp_path: Path, hub: Hub, run: Run) -> None:
    old = hub.dataset("acme/chat", {"train.jsonl": b"".join(json.dumps(r).encode() + b"\n" for r in TEST)}, "v1")
    assert run.ok("hf://datasets/acme/chat@v1", "v1") == run.local(TEST, "r1")
    assert open_token_store(tmp_path / "v1").manifest["hub"][0]["commit"] == old
    assert (tmp_path / "home" / "hub" / "datasets--acme--chat" / "refs" / "v1").read_text() == old
    # a script dataset: read from refs/convert/parquet (CONFIG/SPLIT/NNNN.parquet)
    repo = hub.repo("dataset", "acme/scripted")
    repo.commit({"scripted.py": b"import datasets", "README.md": CARD}, "main")
    export = repo.commit({"default/train/0000.parquet": parquet(TRAIN[:10]), "default/test/0000.parquet": parquet(TEST),
                          "other/train/0000.parquet": parquet(TRAIN[10:])}, "refs/convert/parquet")  # fmt: skip
    converted = run.ok("hf://datasets/acme/scripted", "c")
    assert open_token_store(tmp_path / "c").manifest["hub"][0] == {
        "dataset": "acme/scripted", "revision": "refs/convert/parquet", "commit": export, "subset": "default",
        "split": "train", "files": 1}  # fmt: skip
    assert "scripted.py" not in hub.fetched() and converted == run.local(TRAIN[:10], "r2")
    hub.requests.clear()  # offline, the script's snapshot sends the run to the cached export
    assert run.ok("hf://datasets/acme/scripted", "c2", HF_HUB_OFFLINE="1") == converted and hub.requests == []
    other = run.ok("hf://datasets/acme/scripted@refs/convert/parquet", "o", "--subset", "other")
    assert other == run.local(TRAIN[10:], "r3")


def test_errors_are_one_line(hub: Hub, run: Run) -> None:
    gated = hub.repo("dataset", "acme/gated")
    gated.commit({"train.jsonl": json.dumps(TEST[0]).encode() + b"\n"}, "main")
    gated.tokens = {"hf_good"}
    line = run.error("hf://datasets/acme/gated")
    assert "gated" in line and "HTTP 401" in line and "HF_TOKEN" in line and f"{hub.url}/datasets/acme/gated" in line
    line = run.error("hf://datasets/acme/gated", HF_TOKEN="hf_bad")
    assert "gated" in line and "HTTP 403" in line and "HF_TOKEN" in line
    assert run("hf://datasets/acme/gated", "g", HF_TOKEN="hf_good")[0] == 0
    assert "the hub has no dataset repo acme/nope" in run.error("hf://datasets/acme/nope")
    line = run.error("hf://datasets/acme/chat", "--split", "validation")
    assert "has no validation split" in line and "one of: train, test" in line
    assert "has no subset 'fr'" in run.error("hf://datasets/acme/chat", "--subset", "fr")
    assert "has no revision 'v9'" in run.error("hf://datasets/acme/chat@v9")
    hub.requests.clear()
    line = run.error("hf://datasets/acme/chat", HF_HUB_OFFLINE="1")
    assert "not in the local Hugging Face cache" in line and "HF_HUB_OFFLINE is set" in line and hub.requests == []
    assert "hf download acme/chat --repo-type dataset" in line
    hub.faults["data/train-00001-of-00002.parquet"] = "truncate"
    line = run.error("hf://datasets/acme/chat")
    assert "train-00001-of-00002.parquet" in line and "retry" in line
    assert "--split does not apply to a hub path" in run.error("hf://datasets/acme/chat/data/x.parquet", "--split", "a")
    line = run.error("hf://datasets/acme/chat", HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens there
    assert "cannot reach the hub at http://127.0.0.1:9" in line and "HF_HUB_OFFLINE=1" in line


def test_a_dropped_transfer_resumes_and_progress_counts_the_bytes(hub: Hub, run: Run,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A connection dropped mid-file: the rest is asked for with an HTTP Range and the file completes; the
    download reports its bytes through the progress callback (the CLI draws it on a terminal)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)  # bytes reach the file before the drop (10 MB else)
    shard = "data/train-00001-of-00002.parquet"
    hub.faults[shard] = "drop-once"
    calls: list[tuple[int, int]] = []
    options = HubOptions(progress=lambda done, total: calls.append((done, total)))
    paths = expand_inputs(["hf://datasets/acme/chat"], options)
    size = len(hub.repo("dataset", "acme/chat").commits[options.resolved[0]["commit"]][shard])
    assert [p.name for p in paths] == ["train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]
    files = hub.repo("dataset", "acme/chat").commits[options.resolved[0]["commit"]]
    assert paths[1].read_bytes() == files[shard] and hub.ranges == [(shard, f"bytes={size // 2 // 256 * 256}-")]
    total = sum(len(files[f]) for f in ("data/train-00000-of-00002.parquet", shard))
    assert calls and calls[-1] == (total, total) and all(d <= t for d, t in calls)


def test_a_gated_refusal_is_one_line_from_the_command(tmp_path: Path, hub: Hub, bpe_tokenizer_dir: Path) -> None:
    """As a user runs it (a process of its own): huggingface_hub's logging and warnings never reach stderr."""
    hub.repo("dataset", "acme/gated").commit({"train.jsonl": b"{}\n"}, "main")
    hub.repo("dataset", "acme/gated").tokens = {"hf_good"}
    done = subprocess.run([sys.executable, "-m", "packtool", "tokenize", "hf://datasets/acme/gated", "--tokenizer",
                           str(bpe_tokenizer_dir), "--output", str(tmp_path / "o")], env=env(tmp_path, hub),
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "is gated" in lines[0], done.stderr


# ---- the selection, against datasets' own resolution of the same files ----

LAYOUTS: dict[str, dict[str, str]] = {
    "sharded": {"data/train-00000-of-00002.parquet": "", "data/train-00001-of-00002.parquet": "",
                "data/test-00000-of-00001.parquet": "", "extra/notes.jsonl": ""},
    "names": {"train.jsonl": "", "test.jsonl": "", "validation.jsonl": "", "docs/intro.md": ""},
    "dirs": {"data/train/a.jsonl": "", "data/train/b.jsonl": "", "data/dev/c.jsonl": ""},
    "words": {"my_train_01.csv": "", "my-valid_01.csv": "", "my-valid_02.csv": ""},
    "plain": {"corpus.jsonl": "", "more/part.jsonl": ""},
    "configs": {"README.md": "---\nconfigs:\n- config_name: en\n  data_files:\n  - split: train\n    path: en/*.jsonl\n"
                             "  - split: test\n    path: en_test.jsonl\n- config_name: fr\n  default: true\n"
                             "  data_files: fr/train*.jsonl\n- config_name: all\n  data_dir: fr\n---\n",
                "en/a.jsonl": "", "en/b.jsonl": "", "en_test.jsonl": "", "fr/train-1.jsonl": "",
                "fr/test.jsonl": ""},  # fmt: skip
}


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".parquet"):
            path.write_bytes(parquet([{"text": rel}]))
        elif rel.endswith(".csv"):
            path.write_text(f"text\n{rel}\n")
        else:
            path.write_text(text or json.dumps({"text": rel}) + "\n")


def test_selection_equals_datasets_resolution(tmp_path: Path) -> None:
    cases = [(k, None) for k in LAYOUTS if k != "configs"] + [("configs", s) for s in ("en", "fr", "all", None)]
    code = ["import json, sys, datasets", "out = {}"]
    for layout, subset in cases:
        _write(tmp_path / layout, LAYOUTS[layout])
        code.append(f"b = datasets.load_dataset_builder({str(tmp_path / layout)!r}, {subset!r})")
        code.append(f"out[{layout + '/' + str(subset)!r}] = {{str(k): sorted(v) for k, v in b.config.data_files.items()}}")
    code.append("print(json.dumps(out))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    done = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=120,
                          env={**clean, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "h")})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    for layout, subset in cases:
        files = sorted(LAYOUTS[layout])
        readme = LAYOUTS[layout].get("README.md")
        want = {split: [str(Path(p).relative_to(tmp_path / layout)) for p in paths]
                for split, paths in theirs[f"{layout}/{subset}"].items()}  # fmt: skip
        for split in want:
            got = select(files, readme, subset, split, "o/n", "hf://datasets/o/n")
            assert list(got.files) == want[split], (layout, subset, split)
        first = next(iter(want))
        with pytest.raises(InputError, match="pass --split NAME with one of: " + ", ".join(want)):
            select(files, readme, subset, "nope", "o/n", "hf://datasets/o/n")
        assert first


def test_several_subsets_and_no_default_lists_them(tmp_path: Path) -> None:
    card = "---\nconfigs:\n- config_name: a\n  data_files: a.jsonl\n- config_name: b\n  data_files: b.jsonl\n---\n"
    with pytest.raises(InputError, match="several subsets and no default one.*one of: a, b"):
        select(["a.jsonl", "b.jsonl", "README.md"], card, None, None, "o/n", "hf://datasets/o/n")
    assert select(["a.jsonl", "b.jsonl"], card, "b", None, "o/n", "x").files == ("b.jsonl",)
    with pytest.raises(InputError, match="stored as .tar files"):
        select(["data/train-0.tar", "data/train-1.tar", "data/readme.txt"], None, None, None, "o/n", "x")
    with pytest.raises(InputError, match="holds only part of the default subset's train split"):
        select(["default/partial-train/0000.parquet"], None, None, None, "o/n", "x", converted=True)


def test_subset_and_split_need_a_hub_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = cli("tokenize", str(tmp_path / "a.jsonl"), "--tokenizer", "x", "--output", str(tmp_path / "o"),
                       "--split", "test")  # fmt: skip
    assert code == 2 and "--split 'test' applies to hub datasets only" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(InputError, match="HF_HUB_OFFLINE is set"):
        expand_inputs(["hf://datasets/o/n"], HubOptions(split="test"))


def test_run_yaml_takes_subset_and_split(tmp_path: Path) -> None:
    from packtool.cli.runconfig import load_run_config

    (tmp_path / "run.yaml").write_text("tokenize: {inputs: [hf://datasets/org/ds], tokenizer: org/tok, output: out, "
                                       "subset: en, split: test}\n")  # fmt: skip
    step = load_run_config(tmp_path / "run.yaml")[0]
    assert step.tokenize is not None and (step.tokenize.subset, step.tokenize.split) == ("en", "test")
    (tmp_path / "bad.yaml").write_text("tokenize: {inputs: [a.jsonl], tokenizer: t, output: out, split: test}\n")
    code, _, err = cli("run", str(tmp_path / "bad.yaml"))
    assert code == 2 and "--split 'test' applies to hub datasets only" in err
