"""DPO on a preference pack store with a plain loop: the recipe of docs/HF.md, run end to end.

    python scripts/train_dpo.py PACK_DIR [--size N] [--steps 3] [--batch-size 2]

PackedDataset (a store of `pack` on a `--format preference` token store, with or without
`--share-prompt`) -> PackedCollator(flatten=True, keys=HF_KEYS) (pair_ids, chosen, prefix_segment
travel along) -> a tiny random Llama under attn_implementation="packtool" (each sequence attends
to itself, each completion to its prompt held once) -> packtool.loss.pair_logps (TRL's logps, equal
to each sequence run alone) -> dpo_loss (TRL's sigmoid). The reference model is a frozen copy.
Needs transformers (`pip install "packtool[hf]"`); CPU is fine.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack_dir", help="pack ROOT or packed/{tokenizer} dir of a preference pack store")
    ap.add_argument("--size", type=int, default=None, help="pack size N (needed when several are present)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--beta", type=float, default=0.1)
    args = ap.parse_args()
    try:
        from transformers import AutoModelForCausalLM, LlamaConfig
    except ImportError:
        sys.exit('error: transformers is not installed, scripts/train_dpo.py, pip install "packtool[hf]"')

    import packtool.hf  # noqa: F401  registers attn_implementation="packtool"
    from packtool.errors import PacktoolError
    from packtool.loader import HF_KEYS, PackedCollator, PackedDataset
    from packtool.loss import dpo_loss, pair_logps, pair_targets

    try:
        ds = PackedDataset(args.pack_dir, size=args.size)
        if not ds.preference:
            sys.exit(f"error: {args.pack_dir} is not a preference pack store, scripts/train_dpo.py, "
                     "pack a `tokenize --format preference` store")
    except PacktoolError as e:
        sys.exit(f"error: {e}")
    torch.manual_seed(0)
    vocab = max(int(ds._open().tokens.max()), ds.pad_id) + 1  # a random model needs only the ids the packs hold
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=ds.size)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="packtool")
    ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collate = PackedCollator(flatten=True, keys=HF_KEYS)
    layout = "shared prompt" if ds.shared_prompt else "pairs"
    print(f"{len(ds)} packs of {ds.size} tokens ({layout}), tiny random Llama, vocab {vocab} (the largest id in the packs + 1)")
    for step in range(args.steps):
        rows = [(step * args.batch_size + i) % len(ds) for i in range(args.batch_size)]
        batch = collate(ds.__getitems__(rows))
        keep = pair_targets(batch).predictor  # only the logit rows that predict a target
        # labels stay out of the model: its shift-by-one loss is not DPO's (and wrong across a shared prompt)
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        policy = pair_logps(model(**inputs, logits_to_keep=keep).logits, batch, kept=True)
        with torch.no_grad():
            ref = pair_logps(ref_model(**inputs, logits_to_keep=keep).logits, batch, kept=True)
        loss = dpo_loss(policy, ref, beta=args.beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
        margin = (policy.chosen - policy.rejected - ref.chosen + ref.rejected).mean().item()
        print(f"step {step + 1}: {len(policy.pair_ids)} pairs, dpo loss {loss.item():.4f}, reward margin {margin:+.4f}")


if __name__ == "__main__":
    main()
