"""Train a vision-language model on a packtool vision pack store: transformers `Trainer` or TRL `SFTTrainer`.

    pip install -e ".[hf]"            # transformers 5.23, accelerate (Trainer needs it), torch 2.13
    python scripts/train_vision.py PACK_DIR --model-dir data/sample/vision_model/qwen2_vl_tiny --steps 2
    pip install trl==1.16.0           # for --trainer trl
    python scripts/train_vision.py PACK_DIR --model-dir data/sample/vision_model/qwen2_vl_tiny --trainer trl

How it fits together (docs/VISION.md, "Train"):
- `PackedDataset` items of a vision pack store carry `pixel_values` (the processor's rows of the pack's
  images, in order), `image_grid_thw`, and for M-RoPE families `position_ids [4, N]` (row 0 text positions
  restarting per document, rows 1-3 each document's own `get_rope_index`); Gemma 3 items carry
  `token_type_ids`. `PackedCollator(flatten=True, keys=HF_KEYS)` keeps them: one row `[1, B*N]`, pixel
  rows and grids concatenated in order, positions `[4, 1, B*N]`, `cu_seq_lens_q/_k`.
- `import packtool.hf` registers `attn_implementation="packtool"`: each document attends alone (varlen
  kernels on GPU, the exact fallback on CPU), Gemma 3's image blocks read at row-global indices.
- The model: `--model-dir` is the model folder the packs were tokenized with. With weights in it, they
  are loaded; without (the shipped tiny folder ships none), the model is built from its config.json
  with `torch.manual_seed(--seed)`, so every run starts from the same random weights.
- `--trainer trl`: TRL's `SFTTrainer` refuses `packing` and `padding_free` for image datasets (it would
  pack raw records itself, and cannot for images), and takes only a `datasets` Dataset. Here the data is
  packed and tokenized already, so TRL is handed our batches: its dataset is the pack indices
  (`Dataset.from_dict({"pack": range(len(ds))})`, no image in it, so nothing for TRL to refuse or
  prepare; `dataset_kwargs={"skip_prepare_dataset": True}`), and the collator reads those packs from
  `PackedDataset` and collates them with `PackedCollator` (`PackIndexCollator` below). TRL runs its loop
  and its loss on exactly the `Trainer` recipe's batches: same seed, same sampler order, the loss of
  every step equals the `Trainer` run's (tests/interop/test_trl_vision.py).
Prints the loss of every step and their mean. Exits with one line (status 1) when a package is missing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def build_model(model_dir: Path, attn: str, seed: int) -> Any:
    """The folder's weights when it has them, else its config.json with random weights drawn from `seed`."""
    import torch
    import transformers

    if any((model_dir / name).is_file() for name in WEIGHTS):
        return transformers.AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation=attn)
    config = transformers.AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    return transformers.AutoModelForImageTextToText.from_config(config, attn_implementation=attn)


def check_pairing(ds: Any, model: Any, model_dir: Path) -> None:
    """The packs were tokenized for this model: its image token, and no id past its vocabulary."""
    vision = ds.metadata.get("vision") or {}
    if not vision:
        fail(f"{ds.directory} is a text-only pack store: scripts/train_vision.py trains on packs of image records")
    want = getattr(model.config, "image_token_id", None) or getattr(model.config, "image_token_index", None)
    if want is not None and int(vision["image_token_id"]) != int(want):
        fail(f"the packs' image token id {vision['image_token_id']} is not {model_dir}'s ({want}): tokenize the "
             f"records with --tokenizer {model_dir}")  # fmt: skip
    vocab = model.get_input_embeddings().num_embeddings
    top = int(ds._open().tokens.max())
    if top >= vocab:
        fail(f"the packs hold token id {top}, past {model_dir}'s vocabulary ({vocab}): tokenize with its tokenizer")


class PackIndexCollator:
    """TRL's batches of `{"pack": i}` rows -> `PackedCollator` over those packs of `PackedDataset`."""

    def __init__(self, ds: Any, collator: Any) -> None:
        self.ds, self.collator = ds, collator

    def __call__(self, rows: list[dict[str, int]]) -> dict[str, Any]:
        return self.collator([self.ds[int(row["pack"])] for row in rows])


def training_args(args: argparse.Namespace, trl: bool) -> Any:
    import torch

    common: dict[str, Any] = dict(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr, logging_steps=1, save_strategy="no", report_to=[], seed=args.seed,
        use_cpu=not torch.cuda.is_available(), remove_unused_columns=False,  # our keys are forward() arguments
        dataloader_num_workers=args.workers, dataloader_persistent_workers=args.workers > 0,
        bf16=False, activation_checkpointing=False,  # TRL turns both on by default
        **({"dataloader_multiprocessing_context": "spawn"} if args.workers else {}),
    )  # fmt: skip
    if not trl:
        import transformers

        return transformers.TrainingArguments(**common)
    from trl import SFTConfig

    # the data is packed and tokenized already: TRL must not prepare (tokenize, pack, truncate) it again
    return SFTConfig(**common, dataset_kwargs={"skip_prepare_dataset": True}, packing=False, padding_free=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack_dir")
    ap.add_argument("--model-dir", required=True, help="the model folder the records were tokenized with")
    ap.add_argument("--trainer", choices=("hf", "trl"), default="hf", help="transformers Trainer or TRL SFTTrainer")
    ap.add_argument("--split", default="training")
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=2, help="packs per device batch (flattened into one row)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="random weights (when the folder has none) and data order")
    ap.add_argument("--output-dir", default="vision_train_out")
    ap.add_argument("--attn", default="packtool", help="attn_implementation (default: packtool)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (started with spawn)")
    ap.add_argument("--json", action="store_true", help="print the per-step losses as one JSON line")
    args = ap.parse_args()
    needed = ("transformers", "accelerate", *(("trl", "datasets") if args.trainer == "trl" else ()))
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"{' and '.join(missing)} not installed, scripts/train_vision.py needs them: "
             f"pip install \"packtool[hf]\"{' trl==1.16.0' if 'trl' in missing else ''}")  # fmt: skip
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").is_file():
        fail(f"{model_dir} has no config.json: pass the model folder the records were tokenized with")
    import transformers

    import packtool.hf  # noqa: F401  registers attn_implementation="packtool"
    from packtool.errors import PacktoolError
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset

    try:
        ds = PackedDataset(args.pack_dir, split=args.split, size=args.size)
    except PacktoolError as exc:
        fail(str(exc))
    model = build_model(model_dir, args.attn, args.seed)
    check_pairing(ds, model, model_dir)
    collator = PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS)
    targs = training_args(args, args.trainer == "trl")
    if args.trainer == "trl":
        import datasets
        from trl import SFTTrainer

        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
        packs = datasets.Dataset.from_dict({"pack": list(range(len(ds)))})
        trainer = SFTTrainer(model=model, args=targs, train_dataset=packs, processing_class=tokenizer,
                             data_collator=PackIndexCollator(ds, collator))  # fmt: skip
    else:
        trainer = transformers.Trainer(model=model, args=targs, train_dataset=ds, data_collator=collator)
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]  # one per step (logging_steps=1)
    if args.json:
        print(json.dumps({"trainer": args.trainer, "steps": result.global_step, "losses": losses}))
        return
    shown = ", ".join(f"{loss:.4f}" for loss in losses)
    print(f"trained {result.global_step} steps ({args.trainer}), losses per step [{shown}], "
          f"mean loss {result.training_loss:.4f}, attention {args.attn}")  # fmt: skip


if __name__ == "__main__":
    main()
