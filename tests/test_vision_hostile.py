"""A hostile pass over the vision inputs (issue 37), through the CLI and the loader as a user meets them.

A tiny Qwen2-VL folder (`test_vision_families.build_qwen_folder`: Qwen2-VL's template and image processor) reads
records holding images in every mode (CMYK JPEG, palette with transparency, RGBA, LA, 16-bit grayscale PNG, an
EXIF-rotated JPEG, 1x1), duplicates, 50 images in one record, an image inside a system turn, and text-only records
among them. Checked: the loader's ids and pixel rows equal transformers' processor on each record alone;
`--workers 1` / `2`, shards + `merge` and a SIGKILLed run resumed give the same bytes; 10000x10 and 90-megapixel
images refused in one line; `--on-error skip`; `--vision-budget` below one image; `--overlong` on a long
document with images; `verify` of a store with one image byte flipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from support import cli, cli_error
from test_vision_families import build_qwen_folder, png_header_only, reference_processor

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from packtool.formats.token_store import open_token_store  # noqa: E402
from packtool.loader import PackedDataset  # noqa: E402
from packtool.loader.collator import HF_KEYS, PackedCollator  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def modes(folder: Path) -> list[str]:
    """Images in every mode the processor meets, written to `folder`; their names."""
    rng = np.random.default_rng(5)

    def noise(w: int, h: int) -> Image.Image:
        return Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA")

    rotated = noise(90, 50).convert("RGB")
    exif = rotated.getexif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    images: dict[str, tuple[Image.Image, str, dict[str, Any]]] = {
        "rgb.jpg": (noise(123, 77).convert("RGB"), "JPEG", {}),
        "cmyk.jpg": (noise(64, 40).convert("CMYK"), "JPEG", {}),
        "palette.png": (noise(64, 48).convert("P"), "PNG", {"transparency": 3}),
        "alpha.png": (noise(100, 70), "PNG", {}),
        "la.png": (noise(57, 91).convert("LA"), "PNG", {}),
        "gray16.png": (Image.fromarray(rng.integers(0, 65535, (60, 100), dtype=np.uint16)), "PNG", {}),
        "exif.jpg": (rotated, "JPEG", {"exif": exif.tobytes()}),
        "tiny.png": (Image.new("RGB", (1, 1), (200, 10, 30)), "PNG", {}),
    }
    for name, (image, fmt, kw) in images.items():
        image.save(folder / name, fmt, **kw)
    return list(images)


def records(names: list[str]) -> list[dict[str, Any]]:
    def turn(q: str, a: str = "Fine.") -> list[dict[str, str]]:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    fifty = [names[i % len(names)] for i in range(50)]
    return [
        {"messages": [{"role": "system", "content": "<image>You see this."}, *turn("<image>And this?")],
         "images": [names[0], names[1]]},  # an image inside a system turn
        {"messages": turn("Fifty:" + "<image>" * 50), "images": fifty},
        {"messages": turn("No image here.")},
        {"messages": turn("<image>Twice<image>", "Same."), "images": [names[2], names[2]]},  # duplicate
        *[{"messages": turn(f"<image>What is {n}?"), "images": [n]} for n in names],
        {"messages": [*turn("Text only, two turns."), *turn("Again.")]},
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hostile")
    data = root / "data"
    data.mkdir()
    names = modes(data)
    rows = records(names)
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"root": root, "data": data, "names": names, "rows": rows, "model": build_qwen_folder(root / "m", "qwen2_vl")}


def tokenize(world: dict[str, Any], src: Path, out: Path, *extra: str) -> tuple[int, str, str]:
    return cli("tokenize", str(src), "--tokenizer", str(world["model"]), "--output", str(out), "--format", "auto",
               "-q", *extra)


def store_bytes(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "manifest.json"}


@pytest.fixture(scope="module")
def store(world: dict[str, Any]) -> Path:
    out = world["root"] / "store"
    code, _, err = tokenize(world, world["data"] / "corpus.jsonl", out, "--workers", "1", "--chunk-bytes", "600")
    assert code == 0, err
    return out


def test_every_mode_loads_as_the_processor_reads_it(world: dict[str, Any], store: Path) -> None:
    processor = reference_processor(world["model"], "qwen2_vl")
    refs = {}
    for k, row in enumerate(world["rows"]):
        images = iter(row.get("images", []))
        messages = []
        for m in row["messages"]:
            content: list[dict[str, Any]] = []
            for j, piece in enumerate(m["content"].split("<image>")):
                if j:
                    content.append({"type": "image", "path": str(world["data"] / next(images))})
                if piece:
                    content.append({"type": "text", "text": piece})
            messages.append({"role": m["role"], "content": content})
        ref = processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")
        refs[tuple(ref["input_ids"][0].tolist())] = (k, ref)
    out = world["root"] / "packs"
    code, _, err = cli("pack", str(store), "--size", "4096", "--output", str(out), "-q")
    assert code == 0, err
    ds = PackedDataset(out, size=4096)
    seen = []
    for p in range(len(ds)):
        batch = PackedCollator(flatten=True, keys=HF_KEYS)(ds.__getitems__([p]))
        ids, cu = batch["input_ids"][0], batch["cu_seq_lens_q"].tolist()
        rows = grid_at = 0
        for a, b in zip(cu[:-1], cu[1:], strict=True):
            seg = tuple(ids[a:b].tolist())
            if seg not in refs:
                continue  # tail padding
            k, ref = refs[seg]
            seen.append(k)
            n = len(world["rows"][k].get("images", []))
            if n:
                grids = batch["image_grid_thw"][grid_at : grid_at + n]
                assert grids.tolist() == ref["image_grid_thw"].tolist(), k
                m = int(grids.prod(-1).sum())
                assert torch.equal(batch["pixel_values"][rows : rows + m], ref["pixel_values"]), k
                rows, grid_at = rows + m, grid_at + n
        assert rows == len(batch.get("pixel_values", []))
    assert sorted(seen) == list(range(len(world["rows"])))
    manifest = json.loads((store / "manifest.json").read_text())["vision"]
    assert manifest["n_images"] == sum(len(r.get("images", [])) for r in world["rows"])
    assert manifest["n_unique"] == len(world["names"])


def test_workers_and_shards_give_the_same_bytes(world: dict[str, Any], store: Path, tmp_path: Path) -> None:
    src = world["data"] / "corpus.jsonl"
    code, _, err = tokenize(world, src, tmp_path / "two", "--workers", "2", "--chunk-bytes", "600")
    assert code == 0, err
    assert store_bytes(tmp_path / "two") == store_bytes(store)
    shards = []
    for i in range(3):
        code, _, err = tokenize(world, src, tmp_path / f"s{i}", "--workers", "1", "--chunk-bytes", "600",
                                "--num-shards", "3", "--shard-index", str(i))
        assert code == 0, err
        shards.append(str(tmp_path / f"s{i}"))
    code, _, err = cli("merge", *shards, "--output", str(tmp_path / "merged"), "-q")
    assert code == 0, err
    assert store_bytes(tmp_path / "merged") == store_bytes(store)


def test_a_sigkilled_run_resumes_to_the_same_bytes(world: dict[str, Any], store: Path, tmp_path: Path) -> None:
    """A real SIGKILL of the CLI process once some chunks are journaled; the rerun reuses them."""
    src = tmp_path / "big.jsonl"
    rows = world["rows"] * 30
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in world["names"]:
        shutil.copy(world["data"] / name, tmp_path / name)
    out = tmp_path / "out"
    flags = [str(src), "--tokenizer", str(world["model"]), "--format", "auto", "--workers", "1", "--chunk-bytes", "2000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "packtool", "tokenize", *flags, "--output", str(out), "-q"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / ".out.partial" / "journal.jsonl"
    deadline = time.monotonic() + 120
    killed = False
    while proc.poll() is None and time.monotonic() < deadline:
        if journal.exists() and len(journal.read_bytes().splitlines()) >= 4:  # an input line, then chunk lines
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
        time.sleep(0.02)
    proc.wait()
    if not killed:
        pytest.skip("the run finished before chunks were journaled: nothing to kill")
    assert not out.exists() and journal.exists()
    code, stdout, err = cli("tokenize", *flags, "--output", str(out))
    assert code == 0, err
    reused = re.search(r"(\d+)/(\d+) chunks reused", stdout)
    assert reused and 1 <= int(reused[1]) < int(reused[2]), stdout
    code, _, err = cli("tokenize", *flags, "--output", str(tmp_path / "fresh"), "-q")
    assert code == 0, err
    assert store_bytes(out) == store_bytes(tmp_path / "fresh")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: Image.new("RGB", (10000, 10)).save(p, "PNG"), "aspect ratio over 200"),
        (lambda p: p.write_bytes(png_header_only(9500, 9500)), "over the 89,478,485-pixel limit"),
    ],
    ids=["10000x10", "90-megapixel header"],
)
def test_huge_images_are_refused_in_one_line(world: dict[str, Any], tmp_path: Path, make: Any, words: str) -> None:
    make(tmp_path / "big.png")
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>Hi"}], "images": ["big.png"]}) + "\n")
    line = cli_error("tokenize", str(src), "--tokenizer", str(world["model"]), "--output", str(tmp_path / "o"),
                     "--format", "auto", "-q")
    assert words in line and "big.png" in line and f"{src}:1" in line, line
    assert not (tmp_path / "o").exists()


def test_on_error_skip_drops_the_bad_record_and_keeps_the_rest(world: dict[str, Any], store: Path, tmp_path: Path) -> None:
    rows = list(world["rows"])
    bad = {"messages": [{"role": "user", "content": "<image>Broken"}, {"role": "assistant", "content": "?"}],
           "images": ["corrupt.jpg"]}
    for name in world["names"]:
        shutil.copy(world["data"] / name, tmp_path / name)
    (tmp_path / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a JPEG")
    src = tmp_path / "with_bad.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:3], bad, *rows[3:]]))
    out = tmp_path / "o"
    code, _, err = tokenize(world, src, out, "--workers", "1", "--chunk-bytes", "600", "--on-error", "skip")
    assert code == 0, err
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["line"] for r in rejects] == [4] and "corrupt.jpg" in rejects[0]["reason"]
    got = {k: v for k, v in store_bytes(out).items() if k != "rejects.jsonl"}
    assert got == store_bytes(store)  # the same store as without the record


def long_store(world: dict[str, Any], tmp_path: Path) -> Path:
    words = " ".join(f"w{i}" for i in range(300))
    record = {"messages": [{"role": "user", "content": f"{words[:200]}<image>{words}<image>{words}<image>end"},
                           {"role": "assistant", "content": words}], "images": ["rgb.jpg", "alpha.png", "rgb.jpg"]}
    short = {"messages": [{"role": "user", "content": "<image>Short."}, {"role": "assistant", "content": "Yes."}],
             "images": ["tiny.png"]}
    for name in world["names"]:
        shutil.copy(world["data"] / name, tmp_path / name)
    src = tmp_path / "long.jsonl"
    src.write_text(json.dumps(record) + "\n" + json.dumps(short) + "\n")
    code, _, err = tokenize(world, src, tmp_path / "s", "--workers", "1")
    assert code == 0, err
    return tmp_path / "s"


@pytest.mark.parametrize("overlong", ["split", "truncate", "drop"])
def test_overlong_documents_with_images_keep_every_kept_image_whole(world: dict[str, Any], tmp_path: Path,
                                                                    overlong: str) -> None:
    store = long_store(world, tmp_path)
    table = open_token_store(store).media
    assert table is not None and table.doc.tolist() == [0, 0, 0, 1]
    size = int(table.offset[0] + table.n_tokens[0] // 2)  # the cut falls inside the first image
    out = tmp_path / "p"
    code, _, err = cli("pack", str(store), "--size", str(size), "--output", str(out), "--overlong", overlong, "-q")
    assert code == 0, err
    code, _, err = cli("verify", str(out), "--source", str(store), "-q")
    assert code == 0, err
    ds = PackedDataset(out, size=size)
    image_token = json.loads((store / "manifest.json").read_text())["vision"]["image_token_id"]
    kept = 0
    for p in range(len(ds)):
        item = ds[p]
        n_image_tokens = int((item["input_ids"] == image_token).sum())
        grids = item.get("image_grid_thw", torch.zeros(0, 3, dtype=torch.int64))
        assert n_image_tokens == int(grids.prod(-1).sum()) // 4  # every image whole: its tokens match its grid
        assert len(item.get("pixel_values", [])) == int(grids.prod(-1).sum())
        kept += len(grids)
    whole_in_first = int(((table.doc == 0) & (table.offset + table.n_tokens <= size)).sum())
    straddles = int(((table.doc == 0) & (table.offset < size) & (table.offset + table.n_tokens > size)).sum())
    assert {"split": 4, "truncate": whole_in_first + 1, "drop": 1}[overlong] == kept
    assert straddles == 1  # the test data makes the case it names


def test_overlong_error_and_a_budget_below_one_image_are_refused(world: dict[str, Any], tmp_path: Path) -> None:
    store = long_store(world, tmp_path)
    line = cli_error("pack", str(store), "--size", "200", "--output", str(tmp_path / "p"), "--overlong", "error", "-q")
    assert "more than the pack size 200" in line and not (tmp_path / "p").exists()
    line = cli_error("pack", str(store), "--size", "8192", "--output", str(tmp_path / "q"), "--vision-budget", "3", "-q")
    assert "more than --vision-budget 3" in line and not (tmp_path / "q").exists()


def test_verify_finds_one_flipped_image_byte(world: dict[str, Any], store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "s"
    shutil.copytree(store, copy)
    media = [p for p in copy.iterdir() if p.name.startswith("images") and p.suffix == ".bin"]
    assert media, sorted(p.name for p in copy.iterdir())
    data = bytearray(media[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    media[0].write_bytes(bytes(data))
    line = cli_error("verify", str(copy), "-q")
    assert media[0].name in line, line
    code, _, err = cli("verify", str(store), "-q")
    assert code == 0, err


@pytest.mark.parametrize(
    ("image", "words"),
    [("sub", "is not a regular file"), (5, "images[0] is int: an image is a path"),
     (None, "images[0] is NoneType"), ("", "is not a path")],
    ids=["a folder", "a number", "null", "empty"],
)
def test_images_that_are_not_images_are_refused_in_one_line(world: dict[str, Any], tmp_path: Path, image: Any,
                                                           words: str) -> None:
    (tmp_path / "sub").mkdir()
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Yo"}],
                               "images": [image]}) + "\n")
    line = cli_error("tokenize", str(src), "--tokenizer", str(world["model"]), "--output", str(tmp_path / "o"),
                     "--format", "auto", "-q")
    assert words in line and f"{src}:1" in line, line
    assert not (tmp_path / "o").exists()


def test_an_image_in_an_assistant_turn_is_never_a_target(world: dict[str, Any], tmp_path: Path) -> None:
    shutil.copy(world["data"] / "rgb.jpg", tmp_path / "rgb.jpg")
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"messages": [{"role": "user", "content": "Draw it."},
                                            {"role": "assistant", "content": "Here:<image> done."}],
                               "images": ["rgb.jpg"]}) + "\n")
    code, _, err = tokenize(world, src, tmp_path / "o", "--workers", "1")
    assert code == 0, err
    store = open_token_store(tmp_path / "o")
    ids, loss = np.asarray(store.tokens), np.asarray(store.loss)
    processor = reference_processor(world["model"], "qwen2_vl")
    ref = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "Draw it."}]},
         {"role": "assistant", "content": [{"type": "text", "text": "Here:"}, {"type": "image", "path": str(tmp_path / "rgb.jpg")},
                                           {"type": "text", "text": " done."}]}], tokenize=True, return_dict=True)
    assert ids.tolist() == list(ref["input_ids"][0])
    image = ids == json.loads((tmp_path / "o" / "manifest.json").read_text())["vision"]["image_token_id"]
    assert image.sum() > 0 and not loss[image].any() and loss[~image].any()  # the text around it is a target
