"""Records with images are never read as text (issue 37, section 1): under a tokenizer folder without an image
processor they are refused by name, at file:line (exit 1, nothing written) or into rejects.jsonl; videos and
audios are refused by name whatever the folder; `<image>` with an `images` list is never literal text.

LLaMA-Factory's own `data/mllm_demo.json` (shipped as `data/sample/vision/`, its photos replaced by small
synthetic ones) is the first input: before this, it tokenized with exit 0, its images dropped and `<image>` read
as the seven characters.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support import cli, cli_error, write_jsonl

from packtool.formats.token_store import open_token_store

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "vision"
DEMO = SAMPLE / "mllm_demo.json"


def _demo(tmp_path: Path) -> Path:
    """A copy of the demo (json + its images) in tmp_path."""
    shutil.copytree(SAMPLE, tmp_path / "vision")
    return tmp_path / "vision" / "mllm_demo.json"


def _sharegpt(record: dict[str, Any]) -> dict[str, Any]:
    """A LLaMA-Factory chat record in its ShareGPT form (`conversations` of from/value)."""
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    turns = [{"from": names[m["role"]], "value": m["content"]} for m in record["messages"]]
    return {"conversations": turns, "images": record["images"]}


@pytest.mark.parametrize("fmt", ["auto", "chat", "openai"])
def test_llamafactory_demo_is_refused_by_name_without_an_image_processor(
    tmp_path: Path, bpe_tokenizer_dir: Path, fmt: str
) -> None:
    src = _demo(tmp_path)
    out = tmp_path / "out"
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out),
                     "--format", fmt, "--workers", "1", "-q")
    assert "2 images" in line and "images[0] 'mllm_demo_data/1.jpg'" in line, line
    assert "no image processor" in line and "preprocessor_config.json" in line, line
    assert f"{src}:0" in line or f"{src}:" in line, line
    assert not out.exists()  # nothing written (the resumable .out.partial/ stays, as for every bad record)


def test_every_chat_like_shape_notices_images(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    record = json.loads(DEMO.read_text())[1]
    user, answer = record["messages"][0]["content"], record["messages"][1]["content"]
    shapes = {
        "sharegpt": _sharegpt(record),
        "alpaca": {"instruction": user, "output": answer, "images": record["images"]},
        "prompt-completion": {  # TRL's conversational prompt-completion with an image part
            "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Who is he?"}]}],
            "completion": [{"role": "assistant", "content": [{"type": "text", "text": answer}]}],
            "images": record["images"],
        },
        "chat": {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/AAAA"}},
            {"type": "text", "text": "Who is he?"}]}, {"role": "assistant", "content": answer}]},
    }
    for fmt, row in shapes.items():
        for given in (fmt, "auto"):
            src = write_jsonl(tmp_path / f"{fmt}.jsonl", [row])
            out = tmp_path / f"out-{fmt}-{given}"
            line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out),
                             "--format", given, "--workers", "1", "-q")
            assert "1 image " in line and "no image processor" in line and f"{src}:1" in line, (fmt, given, line)
            assert not out.exists()


def test_skip_puts_image_records_in_rejects_and_keeps_text_records(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    demo = json.loads(DEMO.read_text())
    text_only = {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there."}]}
    src = write_jsonl(tmp_path / "mixed.jsonl", [demo[0], text_only, _sharegpt(demo[2]) | {"messages": None}])
    src = write_jsonl(tmp_path / "mixed.jsonl", [demo[0], text_only, demo[2]])
    out = tmp_path / "out"
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(out),
                       "--format", "chat", "--workers", "1", "-q", "--on-error", "skip")
    assert code == 0, err
    store = open_token_store(out)
    assert store.n_documents == 1  # the text-only record
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [1, 3]
    assert all("no image processor" in r["reason"] for r in rejects)


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"messages": [{"role": "user", "content": "<video>What happens?"}, {"role": "assistant", "content": "A"}],
          "videos": ["mllm_demo_data/1.mp4"]}, "'videos'"),
        ({"messages": [{"role": "user", "content": "<audio>What is said?"}, {"role": "assistant", "content": "A"}],
          "audios": ["mllm_demo_data/1.mp3"]}, "'audios'"),
        ({"messages": [{"role": "user", "content": [{"type": "video", "path": "a.mp4"}]},
                       {"role": "assistant", "content": "A"}]}, "'video' part"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]},
                       {"role": "assistant", "content": "A"}]}, "'input_audio' part"),
    ],
)
def test_videos_and_audios_are_refused_by_name(tmp_path: Path, bpe_tokenizer_dir: Path, row: Any, words: str) -> None:
    src = write_jsonl(tmp_path / "media.jsonl", [row])
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                     "--format", "auto", "--workers", "1", "-q")
    assert words in line and "only images are read" in line and f"{src}:1" in line, line


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"messages": [{"role": "user", "content": "<image><image>Compare"}, {"role": "assistant", "content": "A"}],
          "images": ["a.jpg"]}, "2 <image> placeholders or image parts without their own image, the record's "
                                "images list holds 1"),
        ({"messages": [{"role": "user", "content": "Describe"}, {"role": "assistant", "content": "A"}],
          "images": ["a.jpg"]}, "0 <image> placeholders"),
        ({"messages": [{"role": "user", "content": "<image>Describe"}, {"role": "assistant", "content": "A"}],
          "images": []}, "1 <image> placeholders"),
        ({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe"}]},
                       {"role": "assistant", "content": "A"}]}, "no 'images' field"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "image": 3}]},
                       {"role": "assistant", "content": "A"}]}, "message 0 part 0 is int"),
    ],
)
def test_miscounted_and_malformed_images_are_bad_records(
    tmp_path: Path, bpe_tokenizer_dir: Path, row: Any, words: str
) -> None:
    src = write_jsonl(tmp_path / "bad.jsonl", [row])
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                     "--format", "chat", "--workers", "1", "-q")
    assert words in line and f"{src}:1" in line, line


def test_llava_records_with_one_image_field_are_noticed(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """LLaVA-Instruct / ShareGPT4V: `{"image": "coco/1.jpg", "conversations": [{"from": "human", "value":
    "<image>\\n..."}]}` (one image, singular field): never read as text; both fields at once is a bad record."""
    row = {"id": "1", "image": "coco/1.jpg", "conversations": [{"from": "human", "value": "<image>\nWhat is it?"},
                                                              {"from": "gpt", "value": "A cat."}]}
    both = row | {"images": ["coco/1.jpg"]}
    for given, words in ((row, "1 image (image[0] 'coco/1.jpg')"), (both, "both 'images' and 'image'")):
        src = write_jsonl(tmp_path / "llava.jsonl", [given])
        line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                         "--format", "auto", "--workers", "1", "-q")
        assert words in line and f"{src}:1" in line, line


def test_a_text_shape_never_drops_a_records_images(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    src = write_jsonl(tmp_path / "t.jsonl", [{"text": "<image>A caption", "images": ["a.jpg"]}])
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                     "--format", "text", "--workers", "1", "-q")
    assert "'images' (1)" in line and "text alone" in line and f"{src}:1" in line, line


def test_image_placeholder_without_an_images_field_stays_text(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    """`<image>` counts as an image only in a record that lists images (LLaMA-Factory's rule): an HTML lesson
    mentioning the tag is text."""
    row = {"messages": [{"role": "user", "content": "What does <image> do in HTML?"},
                        {"role": "assistant", "content": "Nothing: the tag is <img>."}]}
    src = write_jsonl(tmp_path / "t.jsonl", [row])
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                       "--format", "chat", "--workers", "1", "-q")
    assert code == 0, err
    assert open_token_store(tmp_path / "o").n_documents == 1
