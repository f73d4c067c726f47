"""How a run's record shape is resolved (`--format` as given, or `auto` over the first records), and the
errors when it cannot be: inputs that are empty or hold only bad records, flags that the given or the
detected shape does not read. Each through the CLI (one `error:` line, the exit code) and the Python API.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import cli, cli_error, write_jsonl

import packtool
from packtool.errors import InputError, UsageError


def _tokenize(tmp_path: Path, tok: Path, src: Path, *flags: str, code: int = 1) -> str:
    return cli_error("tokenize", str(src), "--tokenizer", str(tok), "--output", str(tmp_path / "o"), "-q", *flags,
                     code=code)


def test_auto_on_only_malformed_lines_names_the_first_one_and_its_json_error(tmp_path: Path,
                                                                             bpe_tokenizer_dir: Path) -> None:
    """issue 26 #16: was "recognises no record shape in the first 0 records (the inputs)"."""
    src = tmp_path / "bad.jsonl"
    src.write_bytes(b'{"messages": [\n\n{"text": oops}\n')
    line = _tokenize(tmp_path, bpe_tokenizer_dir, src, "--format", "auto")
    assert f"{src}:1," in line and "malformed JSON (" in line and "line 1 column" in line, line
    assert "2 bad records" in line and "first 0 records" not in line, line
    assert "pass --format" in line and not (tmp_path / "o").exists()
    with pytest.raises(InputError) as caught:
        packtool.tokenize_corpus(packtool.TokenizeConfig(inputs=(str(src),), tokenizer=str(bpe_tokenizer_dir),
                                                         output=str(tmp_path / "api"), format="auto"))  # type: ignore[arg-type]
    assert (caught.value.source, caught.value.line) == (str(src), 1)
    assert not (tmp_path / "api").exists()


def test_auto_on_a_bad_json_array_or_bad_utf8_names_the_record(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    array = tmp_path / "bad.json"
    array.write_text('[{"text": oops}]', encoding="utf-8")
    line = _tokenize(tmp_path, bpe_tokenizer_dir, array, "--format", "auto")
    assert "1 bad record," in line and "record 0 of the JSON array, 0-based" in line and f"{array}:0" in line, line
    utf = tmp_path / "latin1.jsonl"
    utf.write_bytes(b'{"text": "caf\xe9"}\n')
    line = _tokenize(tmp_path, bpe_tokenizer_dir, utf, "--format", "auto")
    assert "invalid UTF-8" in line and f"{utf}:1" in line, line


def test_auto_on_empty_inputs_says_they_are_empty(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    src = tmp_path / "empty.jsonl"
    src.write_bytes(b"\n  \n")
    line = _tokenize(tmp_path, bpe_tokenizer_dir, src, "--format", "auto")
    assert "found no records" in line and "(the inputs are empty)" in line and str(src) in line, line


def test_auto_bad_records_before_good_ones_do_not_decide(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    src = tmp_path / "mixed.jsonl"
    src.write_bytes(b'{"text": oops}\n' + json.dumps({"prompt": "Q", "completion": " A"}).encode() + b"\n")
    code, stdout, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output",
                            str(tmp_path / "o"), "--format", "auto", "--on-error", "skip", "-q", "--workers", "1")
    assert code == 0, err
    assert "detected format prompt-completion," in stdout and "1 rejected" in stdout


@pytest.mark.parametrize(("flags", "message"), [
    (["--format", "chat", "--field", "body"], "--field does not apply to --format chat (it is for text)"),
    (["--format", "auto", "--field", "body"], "--field does not apply to --format auto"),
    (["--format", "sharegpt", "--prompt-field", "q"], "--prompt-field does not apply to --format sharegpt"),
    (["--format", "text", "--completion-field", "a"], "--completion-field does not apply to --format text"),
    (["--format", "text", "--assistant-turns", "last"], "--assistant-turns last does not apply to --format text"),
    (["--format", "text", "--chat-template", "t.jinja"], "--chat-template does not apply to --format text"),
])
def test_flags_the_given_shape_does_not_read_are_usage_errors(tmp_path: Path, bpe_tokenizer_dir: Path,
                                                              flags: list[str], message: str) -> None:
    """These flags were silently ignored (the text field of a chat run, the last turn of a text run)."""
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "x", "messages": [{"role": "user", "content": "x"}]}])
    line = _tokenize(tmp_path, bpe_tokenizer_dir, src, *flags, code=2)
    assert message in line, line
    kwargs = {flags[i][2:].replace("-", "_"): flags[i + 1] for i in range(0, len(flags), 2)}
    with pytest.raises(UsageError):
        packtool.TokenizeConfig(inputs=(str(src),), tokenizer="t", output="o", **kwargs).validate()  # type: ignore[arg-type]


def test_assistant_turns_last_on_records_without_turns_is_a_usage_error(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """Known only once the records are read: plain prompt-completion (given or detected), or text detected."""
    pc = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Q", "completion": " A"}])
    for fmt in ("prompt-completion", "auto"):
        line = _tokenize(tmp_path, bpe_tokenizer_dir, pc, "--format", fmt, "--assistant-turns", "last", code=2)
        assert f"--format {fmt}" in line and "prompt-completion records" in line and f"{pc}:1" in line, line
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "x"}])
    line = _tokenize(tmp_path, bpe_tokenizer_dir, text, "--format", "auto", "--assistant-turns", "last", code=2)
    assert "--format auto detected text records" in line and "leave --assistant-turns out" in line, line
    with pytest.raises(UsageError):
        packtool.tokenize_corpus(packtool.TokenizeConfig(inputs=(str(pc),), tokenizer=str(bpe_tokenizer_dir),
                                                         output=str(tmp_path / "api"), format="prompt-completion",  # type: ignore[arg-type]
                                                         assistant_turns="last"))  # type: ignore[arg-type]
    # TRL's conversational prompt-completion has assistant turns: `last` is its last completion turn
    trl = write_jsonl(tmp_path / "trl.jsonl", [{"prompt": [{"role": "user", "content": "Q"}],
                                                "completion": [{"role": "assistant", "content": "A"}]}])
    code, _, err = cli("tokenize", str(trl), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "t"),
                       "--format", "prompt-completion", "--assistant-turns", "last", "-q", "--workers", "1")
    assert code == 0, err


def test_a_chat_template_on_records_no_template_renders_is_a_usage_error(tmp_path: Path,
                                                                        bpe_tokenizer_dir: Path) -> None:
    """`--chat-template FILE` with text or plain prompt-completion records was silently ignored (exit 0)."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    pc = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Q", "completion": " A"}])
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "x"}])
    for src, fmt, read in ((pc, "prompt-completion", "read prompt-completion"),
                           (pc, "auto", "detected prompt-completion"), (text, "auto", "detected text")):
        line = _tokenize(tmp_path, bpe_tokenizer_dir, src, "--format", fmt, "--chat-template", str(template), code=2)
        assert f"--format {fmt} {read} records" in line and f"{src}:1" in line and "leave --chat-template out" in line
    assert not (tmp_path / "o").exists()
    with pytest.raises(UsageError, match="--chat-template"):
        packtool.tokenize_corpus(packtool.TokenizeConfig(inputs=(str(pc),), tokenizer=str(bpe_tokenizer_dir),
                                                         output=str(tmp_path / "api"), format="prompt-completion",  # type: ignore[arg-type]
                                                         chat_template=str(template)))
    # TRL's conversational prompt-completion is rendered by the template: there it applies
    trl = write_jsonl(tmp_path / "trl.jsonl", [{"prompt": [{"role": "user", "content": "Q"}],
                                                "completion": [{"role": "assistant", "content": "A"}]}])
    code, _, err = cli("tokenize", str(trl), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "t"),
                       "--format", "prompt-completion", "--chat-template", str(template), "-q", "--workers", "1")
    assert code == 0, err


def test_default_fields_are_recorded_in_the_manifest(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    src = write_jsonl(tmp_path / "pc.jsonl", [{"prompt": "Q", "completion": " A"}])
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                       "--format", "prompt-completion", "-q", "--workers", "1")
    assert code == 0, err
    fields = json.loads((tmp_path / "o" / "manifest.json").read_text())["fields"]
    assert fields == {"prompt_field": "prompt", "completion_field": "completion"}
    text = write_jsonl(tmp_path / "t.jsonl", [{"text": "x"}])
    code, _, err = cli("tokenize", str(text), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "t"),
                       "-q", "--workers", "1")
    assert code == 0, err
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["fields"] == {"field": "text", "separator": None}
