"""The first hour with transformers (issue 34), met as a new user meets it: the `[hf]` extra and the packaging
metadata, docs/HF.md's recipes (installs, imports, CPU settings), the TRL lines `export` prints,
scripts/train_hf_trainer.py without accelerate, and what `make test` says and lists."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import cli, write_jsonl

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HF_MD = (ROOT / "docs" / "HF.md").read_text()


def _pins(requirements: list[str]) -> dict[str, str]:
    return {r.split("==")[0]: r for r in requirements if "==" in r}


def test_the_hf_extra_brings_transformers_and_accelerate_pinned_as_interop() -> None:
    extras = PYPROJECT["project"]["optional-dependencies"]
    hf, interop = _pins(extras["hf"]), _pins(extras["interop"])
    assert {"transformers", "accelerate", "torch"} <= set(hf)
    assert all(hf[name] == interop[name] for name in ("transformers", "accelerate", "torch"))
    # the download of a hub tokenizer imports huggingface_hub: declared, not only inherited from tokenizers
    assert any(d.startswith("huggingface_hub") for d in PYPROJECT["project"]["dependencies"])


def test_license_is_an_spdx_string_with_a_setuptools_that_reads_it() -> None:
    """A TOML table made setuptools warn three times per build that it is deprecated."""
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    setuptools = [r for r in requires if r.startswith("setuptools")]
    assert setuptools == ["setuptools>=77"], requires  # 77: PEP 639 license expressions


def test_hf_md_installs_the_extra_and_its_recipes_import_what_they_use() -> None:
    assert 'pip install "packtool[hf]"' in HF_MD and "trl==1.16.0" in HF_MD
    assert "from_config(" in HF_MD and "from_pretrained(" in HF_MD
    assert "flash-attention names" not in HF_MD  # a TRL warning that TRL 1.16 never prints
    assert '"use_cpu": True, "bf16": False' in HF_MD
    blocks = re.findall(r"```python\n(.*?)```", HF_MD, re.S)
    assert len(blocks) >= 4
    builtins = set(dir(__builtins__) if isinstance(__builtins__, dict) is False else __builtins__)
    for block in blocks:
        tree = ast.parse(block)
        bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                 for a in n.names}  # fmt: skip
        bound |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        bound |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert used <= bound | builtins | {"__name__"}, (used - bound - builtins, block[:80])


def test_export_trl_prints_the_cpu_settings(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    rows = [{"prompt": f"q{i} the model", "completion": f"a{i} packing tokens"} for i in range(20)]
    src = write_jsonl(tmp_path / "pc.jsonl", rows)
    for args in (("tokenize", str(src), "--format", "prompt-completion", "--tokenizer", str(bpe_tokenizer_dir),
                  "--output", str(tmp_path / "s"), "-q"),
                 ("pack", str(tmp_path / "s"), "--size", "64", "--output", str(tmp_path / "p"), "-q")):  # fmt: skip
        code, _, err = cli(*args)
        assert code == 0, err
    code, out, err = cli("export", str(tmp_path / "p"), "--to", "trl", "--output", str(tmp_path / "e"), "-q")
    assert code == 0, err
    recipe = out[out.index("TRL SFT:") :]
    assert "SFTConfig(packing=False, padding_free=True" in recipe
    assert "on CPU add use_cpu=True, bf16=False" in recipe


def test_train_script_without_accelerate_is_one_line(tmp_path: Path) -> None:
    """transformers' TrainingArguments raised its ImportError as a traceback; the script names the extra."""
    hide = ("import runpy, sys; sys.modules['accelerate'] = None; sys.argv = ['train_hf_trainer.py', 'packs'];"
            f"runpy.run_path({str(ROOT / 'scripts' / 'train_hf_trainer.py')!r}, run_name='__main__')")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)  # fmt: skip
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: accelerate is not installed") and 'pip install "packtool[hf]"' in lines[0]


def test_make_test_says_how_long_and_lists_no_interop_skip(tmp_path: Path) -> None:
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ntest:") : make.index("\n\n", make.index("\ntest:"))]
    assert re.search(r"@echo .*~\d+ min on 2 cores", recipe), recipe
    # the interop modules skip themselves at import when a trainer is absent: deselected, they are not collected
    expression = re.search(r'-m "([^"]+)"', recipe).group(1)  # type: ignore[union-attr]
    hook = _interop_conftest().pytest_ignore_collect
    assert hook(ROOT / "tests" / "interop" / "test_trl.py", _Config(expression)) is True
    assert hook(ROOT / "tests" / "interop" / "test_trl.py", _Config("interop")) is None


class _Config:
    def __init__(self, expression: str) -> None:
        self.expression = expression

    def getoption(self, name: str) -> str:
        assert name == "markexpr"
        return self.expression


def _interop_conftest():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("interop_conftest", ROOT / "tests" / "interop" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("expression", ["interop", "interop and not slow", "not gpu"])
def test_interop_is_still_collected_when_selected(expression: str) -> None:
    module = _interop_conftest()
    assert module._selects_interop(expression)
    assert not module._selects_interop("not gpu and not slow and not interop")
