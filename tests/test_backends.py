"""--backend hf|fast|auto: identical bytes, honest fallback, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import big_vocab_texts, cli, zipf_texts
from tokenizers import Tokenizer, processors

import packtool
from packtool.core.encoding.backends import HFBackend
from packtool.errors import ConfigError
from packtool.stages.tokenize import backend_choice as backends
from packtool.stages.tokenize.backend_choice import choose_backend

fastokens = pytest.importorskip("fastokens")

TRICKY = ["", " ", "\n\n\t  x  ", "digits 1234567890 3.14 1,000", "🙂 👩‍👩‍👧‍👦 🇫🇷 e\u0301 東京 データ مرحبا",
          "specials <|endoftext|> in <|im_start|>user\nhi<|im_end|> <|endof", "I'M DON'T we'll", "a" * 3000,
          "def f(x):\n    return x\n\n\n", "ctrl \x00\x1b[31m \u200b\ufeff \u00a0\u3000"]




def write_jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts), encoding="utf-8")
    return path


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture(scope="module")
def template_bos_tokenizer(bpe_tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture BPE with a Llama-style post-processor that prepends <s>: exercises add_special_tokens."""
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    out = tmp_path_factory.mktemp("tpl")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text((bpe_tokenizer_dir / "tokenizer_config.json").read_text())
    return out


@pytest.mark.parametrize("which", ["bpe", "template"])
def test_fast_and_hf_write_identical_bytes(which: str, bpe_tokenizer_dir: Path, template_bos_tokenizer: Path,
                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok_dir = bpe_tokenizer_dir if which == "bpe" else template_bos_tokenizer
    data = write_jsonl(tmp_path / "in.jsonl", TRICKY + zipf_texts(1500, seed=4))
    outs = {}
    for backend in ("hf", "fast", "auto"):
        out = tmp_path / backend
        code, _, err = cli(*["tokenize", str(data), "--tokenizer", str(tok_dir), "--output", str(out), "--backend",
                                backend, "--chunk-bytes", "20000", "--workers", "2", "-q"])
        assert code == 0, err
        outs[backend] = out
    assert manifest(outs["hf"])["backend"]["name"] == "hf"
    assert manifest(outs["fast"])["backend"] == {"name": "fast", "package": f"fastokens=={fastokens_version()}"}
    assert manifest(outs["auto"])["backend"]["name"] == "fast"  # installed, supported, verified
    for name in ("tokens.bin", "tokens.boundaries"):
        assert (outs["fast"] / name).read_bytes() == (outs["hf"] / name).read_bytes()
    strip = [{k: v for k, v in manifest(o).items() if k not in ("backend",)} for o in outs.values()]
    assert strip[0] == strip[1] == strip[2]
    if which == "template":
        store = np.fromfile(outs["fast"] / "tokens.bin", np.uint16)
        assert store[0] == Tokenizer.from_file(str(tok_dir / "tokenizer.json")).token_to_id("<s>")


def fastokens_version() -> str:
    from importlib import metadata

    return metadata.version("fastokens")


def test_auto_falls_back_to_hf_when_fast_cannot_load(big_vocab_tokenizer_dir: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """fastokens has no WhitespaceSplit pre-tokenizer: auto must use hf, fast must say so in one line."""
    data = write_jsonl(tmp_path / "in.jsonl", big_vocab_texts(300))
    code, _, err = cli(*["tokenize", str(data), "--tokenizer", str(big_vocab_tokenizer_dir), "--output",
                            str(tmp_path / "auto"), "-q"])
    assert code == 0, err
    assert manifest(tmp_path / "auto")["backend"]["name"] == "hf"
    assert manifest(tmp_path / "auto")["dtype"] == "uint32"
    code, _, err = cli(*["tokenize", str(data), "--tokenizer", str(big_vocab_tokenizer_dir), "--output",
                            str(tmp_path / "fast"), "--backend", "fast", "-q"])
    assert code == 1 and err.startswith("error: fastokens cannot load this tokenizer") and err.count("\n") == 1
    assert not (tmp_path / "fast").exists()


def test_fast_gives_loss_masks_identical_to_hf(bpe_tokenizer_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "pc.jsonl"
    data.write_text(json.dumps({"prompt": "Q: why?", "completion": " A: because."}) + "\n")
    args = ["tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--format", "prompt-completion", "-q"]
    for backend in ("fast", "hf", "auto"):
        code, _, err = cli(*args, "--output", str(tmp_path / backend), "--backend", backend)
        assert code == 0, err
    assert manifest(tmp_path / "auto")["backend"]["name"] == "fast"
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes()


def test_unknown_backend_is_a_usage_error_before_any_work(bpe_tokenizer_dir: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    data = write_jsonl(tmp_path / "in.jsonl", ["hello"])
    code, _, err = cli(*["tokenize", str(data), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "o"), "--backend", "rust", "-q"])
    assert code == 2 and "'rust' is not one of" in err and "Traceback" not in err
    assert not list(tmp_path.glob(".o*")) and not (tmp_path / "o").exists()  # nothing created


def test_unknown_backend_in_library_config_is_config_error(tmp_path: Path) -> None:
    config = packtool.TokenizeConfig(("x.jsonl",), "tok", str(tmp_path / "o"), backend="rust")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--backend 'rust' is not one of auto, hf, fast"):
        config.validate()


class _OffByOne:
    """A fast engine that disagrees with tokenizers on documents containing a digit."""

    name = "fast"

    def __init__(self, path: str, reference: Tokenizer | None = None, preloaded: object = None) -> None:
        self.inner = HFBackend(Tokenizer.from_file(path))

    def encode_flat(self, texts: list[str], add_special_tokens: bool) -> tuple[np.ndarray, np.ndarray]:
        ids, lengths = self.inner.encode_flat(texts, add_special_tokens)
        ends = np.cumsum(lengths)
        bad = np.array([any(c.isdigit() for c in t) for t in texts]) & (lengths > 0)
        ids = ids.copy()
        ids[ends[bad] - 1] += 1
        return ids, lengths


def test_auto_verifies_on_a_sample_and_falls_back(bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(bpe_tokenizer_dir / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    monkeypatch.setattr(backends, "FastBackend", _OffByOne)
    clean = ["no digits here", "nor here"]
    assert choose_backend("auto", tok, path, lambda: clean, True, False).name == "fast"
    dirty = [*clean, "one 1"]
    choice = choose_backend("auto", tok, path, lambda: dirty, True, False)
    assert choice.name == "hf" and "document 2 of the verification sample" in choice.reason
    with pytest.raises(backends.TokenizerError, match="different ids"):
        choose_backend("fast", tok, path, lambda: dirty, True, False)


def test_auto_without_fastokens_uses_hf(bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(bpe_tokenizer_dir / "tokenizer.json")
    monkeypatch.setattr(backends, "fast_version", lambda: None)
    choice = choose_backend("auto", Tokenizer.from_file(path), path, lambda: pytest.fail("no sample needed"), True, False)
    assert choice.name == "hf" and "not installed" in choice.reason


def test_each_tokenizer_is_loaded_once_per_run(bpe_tokenizer_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference and the fast engine are loaded once each, whatever the workers (threads share them)."""
    from packtool.stages.tokenize.engine import tokenizer as tokenizer_module

    loads: list[str] = []
    real_fast_init = backends.FastBackend.__init__
    real_from_file = Tokenizer.from_file

    def counting_fast(self: object, path: str, reference: Tokenizer | None = None, preloaded: object = None) -> None:
        loads.append("fast")
        real_fast_init(self, path, reference, preloaded)  # type: ignore[arg-type]

    class CountingTokenizer:
        @staticmethod
        def from_file(path: str) -> Tokenizer:
            loads.append("hf")
            return real_from_file(path)

    fastokens = pytest.importorskip("fastokens")
    real_fast_file = fastokens.Tokenizer.from_file

    class CountingFastokens:  # the file itself is read once: the run starts its load early and the engine takes it
        @staticmethod
        def from_file(path: str) -> object:
            loads.append("fastokens file")
            return real_fast_file(path)

    monkeypatch.setattr(fastokens, "Tokenizer", CountingFastokens)
    monkeypatch.setattr(backends, "_FAST", {})  # no engine left from an earlier test of this process
    monkeypatch.setattr(backends.FastBackend, "__init__", counting_fast)
    monkeypatch.setattr(tokenizer_module, "Tokenizer", CountingTokenizer)
    monkeypatch.setattr(backends, "Tokenizer", CountingTokenizer)
    data = write_jsonl(tmp_path / "in.jsonl", zipf_texts(3000, seed=6))
    config = packtool.TokenizeConfig(inputs=(str(data),), tokenizer=str(bpe_tokenizer_dir), output=str(tmp_path / "s"),
                                     backend="fast", workers=2, chunk_bytes=8000)  # type: ignore[arg-type]
    result = packtool.tokenize_corpus(config)
    assert result.n_chunks > 10
    assert sorted(loads) == ["fast", "fastokens file", "hf"]


@pytest.fixture
def fast_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths `fastokens.Tokenizer.from_file` loads from now on, with no engine cached nor load pending."""
    from packtool.stages.tokenize.engine import early

    loads: list[str] = []
    real = fastokens.Tokenizer.from_file

    class Counting:
        @staticmethod
        def from_file(path: str) -> object:
            loads.append(path)
            return real(path)

    monkeypatch.setattr(fastokens, "Tokenizer", Counting)
    monkeypatch.setattr(backends, "_FAST", {})
    monkeypatch.setattr(early, "_LOADS", {})
    return loads


def test_the_console_script_starts_the_load_from_argv_and_the_run_takes_it(
    bpe_tokenizer_dir: Path, tmp_path: Path, fast_loads: list[str]
) -> None:
    """`packtool tokenize ... --tokenizer=T --backend fast` read from argv starts the fastokens load before the CLI
    parses the line; the run then takes that load (the file is read once) and writes what a plain run writes.
    Other commands, `--backend hf` and a missing --tokenizer start nothing."""
    from support import write_jsonl

    from packtool.stages.tokenize.engine import early

    for args in (["pack", "x", "--tokenizer", str(bpe_tokenizer_dir)], ["tokenize", "x.jsonl", "--backend", "fast"],
                 ["tokenize", "x.jsonl", "--tokenizer", str(bpe_tokenizer_dir), "--backend=hf"]):
        early.start_from_argv(args)
    assert not early._LOADS
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in zipf_texts(300, seed=21)])
    args = ["tokenize", str(src), f"--tokenizer={bpe_tokenizer_dir}", "--output", str(tmp_path / "a"), "--backend", "fast"]
    early.start_from_argv(args)
    assert len(early._LOADS) == 1
    code, _, err = cli(*args)
    assert code == 0, err
    assert fast_loads == [str((bpe_tokenizer_dir / "tokenizer.json").resolve())] and not early._LOADS
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "b"),
                       "--backend", "hf")
    assert code == 0, err
    for name in ("tokens.bin", "tokens.boundaries", "manifest.json"):
        a, b = (tmp_path / "a" / name).read_bytes(), (tmp_path / "b" / name).read_bytes()
        assert a == b or name == "manifest.json" and json.loads(a)["tokenizer"] == json.loads(b)["tokenizer"]


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def sentencepiece_style_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Gemma-style BPE (spaces become '▁' in a normalizer, byte fallback): no ByteLevel anywhere, so the fast
    engine gives its ids but cannot derive the offsets a loss mask needs."""
    from tokenizers import decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", *(f"<0x{b:02X}>" for b in range(256))]
    tok.train_from_iterator(zipf_texts(300, seed=8), trainer=trainers.BpeTrainer(
        vocab_size=700, special_tokens=specials, show_progress=False))
    out = tmp_path_factory.mktemp("sp")
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML, "eos_token": "<|im_end|>"}))
    return out


def test_a_tokenizer_that_cannot_give_offsets_is_known_from_its_file(
    sentencepiece_style_dir: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast engine is not loaded early for a format with a loss mask when tokenizer.json never names ByteLevel
    (Gemma 3's 262k vocabulary takes fastokens 3.2 s to load, for a run that then uses tokenizers); for text it is."""
    from packtool.stages.tokenize.engine import early

    assert early.may_be_byte_level(bpe_tokenizer_dir / "tokenizer.json")
    assert not early.may_be_byte_level(sentencepiece_style_dir / "tokenizer.json")
    for block in (1, 3, 7, 10, 11, 12):  # the name found whole across block boundaries, wherever it falls
        monkeypatch.setattr(early, "_SCAN_BLOCK", block)
        for pad in range(12):
            only = sentencepiece_style_dir.parent / f"one_name_{block}_{pad}.json"
            only.write_bytes(b"x" * pad + b'{"type": "ByteLevel"}')
            assert early.may_be_byte_level(only), (block, pad)
        assert not early.may_be_byte_level(sentencepiece_style_dir / "tokenizer.json")
    hits = early._names_byte_level.cache_info().hits
    assert not early.may_be_byte_level(sentencepiece_style_dir / "tokenizer.json")  # read once per file version
    assert early._names_byte_level.cache_info().hits == hits + 1
    monkeypatch.setattr(early, "_LOADS", {})
    started: list[str] = []
    monkeypatch.setattr(early.threading, "Thread", lambda *a, **k: type("T", (), {"start": lambda s: started.append(1)})())
    for fmt in ("chat", "sharegpt", "alpaca", "prompt-completion", "auto"):
        early.start_from_argv(["tokenize", "x.jsonl", "--tokenizer", str(sentencepiece_style_dir), f"--format={fmt}"])
    assert not early._LOADS and not started
    early.start_from_argv(["tokenize", "x.jsonl", "--tokenizer", str(sentencepiece_style_dir)])  # text: ids only
    assert len(early._LOADS) == 1 and started == [1]


def test_auto_decides_on_offsets_without_waiting_for_the_fast_engine(sentencepiece_style_dir: Path) -> None:
    """A format with a loss mask on a tokenizer whose offsets fast cannot derive: auto takes tokenizers and
    --backend fast is refused, both before the engine's load is waited for and before any sample is read."""
    from concurrent.futures import Future

    class NeverWaited(Future):  # type: ignore[type-arg]
        def result(self, timeout: float | None = None) -> object:
            pytest.fail("the fast engine was waited for")

    path = str(sentencepiece_style_dir / "tokenizer.json")
    tok = Tokenizer.from_file(path)
    choice = choose_backend("auto", tok, path, lambda: pytest.fail("no sample needed"), False, True, NeverWaited())
    assert choice.name == "hf" and "not a byte-level BPE" in choice.reason
    with pytest.raises(ConfigError, match="cannot give the token offsets"):
        choose_backend("fast", tok, path, lambda: pytest.fail("no sample needed"), False, True, NeverWaited())


def test_chat_on_a_tokenizer_without_byte_level_offsets_never_loads_fastokens(
    sentencepiece_style_dir: Path, tmp_path: Path, fast_loads: list[str]
) -> None:
    """`--format chat` with the default backend on a Gemma-style tokenizer: tokenizers writes the store and the fast
    engine is never loaded (it used to load, 3.2 s for Gemma 3, then be dropped); --format text still uses it."""
    from support import write_jsonl

    chats = [{"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": t[::-1]}]}
             for t in zipf_texts(40, seed=9)]
    src = write_jsonl(tmp_path / "chat.jsonl", chats)
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(sentencepiece_style_dir), "--output",
                       str(tmp_path / "c"), "--format", "chat", "-q")
    assert code == 0, err
    assert manifest(tmp_path / "c")["backend"]["name"] == "hf" and fast_loads == []
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": t} for t in zipf_texts(40, seed=10)])
    code, _, err = cli("tokenize", str(text), "--tokenizer", str(sentencepiece_style_dir), "--output",
                       str(tmp_path / "t"), "-q")
    assert code == 0, err
    assert manifest(tmp_path / "t")["backend"]["name"] == "fast" and len(fast_loads) == 1
