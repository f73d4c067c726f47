"""A reward model on a preference pack store with a plain loop: the recipe of docs/HF.md, run end to end.

    python scripts/train_reward.py PACK_DIR [--size N] [--steps 3] [--batch-size 2] [--center 0.01]

The same packs DPO trains on (`pack` of a `--format preference` token store, with or without
`--share-prompt`): PackedDataset -> PackedCollator(flatten=True, keys=HF_KEYS) -> a tiny random Llama
`AutoModelForSequenceClassification` (num_labels=1) under attn_implementation="packtool" -> the head's
score at every position -> packtool.loss.pair_scores (each sequence's score where the model's own pooling
reads it on that sequence alone: its rightmost non-pad token) -> reward_loss (TRL RewardTrainer's
-logsigmoid(chosen - rejected), plus center_rewards_coefficient * mean((chosen + rejected)^2)).
Needs transformers (`pip install "packtool[hf]"`); CPU is fine.
"""

from __future__ import annotations

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack_dir", help="pack ROOT or packed/{tokenizer} dir of a preference pack store")
    ap.add_argument("--size", type=int, default=None, help="pack size N (needed when several are present)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--center", type=float, default=None, help="TRL's center_rewards_coefficient")
    args = ap.parse_args()
    try:
        from transformers import AutoModelForSequenceClassification, LlamaConfig
    except ImportError:
        sys.exit('error: transformers is not installed, scripts/train_reward.py, pip install "packtool[hf]"')

    import packtool.hf  # noqa: F401  registers attn_implementation="packtool"
    from packtool.errors import PacktoolError
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset
    from packtool.loss import pair_scores, reward_loss

    try:
        ds = PackedDataset(args.pack_dir, size=args.size)
        if not ds.preference:
            sys.exit(f"error: {args.pack_dir} is not a preference pack store, scripts/train_reward.py, "
                     "pack a `tokenize --format preference` store")
    except PacktoolError as e:
        sys.exit(f"error: {e}")
    torch.manual_seed(0)
    vocab = max(int(ds._open().tokens.max()), ds.pad_id) + 1  # a random model needs only the ids the packs hold
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.size,
                         num_labels=1, pad_token_id=ds.pad_id)  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation="packtool")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collate = PackedCollator(flatten=True, keys=(*HF_KEYS, "cu_seqlens_q"))  # real lengths: --pad-multiple
    layout = "shared prompt" if ds.shared_prompt else "pairs"
    print(f"{len(ds)} packs of {ds.size} tokens ({layout}), tiny random Llama reward model, vocab {vocab} "
          f"(the largest id in the packs + 1), scored at each sequence's last token that is not pad id {ds.pad_id}")
    for step in range(args.steps):
        rows = [(step * args.batch_size + i) % len(ds) for i in range(args.batch_size)]
        batch = collate(ds.__getitems__(rows))
        # labels stay out of the model (a num_labels=1 head would add a regression loss on them)
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "cu_seqlens_q")}
        per_token = model.score(model.model(**inputs, use_cache=False).last_hidden_state)  # [1, T, 1]
        scores = pair_scores(per_token, batch, pad_token_id=model.config.pad_token_id)
        loss = reward_loss(scores, center_rewards_coefficient=args.center)
        opt.zero_grad()
        loss.backward()
        opt.step()
        accuracy = (scores.chosen > scores.rejected).float().mean().item()
        margin = (scores.chosen - scores.rejected).mean().item()
        print(f"step {step + 1}: {len(scores.pair_ids)} pairs, reward loss {loss.item():.4f}, "
              f"accuracy {accuracy:.2f}, margin {margin:+.4f}")


if __name__ == "__main__":
    main()
