"""A plain PyTorch training loop on a pack store: the minimal padding-free recipe.

    python scripts/train_plain.py PACK_DIR [--size N] [--steps 3] [--batch-size 4]
    python scripts/train_plain.py TOKEN_STORE --documents [--max-tokens 8192]   # no packing step

PackedDataset -> PackedSampler (sharded, resumable) -> DataLoader(PackedCollator(flatten=True))
-> a tiny causal transformer whose attention is `packtool.attention.varlen_attention` over
the batch's `cu_seqlens` (flash-attn on CUDA when installed, the exact SDPA fallback on CPU).
The loss is summed over target tokens and divided by the batch's `n_target_tokens`, so every
target token weighs the same however the documents were packed. CPU is fine.
With `--documents`, PATH is a token store: DocumentDataset -> DynamicBatchSampler (a token budget)
-> PackedCollator(flatten=True), the padding-free minibatch, and the loss is `packed_cross_entropy`.
"""

from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn.functional as F

from packtool.attention import varlen_attention
from packtool.loader import (
    DocumentDataset,
    DynamicBatchSampler,
    PackedCollator,
    PackedDataset,
    PackedSampler,
    ResumableLoader,
)
from packtool.loss import packed_cross_entropy


class TinyLM(torch.nn.Module):
    """Embedding, `layers` pre-norm blocks (RoPE from position_ids, GQA attention, MLP), LM head."""

    def __init__(self, vocab: int, dim: int = 64, heads: int = 4, kv_heads: int = 2, layers: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "n1": torch.nn.RMSNorm(dim), "qkv": torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.hd, bias=False),
            "o": torch.nn.Linear(dim, dim, bias=False), "n2": torch.nn.RMSNorm(dim),
            "mlp": torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.SiLU(), torch.nn.Linear(4 * dim, dim)),
        }) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(dim)
        self.head = torch.nn.Linear(dim, vocab, bias=False)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.hd // 2
        ang = pos[:, None].float() / (10000 ** (torch.arange(half, device=x.device) / half))[None]
        cos, sin = ang.cos()[:, None].to(x.dtype), ang.sin()[:, None].to(x.dtype)
        return torch.cat([x[..., :half] * cos - x[..., half:] * sin, x[..., :half] * sin + x[..., half:] * cos], -1)

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        x = self.embed(ids)
        t = ids.shape[0]
        for b in self.blocks:
            q, k, v = b["qkv"](b["n1"](x)).view(t, -1, self.hd).split([self.heads, self.kv_heads, self.kv_heads], 1)
            a = varlen_attention(self.rope(q, pos), self.rope(k, pos), v, cu, max_seqlen, softmax_scale=1 / math.sqrt(self.hd))
            x = x + b["o"](a.reshape(t, -1))
            x = x + b["mlp"](b["n2"](x))
        return self.head(self.norm(x))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pack_dir", help="pack ROOT, packed/{tokenizer} dir, or a {split}_{N}.npy file")
    ap.add_argument("--split", default="training")
    ap.add_argument("--size", type=int, default=None, help="pack size N (needed when several are present)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab-size", type=int, default=None, help="default: the largest id in the store + 1")
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--documents", action="store_true", help="PATH is a token store: dynamic padding-free batches")
    ap.add_argument("--max-tokens", type=int, default=8192, help="token budget per batch with --documents")
    args = ap.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    collate = PackedCollator(flatten=True)
    if args.documents:
        docs = DocumentDataset(args.pack_dir)
        vocab = args.vocab_size or int(docs._open().tokens.max()) + 1
        batches = DynamicBatchSampler(docs, args.max_tokens, seed=0)  # rank / world from torch.distributed
        loader = ResumableLoader(torch.utils.data.DataLoader(docs, batch_sampler=batches, num_workers=args.workers,
                                                             collate_fn=collate))
        what = f"{len(docs)} documents in {len(batches)} batches of <= {args.max_tokens} tokens"
    else:
        ds = PackedDataset(args.pack_dir, split=args.split, size=args.size)
        vocab = args.vocab_size or int(ds._open().tokens.max()) + 1  # one vectorised pass over the map
        sampler = PackedSampler(ds, seed=0)  # rank / world size from torch.distributed when initialised
        loader = ResumableLoader(torch.utils.data.DataLoader(
            ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
            collate_fn=PackedCollator(flatten=True, pad_id=ds.pad_id)))
        what = f"{len(ds)} packs of {ds.size} tokens"
    model = TinyLM(vocab).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    print(f"{what}, vocab {vocab}, {sum(p.numel() for p in model.parameters())} params, {device}")
    step = 0
    t0 = time.perf_counter()
    while step < args.steps:
        for batch in loader:
            ids, pos, labels = (batch[k][0].to(device) for k in ("input_ids", "position_ids", "labels"))
            logits = model(ids, pos, batch["cu_seqlens"].to(device), batch["max_seqlen"])
            if args.documents:  # the same loss, with boundaries taken from cu_seqlens
                loss = packed_cross_entropy(logits, labels, batch["cu_seqlens"], "token")
            else:  # unshifted HF labels: position t predicts labels[t + 1]; -100 marks document starts and padding
                loss = F.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=-100, reduction="sum")
                loss = loss / max(1, batch["n_target_tokens"])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            print(f"step {step} epoch {loader.epoch} loss {loss.item():.4f} "
                  f"targets {batch['n_target_tokens']} segments {batch['cu_seqlens'].numel() - 1}")
            if step >= args.steps:
                break
    state = loader.state_dict()
    print(f"done in {time.perf_counter() - t0:.1f}s; loader.state_dict() resumes at epoch {state['epoch']} after "
          f"{state['consumed']} {'batches' if args.documents else 'packs'}")


if __name__ == "__main__":
    main()
