"""Records with images tokenized through the model folder's processor (issue 37, section 3): ids equal
transformers' `processor.apply_chat_template(messages, tokenize=True)` with the record's images, image tokens
are never targets, each image's row (offset, tokens, grid, patches, bytes) is found in the ids; the model
folder is located once per run.

A tiny Qwen2-VL folder (the real Qwen2-VL chat template and image processor settings, a small BPE with its
special tokens: `test_vision_families.build_qwen_folder`) reads LLaMA-Factory's demo in every shape.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import target_runs
from test_vision_families import build_qwen_folder, reference_processor
from test_vision_inputs_media import SHAPES
from tokenizers import Tokenizer

from packtool.core.encoding.shapes.base import ShapeOptions
from packtool.core.encoding.shapes.images import with_images
from packtool.core.encoding.shapes.registry import shape_spec
from packtool.stages.tokenize.chunks import tokenize_chunk
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.engine.model import load_model
from packtool.stages.tokenize.inputs.media import image_bytes
from packtool.stages.tokenize.inputs.plan import plan_chunks
from packtool.stages.tokenize.journal import ChunkResult
from packtool.stages.tokenize.settings import chunk_settings
from packtool.stages.tokenize.shape import resolve_shape

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "vision"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_qwen_folder(tmp_path_factory.mktemp("qwen2vl") / "model", "qwen2_vl")


def run_chunks(src: Path, folder: Path, fmt: str = "auto", **flags: Any) -> ChunkResult:
    """The chunk tasks of a run, alone (what the workers compute), over one file."""
    config = TokenizeConfig(inputs=(str(src),), tokenizer=str(folder), output=str(src.parent / "o"), format=fmt,
                            **flags).validate()
    model = load_model(str(folder))
    _, chunks = plan_chunks([src], 1 << 20)
    settings = replace(chunk_settings(config, model.info, src.parent / "o", resolve_shape(config, chunks)),
                       vision=model.vision)
    results = [tokenize_chunk(c, settings, "key") for c in chunks]
    assert len(results) == 1
    return results[0]


def documents(result: ChunkResult) -> list[tuple[list[int], list[int]]]:
    out = []
    for ids, lengths, loss in result.parts:
        ends = np.cumsum(lengths)
        for a, b in zip(ends - lengths, ends, strict=True):
            out.append((ids[a:b].tolist(), loss[a:b].tolist()))
    return out


def reference(processor: Any, record: Any, shape: str, source: Path) -> tuple[list[int], Any]:
    """transformers' ids of the record: its canonical messages, each image part given its decoded image."""
    from PIL import Image

    spec = shape_spec(shape)
    conversation = with_images(record, spec.convert(record, ShapeOptions(spec.default_fields())))
    images = iter([image_bytes(ref, str(source), None) for ref in conversation.images])
    messages = [{**m, "content": [{"type": "image", "image": Image.open(io.BytesIO(next(images)))}
                                  if p["type"] == "image" else p for p in m["content"]]}
                for m in conversation.messages]
    got = processor.apply_chat_template(messages, tokenize=True, return_dict=True)
    return list(got["input_ids"][0]), got


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_ids_equal_the_processors_and_image_tokens_are_never_targets(tmp_path: Path, qwen: Path, name: str) -> None:
    shutil.copytree(SAMPLE, tmp_path / "vision")
    shape, record = SHAPES[name]
    src = tmp_path / "vision" / "records.jsonl"
    src.write_text(json.dumps(record) + "\n")
    result = run_chunks(src, qwen)
    assert result.n_documents == 1 and not result.reasons
    ids, loss = documents(result)[0]
    processor = reference_processor(qwen, "qwen2_vl")
    want, ref = reference(processor, record, shape, src)
    assert ids == want
    image = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    at = [i for i, t in enumerate(ids) if t == image]
    assert at and all(loss[i] == 0 for i in at)
    tok = Tokenizer.from_file(str(qwen / "tokenizer.json"))
    answers = [tok.decode(run, skip_special_tokens=False) for run in target_runs(np.asarray(ids), np.asarray(loss))]
    assert answers == [m["content"] + "<|im_end|>" for m in json.loads((SAMPLE / "mllm_demo.json").read_text())[0][
        "messages"] if m["role"] == "assistant"]
    grids = np.asarray(ref["image_grid_thw"]).tolist()
    rows = result.media
    assert [r[0] for r in rows] == [0, 0]
    assert [r[3] for r in rows] == [tuple(g) for g in grids]
    assert [r[4] for r in rows] == [int(np.prod(g)) for g in grids]  # patches: t * h * w
    for _doc, offset, n_tokens, _, _, data in rows:
        assert ids[offset - 1] != image and ids[offset: offset + n_tokens] == [image] * n_tokens
        assert data == (SAMPLE / "mllm_demo_data" / "1.jpg").read_bytes()


def test_the_whole_demo_in_chunks_mixed_with_text_only_records(tmp_path: Path, qwen: Path) -> None:
    shutil.copytree(SAMPLE, tmp_path / "vision")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    text_only = {"messages": [{"role": "user", "content": "Hello <image> tag"}, {"role": "assistant", "content": "Hi"}]}
    src = tmp_path / "vision" / "mixed.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [demo[0], text_only, *demo[1:]]))
    result = run_chunks(src, qwen, "chat")
    assert result.n_documents == 7 and not result.reasons
    assert [r[0] for r in result.media] == [0, 0, 2, 3, 4, 4, 5, 6]  # the text-only record holds none
    docs = documents(result)
    processor = reference_processor(qwen, "qwen2_vl")
    assert docs[1][0] == list(processor.apply_chat_template(text_only["messages"], tokenize=True)[0])  # unchanged


def test_a_missing_or_bad_image_is_a_bad_record_naming_it(tmp_path: Path, qwen: Path) -> None:
    shutil.copytree(SAMPLE, tmp_path / "vision")
    (tmp_path / "vision" / "broken.jpg").write_bytes(b"\xff\xd8\xff not a jpeg")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    rows = [demo[1] | {"images": ["mllm_demo_data/nope.jpg"]}, demo[1] | {"images": ["broken.jpg"]},
            demo[1] | {"images": ["https://example.com/1.jpg"]}, demo[1] | {"images": ["../../etc/passwd"]},
            demo[1] | {"images": ["a.jpg", "b.jpg"]}, demo[1]]
    src = tmp_path / "vision" / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run_chunks(src, qwen, "chat", on_error="skip")
    reasons = [json.loads(line)["reason"] for line in result.rejects.decode().splitlines()]
    assert result.n_documents == 1 and len(reasons) == 5, reasons
    assert "images[0] 'mllm_demo_data/nope.jpg' is missing" in reasons[0]
    assert "broken.jpg" in reasons[1]
    assert "remote https:// URL" in reasons[2]
    assert "leads outside its folder" in reasons[3]
    assert "miscounted images" in reasons[4]


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_the_model_folder_is_located_once_per_run(
    tmp_path: Path, bpe_tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """The fast engine's early start, its preload, the tokenizer's load and the image processor all come from ONE
    lookup of `--tokenizer` (before: four, the early start and the engine each finding the folder again)."""
    from support import cli, write_jsonl

    from packtool.stages.tokenize.engine import early, locate

    calls: list[str] = []
    real = locate.locate

    def counted(spec: str) -> Any:
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(locate, "locate", counted)
    src = write_jsonl(tmp_path / "in.jsonl", [{"text": "hello world"}] * 3)
    code, _, err = cli("tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "a"),
                       "--backend", backend, "-q")
    assert code == 0, err
    assert calls == [str(bpe_tokenizer_dir)]
    calls.clear()  # the console script's own early start from argv hands its lookup to the run
    args = ["tokenize", str(src), "--tokenizer", str(bpe_tokenizer_dir), "--output", str(tmp_path / "b"),
            "--backend", backend, "-q"]
    early.start_from_argv(args)
    code, _, err = cli(*args)
    assert code == 0, err
    assert calls == [str(bpe_tokenizer_dir)] and not early._FROM_ARGV


def test_gemma3_ids_equal_the_processors(tmp_path: Path) -> None:
    """Gemma 3: the template writes BOS and `<start_of_image>`; the ids are the processor's (no second BOS)."""
    from test_vision_families_gemma3 import build_gemma_folder
    from test_vision_families_gemma3 import reference_processor as gemma_processor

    folder = build_gemma_folder(tmp_path / "gemma")
    shutil.copytree(SAMPLE, tmp_path / "vision")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    src = tmp_path / "vision" / "demo.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in demo[:3]))
    result = run_chunks(src, folder)
    processor = gemma_processor(folder)
    for record, (ids, loss) in zip(demo[:3], documents(result), strict=True):
        want, _ = reference(processor, record, "chat", src)
        assert ids == want and ids.count(processor.tokenizer.bos_token_id) == 1
        image = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
        assert ids.count(image) == 16 * len(record["images"]) and not any(loss[i] for i, t in enumerate(ids) if t == image)
    assert [r[2] for r in result.media] == [16] * 4
    literal = demo[1] | {"messages": [{"role": "user", "content": "<image>Is <image_soft_token> a token?"},
                                      {"role": "assistant", "content": "Yes."}]}
    src.write_text(json.dumps(literal) + "\n")
    result = run_chunks(src, folder, on_error="skip")
    assert result.n_documents == 0 and "image token '<image_soft_token>' as text" in result.rejects.decode()


def test_hostile_records_many_duplicate_and_system_images(tmp_path: Path, qwen: Path) -> None:
    """50 images in one record (one file, so one unique image), an image in the system turn, and an image given by
    bytes in a data URI beside the same image by path: each occurrence is a row, in order."""
    shutil.copytree(SAMPLE, tmp_path / "vision")
    img = "mllm_demo_data/2.jpg"
    many = {"messages": [{"role": "user", "content": "<image>" * 50 + "Which differ?"},
                         {"role": "assistant", "content": "None."}], "images": [img] * 50}
    system = {"messages": [{"role": "system", "content": [{"type": "image", "path": img},
                                                         {"type": "text", "text": "Keep this in mind."}]},
                           {"role": "user", "content": "And now?"}, {"role": "assistant", "content": "Yes."}]}
    src = tmp_path / "vision" / "hostile.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [many, system]))
    result = run_chunks(src, qwen, "chat")
    assert result.n_documents == 2 and not result.reasons
    rows = result.media
    assert [r[0] for r in rows] == [0] * 50 + [1]
    offsets = [r[1] for r in rows[:50]]
    assert offsets == sorted(offsets) and all(b - a > r[2] for a, b, r in zip(offsets, offsets[1:], rows, strict=False))
    processor = reference_processor(qwen, "qwen2_vl")
    (ids, loss), (ids2, _) = documents(result)
    assert ids == reference(processor, many, "chat", src)[0]
    assert ids2 == reference(processor, system, "chat", src)[0]


def test_the_image_token_as_text_is_a_bad_record(tmp_path: Path, qwen: Path) -> None:
    """A text-only record (or an image record) whose text holds the image token itself would give image tokens
    without an image: refused at its line, never written."""
    shutil.copytree(SAMPLE, tmp_path / "vision")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    literal = {"messages": [{"role": "user", "content": "What is <|image_pad|>?"}, {"role": "assistant", "content": "A"}]}
    extra = demo[1] | {"messages": [{"role": "user", "content": "<image>and <|image_pad|>"},
                                    {"role": "assistant", "content": "B"}]}
    src = tmp_path / "vision" / "bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [literal, extra, demo[1]]))
    result = run_chunks(src, qwen, "chat", on_error="skip")
    reasons = [json.loads(line) for line in result.rejects.decode().splitlines()]
    assert [r["line"] for r in reasons] == [1, 2] and result.n_documents == 1
    assert "image token '<|image_pad|>' as text" in reasons[0]["reason"]
    assert "miscounted" in reasons[1]["reason"]


def test_a_vlm_folder_reads_its_template_as_autoprocessor_does(tmp_path: Path) -> None:
    """The processor's `chat_template.json` before `tokenizer_config.json`'s template (AutoProcessor never reads the
    latter), `chat_template.jinja` before both; a text-only folder is unchanged (no processor, its own template)."""
    folder = build_qwen_folder(tmp_path / "model", "qwen2_vl")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    real = config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "{{ 'tokenizer' }}"}))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": real}))
    model = load_model(str(folder))
    assert model.processor is not None and model.info.chat_template == real
    assert model.info.chat_template_source == "chat_template.json"
    (folder / "chat_template.jinja").write_text("{{ 'jinja' }}")
    assert load_model(str(folder)).info.chat_template == "{{ 'jinja' }}"
    (folder / "chat_template.json").write_text("[1, 2]")
    (folder / "chat_template.jinja").unlink()
    from packtool.errors import ConfigError

    with pytest.raises(ConfigError, match="holds no 'chat_template' string"):
        load_model(str(folder))
    for name in ("preprocessor_config.json", "chat_template.json"):
        (folder / name).unlink()
    model = load_model(str(folder))
    assert model.processor is None and model.vision is None and model.info.chat_template == "{{ 'tokenizer' }}"
