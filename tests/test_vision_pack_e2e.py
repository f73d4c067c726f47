"""End to end on LLaMA-Factory's mllm demo (its real photos, data/sample/vision) under a Qwen2-VL folder:
`tokenize` -> `pack --vision-budget` -> `verify --source` -> `PackedDataset` + `PackedCollator` -> the model.

Each pack's `pixel_values` and `image_grid_thw` equal transformers' own image processor on its records' images;
each record's M-RoPE rows equal the model's `get_rope_index` on that record alone; a tiny random
`Qwen2VLForConditionalGeneration` gives each record's logits packed as alone (float64)."""

from __future__ import annotations

import copy
import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support import cli
from test_vision_families import build_qwen_folder, reference_processor

from packtool.formats.token_store import open_token_store
from packtool.loader import PackedDataset
from packtool.loader.collator import HF_KEYS, PackedCollator

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import packtool.hf  # noqa: E402, F401  (registers attn_implementation="packtool")

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample" / "vision"
SIZE = 512


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision_e2e")
    folder = build_qwen_folder(root / "model", "qwen2_vl")
    shutil.copytree(SAMPLE, root / "vision")
    demo = json.loads((SAMPLE / "mllm_demo.json").read_text())
    src = root / "vision" / "corpus.json"
    src.write_text(json.dumps([*demo, *demo[::-1], *demo], ensure_ascii=False))
    tokens, packs = root / "tokens", root / "packs"
    for argv in (
        [
            "tokenize",
            str(src),
            "--tokenizer",
            str(folder),
            "--output",
            str(tokens),
            "--format",
            "auto",
            "--backend",
            "hf",
            "-q",
        ],
        ["pack", str(tokens), "--size", str(SIZE), "--output", str(packs), "--vision-budget", "600", "-q"],
        ["verify", str(packs), "--source", str(tokens)],
    ):
        code, out, err = cli(*argv)
        assert code == 0, err
    assert "images whole in their packs" in out and "each where its document is" in out
    return {"model": folder, "tokens": tokens, "packs": packs}


def tiny(folder: Path) -> object:
    config = json.loads((folder / "config.json").read_text())
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    added = {t["content"]: t["id"] for t in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]}
    return transformers.Qwen2VLConfig(
        text_config={"vocab_size": max([*vocab.values(), *added.values()]) + 1, "hidden_size": 32,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "intermediate_size": 64, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
                     "max_position_embeddings": 1024, "bos_token_id": None, "eos_token_id": None},
        vision_config={"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 4, "mlp_ratio": 2},
        image_token_id=config["image_token_id"], vision_start_token_id=added["<|vision_start|>"],
        vision_end_token_id=added["<|vision_end|>"], video_token_id=added["<|video_pad|>"],
    )  # fmt: skip


def segments(ds: PackedDataset, p: int) -> list[tuple[int, int, int]]:
    """(document, column, length) of pack p's segments."""
    ps = ds._open()
    po = np.asarray(ps.pack_offsets)
    out, col = [], 0
    for j in range(int(po[p]), int(po[p + 1])):
        out.append((int(ps.seg_doc[j]), col, int(ps.seg_lens[j])))
        col += int(ps.seg_lens[j])
    return out


def test_pixels_grids_and_positions_equal_transformers(world: dict[str, Path]) -> None:
    from PIL import Image
    from transformers.image_utils import load_image

    ds = PackedDataset(world["packs"], size=SIZE)
    store = open_token_store(world["tokens"])
    table = store.media
    assert table is not None and ds.metadata["vision"]["budget"] == 600
    processor = reference_processor(world["model"], "qwen2_vl")
    model = transformers.Qwen2VLModel(tiny(world["model"]))
    image_id = int(ds.metadata["vision"]["image_token_id"])
    seen = 0
    for p in range(len(ds)):
        item = ds[p]
        images: list[object] = []
        for d, col, n in segments(ds, p):
            rows = table.of_documents(np.array([d]))  # the record's images, from the token store
            images += [load_image(Image.open(io.BytesIO(table.data(int(i))))) for i in rows]
            ids = item["input_ids"][col : col + n]
            grid = torch.from_numpy(np.asarray(table.grid[rows], np.int64)).reshape(-1, 3)
            want, _ = model.get_rope_index(
                ids[None], image_grid_thw=grid if rows.size else None, mm_token_type_ids=(ids == image_id).long()[None]
            )
            assert torch.equal(item["position_ids"][1:, col : col + n], want[:, 0]), (p, d)
            assert item["position_ids"][0, col : col + n].tolist() == list(range(n))
            seen += int(rows.size)
        if images:
            ref = processor.image_processor(images=images, return_tensors="np")
            assert np.array_equal(item["pixel_values"].numpy(), ref["pixel_values"])
            assert item["image_grid_thw"].tolist() == ref["image_grid_thw"].tolist()
    assert seen == len(table) > 0


def test_packed_logits_equal_each_record_alone(world: dict[str, Path]) -> None:
    ds = PackedDataset(world["packs"], size=SIZE)
    batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__(list(range(min(2, len(ds))))))
    config = tiny(world["model"])
    torch.manual_seed(0)
    model = transformers.Qwen2VLForConditionalGeneration(copy.deepcopy(config)).double().eval()
    model.set_attn_implementation("packtool")
    ref = transformers.Qwen2VLForConditionalGeneration(copy.deepcopy(config)).double().eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    image_id = int(ds.metadata["vision"]["image_token_id"])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs["pixel_values"] = inputs["pixel_values"].double()
    with torch.no_grad():
        logits = model(**inputs).logits[0]
    ids, pixels, grids = batch["input_ids"][0], inputs["pixel_values"], batch["image_grid_thw"]
    cu, g, r, worst = batch["cu_seq_lens_q"].tolist(), 0, 0, 0.0
    for a, e in zip(cu[:-1], cu[1:], strict=True):
        seg = ids[a:e]
        if not bool((seg != ds.pad_id).any()):
            continue
        k = int(((seg == image_id).int().diff(prepend=seg.new_zeros(1, dtype=torch.int32)) == 1).sum())
        n = int(grids[g : g + k].prod(-1).sum()) if k else 0
        extra = {"pixel_values": pixels[r : r + n], "image_grid_thw": grids[g : g + k]} if k else {}
        with torch.no_grad():
            alone = ref(input_ids=seg[None], mm_token_type_ids=(seg == image_id).long()[None], **extra).logits[0]
        worst = max(worst, float((alone - logits[a:e]).abs().max()))
        g, r = g + k, r + n
    assert g == grids.shape[0] > 0 and worst < 1e-9
