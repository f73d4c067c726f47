"""The chat fast paths give exactly what the reference paths give.

- packtool's template sandbox (memoised attribute checks, direct item access on message dicts,
  builtin-method calls without context lookups) renders every vendored real template as
  transformers' own compiled template does, and refuses what the stock sandbox refuses;
- the numpy byte kernels behind `--backend fast` (token bytes checked against the text, the loss
  mask in byte space) equal a per-document pure-Python reference, bad documents included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from test_chat_templates import CONVERSATIONS, FAMILIES, FIXTURES

from packtool.core.encoding.byte_offsets import ByteTables, _overlaps
from packtool.core.encoding.chat import ChatRecordError, load_chat_template, prepare

if TYPE_CHECKING:
    from tokenizers import Tokenizer

transformers = pytest.importorskip("transformers")

EXTRA: list[list[dict[str, Any]]] = [  # shapes that take the rarer branches: tool turns in a row, a first model turn
    [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}, {"role": "assistant", "content": "fine"}],
    [{"role": "user", "content": "two tools"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "a", "arguments": '{"x": 1}'}}]},
     {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, {"role": "assistant", "content": "done"}],
    [{"role": "system", "content": "sys"}, {"role": "user", "content": "<tool_response>x</tool_response>"},
     {"role": "assistant", "content": "a</think>b", "reasoning_content": None}],
]


def reference_render(source: str, messages: list[dict[str, Any]], tokens: dict[str, str]) -> str | None:
    """transformers' compiled template, called as apply_chat_template calls it; None when it raises."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        return str(_compile_jinja_template(source).render(
            messages=messages, tools=None, documents=None, add_generation_prompt=False, **tokens))
    except Exception:
        return None


@pytest.mark.parametrize("family", FAMILIES)
def test_sandbox_renders_real_templates_as_transformers(family: str) -> None:
    spec = json.loads((FIXTURES / f"{family}.json").read_text("utf-8"))
    tokens = {k: spec[k] for k in ("bos_token", "eos_token") if spec.get(k)}
    chat = load_chat_template(spec["chat_template"], spec.get("bos_token"), spec.get("eos_token"),
                              tuple(t["content"] for t in spec["added_tokens"]))
    rendered = 0
    for messages in [*CONVERSATIONS, *EXTRA]:
        prepared = prepare(messages)
        want = reference_render(spec["chat_template"], prepared, tokens)
        if want is None:
            with pytest.raises(ChatRecordError):
                chat.render(prepared)
            continue
        assert chat.render(prepared) == want, (family, messages)
        rendered += 1
    assert rendered >= 3, family


UNSAFE = [  # the stock sandbox raises on these, or renders the forbidden part as nothing
    "{{ messages.append(1) }}",  # mutating a list
    "{{ messages[0].pop('role') }}",  # mutating a dict
    "{{ messages[0].update({'x': 1}) }}",
    "{{ messages[0].content.__class__.__mro__ }}",  # underscore attributes
    "[{{ '{0.__class__}'.format(messages[0].content) }}]",  # str.format goes through the sandboxed formatter
    "[{{ messages[0].content.format_map({'0': 1}) }}]",
    "{% set f = messages[0].content.format %}[{{ f('{0.__class__}', 1) }}]",
]
SAFE = [
    "{{ messages[0].content.format('x') }}|{{ messages[0].items() | list | length }}|{{ messages[0].missing is defined }}",
    "{% for m in messages %}{{ loop.index0 }}{{ m.role.upper() }}{{ m.content.split(' ')[-1].strip() }}"
    "{% if loop.last %}!{% endif %}{% endfor %}{{ messages | map(attribute='role') | join(',') }}",
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}{{ ns.n }}"
    "{{ ns.missing is defined }}{{ messages[0].get('role') }}{{ messages[0].keys() | list }}",
]


@pytest.mark.parametrize("source", UNSAFE + SAFE)
def test_sandbox_decides_as_the_stock_sandbox(source: str) -> None:
    messages = prepare([{"role": "user", "content": "hi {0} there "}, {"role": "assistant", "content": " yo"}])
    want = reference_render(source, messages, {})
    chat = load_chat_template(source, None, None, ())
    if source in UNSAFE[:4]:
        assert want is None
    if source in SAFE:
        assert want is not None and want.strip()
    if want is None:
        with pytest.raises(ChatRecordError, match="cannot render"):
            chat.render(messages)
    else:
        assert chat.render(messages) == want


def spell_reference(tables: ByteTables, ids: np.ndarray, lengths: np.ndarray, texts: list[str],
                    spans: list[list[tuple[int, int]] | None]) -> tuple[np.ndarray, np.ndarray]:
    """Per document, per token: does it spell the text's bytes, and does its byte range meet a span."""
    loss, bad, t = [], [], 0
    for text, n, doc_spans in zip(texts, lengths.tolist(), spans, strict=True):
        data = text.encode("utf-8", "surrogatepass")
        pos, ok = 0, True
        byte_spans = [(len(text[:s].encode("utf-8", "surrogatepass")), len(text[:e].encode("utf-8", "surrogatepass")))
                      for s, e in doc_spans or () if e > s]
        for i in ids[t : t + n].tolist():
            size = int(tables.lens[i]) if i < tables.lens.size else 0
            piece = bytes(tables.flat[tables.starts[i] : tables.starts[i] + size]) if size else b""
            ok = ok and size > 0 and data[pos : pos + size] == piece
            j = next((k for k, (_, e) in enumerate(byte_spans) if e > pos), None)
            loss.append(int(j is not None and byte_spans[j][0] < pos + size))
            pos += size
        bad.append(not (ok and pos == len(data)))
        t += n
    return np.array(loss, np.uint8), np.array(bad, bool)


def test_numpy_kernels_equal_a_per_document_reference(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    from packtool.core.encoding.backends import FastBackend

    pytest.importorskip("fastokens")
    from test_chat_fast import MULTI, build_llama_like

    tok_dir = build_llama_like(tmp_path / "tok")
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    tables = ByteTables.build(tok)
    fast = FastBackend(str(tok_dir / "tokenizer.json"), tok)
    rng = np.random.default_rng(7)
    batches = [
        [f"plain ascii text number {i} with a few words" for i in range(30)],  # the ASCII shortcut
        [*MULTI, "café naïve", "e\u0301", "<|eot_id|>end"] * 3,
    ]
    for texts in batches:
        ids, lengths = fast.encode_flat(texts, False)
        ids = ids.copy()
        natural = 0
        for broken in ("no", "swap", "both"):
            # swapped tokens alone keep every document's byte count (the byte comparison must find them); an id
            # outside the vocabulary makes its document bad by length (the path for a batch with a bad document)
            if broken == "both":
                ids[int(rng.integers(ids.size))] = tables.lens.size + 5
            if broken != "no":
                doc_of = np.searchsorted(np.cumsum(lengths), np.arange(ids.size), side="right")
                k = int(rng.integers(ids.size - 1))
                while ids[k] == ids[k + 1] or doc_of[k] != doc_of[k + 1]:  # two different tokens of one document
                    k = int(rng.integers(ids.size - 1))
                ids[k], ids[k + 1] = ids[k + 1], ids[k]
            spans: list[list[tuple[int, int]] | None] = []
            for text in texts:
                cuts = sorted(rng.integers(0, len(text) + 1, size=2 * int(rng.integers(0, 3))).tolist())
                spans.append([(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)] or None)
            loss, bad = tables.targets(ids, lengths, texts, spans)
            want_loss, want_bad = spell_reference(tables, ids, lengths, texts, spans)
            assert np.array_equal(bad, want_bad)
            good = np.repeat(~want_bad, lengths)  # a bad document is re-encoded by tokenizers: its mask is unused
            assert np.array_equal(loss[good], want_loss[good])
            if broken == "no":
                natural = int(want_bad.sum())  # the NFD documents: the normalizer rewrites them
            else:
                assert want_bad.sum() > natural


def test_overlapping_spans_take_the_searchsorted_path() -> None:
    start, end = np.array([0, 2, 4, 6, 8]), np.array([2, 4, 6, 8, 10])
    disjoint = _overlaps(start, end, np.array([1, 5]), np.array([3, 6]), 10)
    assert disjoint.tolist() == [1, 1, 1, 0, 0]
    overlapping = _overlaps(start, end, np.array([1, 3]), np.array([5, 7]), 10)  # not disjoint: searchsorted decides
    assert overlapping.tolist() == [1, 1, 1, 1, 0]


def test_overlaps_marks_exactly_the_tokens_sharing_a_byte_with_a_span() -> None:
    """Token runs per span (two binary searches each) against the definition, with spans that touch
    (a token two spans share), spans inside one token, and tokens outside every span."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        lens = rng.integers(1, 5, size=int(rng.integers(1, 40)))
        end = np.cumsum(lens)
        start = end - lens
        cuts = np.unique(rng.integers(0, int(end[-1]) + 1, size=2 * int(rng.integers(1, 6))))
        pairs = cuts[: cuts.size // 2 * 2].reshape(-1, 2)
        if rng.random() < 0.5 and pairs.shape[0] > 1:  # make neighbours touch: [a, b) then [b, c)
            pairs[1:, 0] = pairs[:-1, 1]
        pairs = pairs[pairs[:, 1] > pairs[:, 0]]
        if not pairs.shape[0]:
            continue
        got = _overlaps(start, end, pairs[:, 0], pairs[:, 1], int(end[-1]))
        want = [int(any(s < e2 and e > s2 for s2, e2 in pairs)) for s, e in zip(start, end, strict=True)]
        assert got.dtype == np.uint8 and got.tolist() == want


def chat_corpus(path: Path, n: int) -> Path:
    rows = [{"messages": CONVERSATIONS[i % len(CONVERSATIONS)]} for i in range(n)]
    rows[5] = {"messages": [{"role": "wizard", "content": "x"}]}  # a bad record: rejected (skip) or raised (fail)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


def test_prerendered_chunks_give_the_same_result_and_errors(tmp_path: Path) -> None:
    """Chunks rendered ahead (while the fast engine loads) are taken once by their task: the same ids,
    loss, counts and rejects as rendering in the task, the same error in fail mode; drop() frees the rest."""
    from dataclasses import replace

    from test_chat_templates import build_tokenizer, fixture

    import packtool
    from packtool.errors import InputError
    from packtool.stages.tokenize import chunks as chunk_mod
    from packtool.stages.tokenize.engine.tokenizer import load_tokenizer
    from packtool.stages.tokenize.inputs.plan import plan_chunks
    from packtool.stages.tokenize.settings import chunk_settings as _settings
    from packtool.stages.tokenize.shape import resolve_shape

    tok_dir = build_tokenizer(tmp_path / "tok", fixture("qwen3"))
    data = chat_corpus(tmp_path / "chat.jsonl", 60)
    _, info = load_tokenizer(str(tok_dir))
    config = packtool.TokenizeConfig(inputs=(str(data),), tokenizer=str(tok_dir), output=str(tmp_path / "o"),
                                     format="chat", on_error="skip", chunk_bytes=2048)
    _, chunks = plan_chunks([data], 2048)
    settings = _settings(config, info, tmp_path / "o", resolve_shape(config, chunks))
    assert len(chunks) >= 3
    direct = [chunk_mod.tokenize_chunk(c, settings, "k") for c in chunks]
    seen = []
    drop = chunk_mod.prerender(chunks, settings, lambda: len(seen.append(1) or seen) <= 2)  # two chunks, then stop
    assert len(chunk_mod._AHEAD) == 2
    ahead = [chunk_mod.tokenize_chunk(c, replace(settings, backend="hf"), "k") for c in chunks]
    assert not chunk_mod._AHEAD  # taken once
    for a, b in zip(direct, ahead, strict=True):
        assert (a.n_documents, a.n_tokens, a.sources, a.rejects) == (b.n_documents, b.n_tokens, b.sources, b.rejects)
        for x, y in zip(a.parts, b.parts, strict=True):
            assert all(np.array_equal(u, v) for u, v in zip(x, y, strict=True))
    rejects = [json.loads(line) for r in direct for line in r.rejects.decode().splitlines()]
    assert any(r["line"] == 6 and "unknown role 'wizard'" in r["reason"] for r in rejects)
    failing = replace(settings, on_error="fail")
    drop = chunk_mod.prerender(chunks, failing, lambda: True)
    with pytest.raises(InputError, match="unknown role 'wizard'") as raised:
        for c in chunks:
            chunk_mod.tokenize_chunk(c, failing, "k")
    assert ":6" in str(raised.value)
    drop()
    assert not chunk_mod._AHEAD


def test_the_pipeline_renders_ahead_while_the_fast_engine_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow-loading fast engine: chunks are rendered meanwhile, taken by their tasks, and the store's
    bytes equal the hf backend's; nothing is left behind."""
    import time

    from test_chat_templates import build_tokenizer, fixture

    import packtool
    from packtool.stages.tokenize import backend_choice
    from packtool.stages.tokenize import chunks as chunk_mod

    pytest.importorskip("fastokens")
    tok_dir = build_tokenizer(tmp_path / "tok", fixture("qwen3"))
    data = chat_corpus(tmp_path / "chat.jsonl", 200)
    load = backend_choice.fast_backend

    def slow_load(*args: Any) -> Any:
        time.sleep(1.0)
        return load(*args)

    monkeypatch.setattr(backend_choice, "fast_backend", slow_load)
    taken = []
    take = chunk_mod._take
    monkeypatch.setattr(chunk_mod, "_take", lambda c, s: taken.append(got := take(c, s)) or got)
    for backend in ("fast", "hf"):
        packtool.tokenize_corpus(packtool.TokenizeConfig(
            inputs=(str(data),), tokenizer=str(tok_dir), output=str(tmp_path / backend), format="chat",
            on_error="skip", backend=backend, chunk_bytes=4096, workers=2))
    assert sum(got is not None for got in taken) >= 2  # the fast run rendered ahead; hf never waits
    assert not chunk_mod._AHEAD
    for name in ("tokens.bin", "tokens.boundaries", "tokens.loss", "rejects.jsonl"):
        assert (tmp_path / "fast" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name


def test_overlaps_with_zero_byte_tokens_and_empty_spans() -> None:
    """Zero-byte tokens (an out-of-vocabulary id, a bad document's clipped tokens) beside empty spans: the
    runs stay non-negative and the mask is the definition's (this raised 'negative repeats' before)."""
    got = _overlaps(np.array([0, 5, 5]), np.array([5, 5, 10]), np.array([5]), np.array([5]), 10)
    assert got.tolist() == [0, 0, 0]
    rng = np.random.default_rng(11)
    for _ in range(300):
        lens = rng.integers(0, 4, size=int(rng.integers(1, 30)))
        end = np.cumsum(lens)
        start = end - lens
        total = int(end[-1])
        cuts = np.sort(rng.integers(0, total + 1, size=2 * int(rng.integers(1, 5))))
        pairs = cuts.reshape(-1, 2)  # sorted, disjoint or touching, some empty
        got = _overlaps(start, end, pairs[:, 0], pairs[:, 1], max(total, 1))
        want = [int(any(s < e2 and e > s2 for s2, e2 in pairs)) for s, e in zip(start, end, strict=True)]
        assert got.tolist() == want


def _tables_by_vocab(tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """The byte tables the plain way: every vocabulary string through GPT-2's alphabet, added tokens as UTF-8."""
    from packtool.core.encoding.byte_offsets import byte_alphabet

    alphabet = byte_alphabet()
    added = {i: t.content.encode("utf-8") for i, t in tok.get_added_tokens_decoder().items()}
    vocab = {i: bytes(alphabet[c] for c in s) for s, i in tok.get_vocab(with_added_tokens=False).items()}
    size = max([*vocab, *added]) + 1
    pieces = [added.get(i, vocab.get(i, b"")) for i in range(size)]
    return np.frombuffer(b"".join(pieces), np.uint8), np.array([len(p) for p in pieces], np.int64)


def test_byte_tables_equal_the_vocabulary_spelled_byte_by_byte(tmp_path: Path) -> None:
    """ByteTables.build (one id_to_token per id, numpy over code points) against the vocabulary dict spelled out:
    a trained byte-level BPE with added tokens (one multi-byte), and one whose ids have a hole and run past
    their count; a vocabulary outside GPT-2's alphabet is refused."""
    from test_chat_fast import build_llama_like
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer.from_file(str(build_llama_like(tmp_path / "tok") / "tokenizer.json"))
    tok.add_special_tokens([AddedToken("<|é 🙂|>", special=True)])
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    holes = {c: i for i, c in enumerate(alphabet)}
    holes.pop(alphabet[7])  # id 7 has no token ...
    holes["Ġa"], holes["Ġab"] = 300, 301  # ... and the last ids are past the count (256)
    holey = Tokenizer(models.BPE(holes, [("Ġ", "a"), ("Ġa", "b")]))
    holey.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    holey.decoder = decoders.ByteLevel()
    for t in (tok, holey):
        tables = ByteTables.build(t)
        assert tables.reason is None
        flat, lens = _tables_by_vocab(t)
        assert np.array_equal(tables.lens, lens) and np.array_equal(tables.flat, flat)
    assert ByteTables.build(holey).lens[7] == 0 and ByteTables.build(holey).lens.size == 302
    plain = Tokenizer(models.BPE({"a": 0, "b": 1, "\u2581a": 2}, []))  # SentencePiece-style: not byte-level
    plain.decoder = decoders.ByteLevel()
    assert ByteTables.build(plain).reason == "the vocabulary is not byte-level"
