"""Padding-free training with the Hugging Face Trainer on a pack store.

    pip install -e ".[hf]"      # transformers 5.23, accelerate 1.15 (Trainer needs it), torch 2.13
    python scripts/train_hf_trainer.py PACK_DIR [--size N] [--steps 3] [--model-dir DIR] [--attn packtool]

How it fits together (docs/HF.md):
- `PackedDataset` gives one pack per item; `PackedCollator(flatten=True, keys=HF_KEYS)` turns
  a batch into ONE row `[1, B*N]` with `position_ids` restarting per document and
  `cu_seq_lens_q/_k`, `max_length_q/_k` (what transformers' `DataCollatorWithFlattening`
  produces, but precomputed offline and validated).
- `import packtool.hf` registers `attn_implementation="packtool"`: the packed row attends through
  `packtool.attention.varlen_attention` (flash-attn when installed, else torch's native varlen
  kernel on CUDA, else the exact fallback on CPU), each document alone (tests/test_hf.py).
  `--attn flash_attention_2` or `sdpa` picks transformers' own paths instead.
- Labels are unshifted (the model shifts them); -100 marks document starts and padding.
- `--model-dir` loads a real checkpoint; without it a tiny random Llama is built.
- DataLoader workers: `--workers N` starts them with `multiprocessing_context="spawn"`, the safe
  choice once CUDA is initialised (a forked worker can inherit CUDA state and die freeing it);
  the datasets pickle without their memory maps, so spawn costs only the worker start.
Prints the loss of the last step ("final loss") and the mean over all steps, each labelled.
Exits with one line (status 1) when transformers or accelerate (which `Trainer` needs) is not installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack_dir")
    ap.add_argument("--split", default="training")
    ap.add_argument("--size", type=int, default=None)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=2, help="packs per device batch (flattened into one row)")
    ap.add_argument("--model-dir", default=None, help="a transformers checkpoint; default: a tiny random Llama")
    ap.add_argument("--output-dir", default="hf_trainer_out")
    ap.add_argument("--attn", default="packtool", help="attn_implementation (default: packtool)")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader workers (started with spawn)")
    args = ap.parse_args()
    missing = [name for name in ("transformers", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:  # transformers' own error for accelerate comes as a traceback from TrainingArguments
        print(f"error: {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed (transformers' Trainer needs accelerate), "
              "scripts/train_hf_trainer.py, pip install \"packtool[hf]\" (or -e \".[hf]\" in a checkout)", file=sys.stderr)
        sys.exit(1)
    import torch
    import transformers

    import packtool.hf  # noqa: F401  registers attn_implementation="packtool"
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset

    ds = PackedDataset(args.pack_dir, split=args.split, size=args.size)
    attn = args.attn
    if args.model_dir:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, attn_implementation=attn)
    else:
        vocab = int(ds._open().tokens.max()) + 1
        config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, use_cache=False,
                                          max_position_embeddings=max(ds.size, 2048), attn_implementation=attn)
        model = transformers.LlamaForCausalLM(config)
    targs = transformers.TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        learning_rate=3e-3, logging_steps=1, save_strategy="no", report_to=[], use_cpu=not torch.cuda.is_available(),
        remove_unused_columns=False,  # our batch keys are not forward() arguments by name
        dataloader_num_workers=args.workers,
        dataloader_persistent_workers=args.workers > 0,
        # spawn: workers never inherit CUDA state from the parent (fork after CUDA init can crash them)
        **({"dataloader_multiprocessing_context": "spawn"} if args.workers else {}),
    )
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=ds,
                                   data_collator=PackedCollator(flatten=True, pad_id=ds.pad_id, keys=HF_KEYS))
    result = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]  # one per step (logging_steps=1)
    final = f"final loss {losses[-1]:.4f} (step {result.global_step}), " if losses else ""
    print(f"trained {result.global_step} steps, {final}mean loss {result.training_loss:.4f}, attention {attn}")


if __name__ == "__main__":
    main()
