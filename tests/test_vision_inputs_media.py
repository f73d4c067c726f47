"""Image records in every shape users hold become ONE canonical record (issue 37, section 2), and every image
reference resolves to its encoded bytes or is refused in one line naming it.

The six records below are LLaMA-Factory's first demo record written as LLaMA-Factory chat and ShareGPT,
transformers / TRL content parts (an `images` column, or a path on the part), OpenAI `image_url` data URIs and
a Parquet file of `datasets` `Image` features: each gives the same messages in content-part form and the same
image bytes.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from support import cli_error, write_jsonl

from packtool.core.encoding.shapes.base import Conversation, ShapeError, ShapeOptions
from packtool.core.encoding.shapes.images import ImageRef, with_images
from packtool.core.encoding.shapes.registry import shape_spec
from packtool.stages.tokenize.inputs.media import MediaError, image_bytes
from packtool.stages.tokenize.inputs.plan import plan_chunks, read_chunk

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "vision"
DEMO = json.loads((SAMPLE / "mllm_demo.json").read_text())[0]
IMG = "mllm_demo_data/1.jpg"
JPEG = (SAMPLE / IMG).read_bytes()
URI = "data:image/jpeg;base64," + base64.b64encode(JPEG).decode()
Q1, A1, Q2, A2 = (m["content"] for m in DEMO["messages"])  # "<image>Who are they?", ..., "What are they doing?<image>"
T1, T2 = Q1.removeprefix("<image>"), Q2.removesuffix("<image>")


def _text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


CANONICAL = [
    {"role": "user", "content": [{"type": "image"}, _text(T1)]},
    {"role": "assistant", "content": [_text(A1)]},
    {"role": "user", "content": [_text(T2), {"type": "image"}]},
    {"role": "assistant", "content": [_text(A2)]},
]


def _parts(image: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": [image, _text(T1)]},
        {"role": "assistant", "content": [_text(A1)]},
        {"role": "user", "content": [_text(T2), image]},
        {"role": "assistant", "content": A2},  # a string beside parts: canonical parts too
    ]


SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "llamafactory-chat": ("chat", DEMO),
    "llamafactory-sharegpt": ("sharegpt", {
        "conversations": [{"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]}
                          for m in DEMO["messages"]], "images": DEMO["images"]}),
    "transformers-images-column": ("chat", {"messages": _parts({"type": "image"}), "images": [IMG, IMG]}),
    "transformers-path-on-part": ("chat", {"messages": _parts({"type": "image", "path": IMG})}),
    "transformers-image-on-part": ("chat", {"messages": _parts({"type": "image", "image": URI})}),
    "openai-data-uri": ("openai", {"messages": _parts({"type": "image_url", "image_url": {"url": URI}})}),
}


def canonical(record: Any, shape: str, source: Path) -> tuple[list[Any], list[bytes]]:
    spec = shape_spec(shape)
    got = spec.convert(record, ShapeOptions(spec.default_fields()))
    assert isinstance(got, Conversation)
    got = with_images(record, got)
    return got.messages, [image_bytes(ref, str(source), None) for ref in got.images]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shape_gives_the_same_canonical_record(name: str) -> None:
    shape, record = SHAPES[name]
    messages, images = canonical(record, shape, SAMPLE / "mllm_demo.json")
    assert messages == CANONICAL
    assert images == [JPEG, JPEG]


def test_a_parquet_of_datasets_image_features_gives_the_same_canonical_record(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    image = {"bytes": JPEG, "path": "1.jpg"}  # embedded, as `push_to_hub` and `embed_table_storage` write them
    rows = {"messages": [_parts({"type": "image"})], "images": [[image, image]]}
    features = datasets.Features({
        "messages": [{"role": datasets.Value("string"),
                      "content": [{"type": datasets.Value("string"), "text": datasets.Value("string")}]}],
        "images": datasets.Sequence(datasets.Image()),
    })
    rows["messages"][0][3]["content"] = [_text(A2)]  # a column holds one type
    path = tmp_path / "demo.parquet"
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    _, chunks = plan_chunks([path], 1 << 20)
    records = [r.value for c in chunks for r in read_chunk(c, separator=None, max_record_bytes=64 << 20)]
    assert len(records) == 1 and isinstance(records[0]["images"][0], dict)  # {bytes, path} structs
    messages, images = canonical(records[0], "chat", path)
    assert messages == CANONICAL and images == [JPEG, JPEG]


def test_placeholders_split_where_they_stand() -> None:
    record = {"messages": [{"role": "system", "content": "<image>a<image> b <image>"},
                           {"role": "user", "content": "<image>"}, {"role": "assistant", "content": "ok"}],
              "images": ["1", "2", "3", "4"]}
    got = with_images(record, Conversation(record["messages"]))
    assert got.messages[0]["content"] == [{"type": "image"}, _text("a"), {"type": "image"}, _text(" b "),
                                          {"type": "image"}]
    assert got.messages[1]["content"] == [{"type": "image"}]
    assert [r.value for r in got.images] == ["1", "2", "3", "4"]
    assert [r.where for r in got.images] == ["images[0]", "images[1]", "images[2]", "images[3]"]


def test_own_and_listed_images_interleave_in_order() -> None:
    messages = [{"role": "user", "content": [{"type": "image", "path": "own.png"}, {"type": "image"},
                                             {"type": "image_url", "image_url": {"url": "x.png"}}]},
                {"role": "assistant", "content": "A"}]
    got = with_images({"messages": messages, "images": ["listed.png"]}, Conversation(messages))
    assert [r.value for r in got.images] == ["own.png", "listed.png", "x.png"]


def test_a_record_without_images_is_unchanged() -> None:
    messages = [{"role": "user", "content": "hi <image>"}, {"role": "assistant", "content": "yo"}]
    conversation = Conversation(messages)
    assert with_images({"messages": messages}, conversation) is conversation
    assert with_images({"messages": messages, "images": None}, conversation) is conversation


def test_an_image_part_naming_its_image_twice_is_refused() -> None:
    messages = [{"role": "user", "content": [{"type": "image", "path": "a.png", "url": "b.png"}]}]
    with pytest.raises(ShapeError, match=r"names its image twice \('path', 'url'\)"):
        with_images({"messages": messages}, Conversation(messages))


# ---- media references -> bytes ----


def _ref(value: Any) -> ImageRef:
    return ImageRef(value, "images[0]")


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "a.jpg").write_bytes(JPEG)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "b.jpg").write_bytes(b"B-bytes")
    os.symlink(outside / "b.jpg", data / "img" / "link.jpg")
    (data / "empty.jpg").write_bytes(b"")
    return {"src": data / "records.jsonl", "outside": outside, "data": data}


def test_relative_paths_resolve_against_the_input_folder(layout: dict[str, Path]) -> None:
    assert image_bytes(_ref("img/a.jpg"), str(layout["src"]), None) == JPEG
    assert image_bytes(_ref({"bytes": None, "path": "img/a.jpg"}), str(layout["src"]), None) == JPEG
    assert image_bytes(_ref({"bytes": b"raw", "path": "gone.jpg"}), str(layout["src"]), None) == b"raw"
    assert image_bytes(_ref(b"\x89PNG..."), str(layout["src"]), None) == b"\x89PNG..."
    assert image_bytes(_ref(f"file://{layout['data']}/img/a.jpg"), str(layout["src"]), str(layout["data"])) == JPEG


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("img/missing.jpg", "is missing (no file"),
        ("../elsewhere/b.jpg", "leads outside its folder"),
        ("img/link.jpg", "leads outside its folder"),
        ("ABS", "is an absolute path"),
        ("https://example.com/a.jpg", "remote https:// URL, packtool works offline"),
        ("s3://bucket/a.jpg", "remote s3:// URL"),
        ("data:image/png;base64,@@@", "base64 does not decode"),
        ("data:text/plain;base64,aGk=", "of type 'text/plain', not an image"),
        ("data:image/png,rawtext", "not base64"),
        ("data:image/png;base64,", "holds no bytes"),
        ("empty.jpg", "holds no bytes"),
        ("img", "is not a regular file"),
        (b"", "holds no bytes"),
    ],
)
def test_bad_references_are_refused_naming_them(layout: dict[str, Path], value: Any, words: str) -> None:
    if value == "ABS":
        value = str(layout["outside"] / "b.jpg")
    with pytest.raises(MediaError, match="images\\[0\\]") as err:
        image_bytes(_ref(value), str(layout["src"]), None)
    assert words in str(err.value), str(err.value)


def test_media_dir_allows_absolute_paths_and_links_under_it(layout: dict[str, Path]) -> None:
    src, outside = str(layout["src"]), str(layout["outside"])
    assert image_bytes(_ref(str(layout["outside"] / "b.jpg")), src, outside) == b"B-bytes"
    assert image_bytes(_ref("img/link.jpg"), src, outside) == b"B-bytes"  # leads under --media-dir
    assert image_bytes(_ref("b.jpg"), src, outside) == b"B-bytes"  # relative: --media-dir first
    assert image_bytes(_ref("img/a.jpg"), src, outside) == JPEG  # then the input's folder
    with pytest.raises(MediaError, match="not inside --media-dir"):
        image_bytes(_ref(str(layout["data"] / "img" / "a.jpg")), src, outside)  # absolute, not under it


def test_media_dir_flag_is_checked(tmp_path: Path, bpe_tokenizer_dir: Path) -> None:
    src = write_jsonl(tmp_path / "r.jsonl", [{"text": "x"}])
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                     "--media-dir", str(tmp_path), code=2)
    assert "--media-dir does not apply to --format text" in line
    line = cli_error("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "o"),
                     "--format", "chat", "--media-dir", str(tmp_path / "nope"))
    assert "--media-dir" in line and "is not a directory" in line


SHIPPED = ("mllm_demo.json", "mllm_demo_transformers.jsonl", "mllm_demo_openai.jsonl", "mllm_demo.parquet")


def test_the_shipped_demo_in_four_shapes_gives_one_canonical_record_each() -> None:
    """data/sample/vision holds the demo as LLaMA-Factory wrote it, in transformers parts with an images column,
    in OpenAI data URIs and as a Parquet of `datasets` Image features (bytes embedded)."""
    got = {}
    for name in SHIPPED:
        path = SAMPLE / name
        _, chunks = plan_chunks([path], 1 << 20)
        records = [r.value for c in chunks for r in read_chunk(c, separator=None, max_record_bytes=64 << 20)]
        got[name] = [canonical(r, "chat", path) for r in records]
    first = got[SHIPPED[0]]
    assert len(first) == 6 and sum(len(images) for _, images in first) == 8
    for name in SHIPPED[1:]:
        assert got[name] == first, name


def test_a_csv_cell_of_images_and_a_save_to_disk_dataset_are_read(tmp_path: Path) -> None:
    """A CSV's `images` cell holding a JSON list (the messages cell too), and a `save_to_disk` dataset of Image
    features, give the canonical record."""
    import csv

    datasets = pytest.importorskip("datasets")
    (tmp_path / "mllm_demo_data").mkdir()
    (tmp_path / IMG).write_bytes(JPEG)
    path = tmp_path / "demo.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["messages", "images"])
        writer.writerow([json.dumps(DEMO["messages"]), json.dumps(DEMO["images"])])
    _, chunks = plan_chunks([path], 1 << 20)
    records = [r.value for c in chunks for r in read_chunk(c, separator=None, max_record_bytes=1 << 20)]
    assert canonical(records[0], "chat", path) == (CANONICAL, [JPEG, JPEG])
    image = {"bytes": JPEG, "path": "1.jpg"}
    features = datasets.Features({
        "messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
        "images": datasets.Sequence(datasets.Image()),
    })
    datasets.Dataset.from_dict({"messages": [DEMO["messages"]], "images": [[image, image]]}, features=features) \
        .save_to_disk(str(tmp_path / "saved"))
    from packtool.stages.tokenize.inputs.locators import expand_inputs

    paths = expand_inputs([str(tmp_path / "saved")])
    _, chunks = plan_chunks(paths, 1 << 20)
    records = [r.value for c in chunks for r in read_chunk(c, separator=None, max_record_bytes=1 << 20)]
    assert canonical(records[0], "chat", paths[0]) == (CANONICAL, [JPEG, JPEG])


def test_media_dir_is_a_run_config_path_relative_to_the_yaml(tmp_path: Path) -> None:
    from packtool.cli.runconfig import load_run_config

    cfg = tmp_path / "run.yaml"
    cfg.write_text("tokenize:\n  inputs: data.jsonl\n  tokenizer: tok\n  output: out\n  format: chat\n"
                   "  media-dir: images\n")
    (step,) = load_run_config(cfg)
    assert step.tokenize is not None and step.tokenize.media_dir == str(tmp_path / "images")
