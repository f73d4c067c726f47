"""Preference tokenization speed: `--format preference` against `--format chat` on the same conversations.

The same N conversations, in the same run, alternately (noise from other jobs hits both alike):
- chat: one record per conversation, `messages` = prompt + chosen answer (one document each);
- preference: one record per conversation, TRL conversational `prompt` / `chosen` / `rejected` (two
  documents each). What a pair costs on top of the chat record is TRL's own recipe: three renders
  (the prompt with `add_generation_prompt`, prompt+chosen, prompt+rejected), three encodes, and the
  common-prefix cut (numpy), where chat renders one conversation (plus its marker render) and encodes it once.
Reported: records/s and documents/s (wall, and per CPU-second of the process: steadier on a shared
machine), best of `--repeat`, in-process `tokenize_corpus` with
`--backend hf` or `fast` (tokenizer load included), and the ratio preference/chat records/s.

Inputs: a byte-level BPE (16,384 tokens) trained on this interpreter's standard library with Qwen2.5's
control tokens, Qwen2.5's real chat template (tests/fixtures), conversations of 2-6 turns cut from the
standard library's docstrings. Built under bench_out/preference/.

Run: python scripts/bench_preference.py [--records 4000] [--repeat 3] [--workers 2] [--backend hf|fast]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench_out" / "preference"


def build_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    spec = json.loads((ROOT / "tests" / "fixtures" / "chat_templates" / "qwen2_5.json").read_text("utf-8"))
    if (directory / "tokenizer.json").is_file():
        return directory
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:400]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = sorted({t["content"] for t in spec["added_tokens"]} | {spec["eos_token"]})
    trainer = trainers.BpeTrainer(vocab_size=16_384, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((p.read_text("utf-8", errors="replace") for p in files), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {"chat_template": spec["chat_template"], "eos_token": spec["eos_token"]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def build_records(n: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """(preference records, chat records) of the same n conversations."""
    rng = random.Random(seed)
    words = " ".join(p.read_text("utf-8", errors="replace") for p in
                     sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:60]).split()

    def text(lo: int, hi: int) -> str:
        k = rng.randint(lo, hi)
        start = rng.randrange(0, len(words) - k)
        return " ".join(words[start: start + k])

    preference, chat = [], []
    for _ in range(n):
        prompt = [{"role": "system", "content": text(5, 30)}] if rng.random() < 0.5 else []
        for _ in range(rng.choice((0, 0, 1, 2))):
            prompt += [{"role": "user", "content": text(10, 80)}, {"role": "assistant", "content": text(20, 150)}]
        prompt.append({"role": "user", "content": text(10, 120)})
        chosen, rejected = [{"role": "assistant", "content": text(30, 300)}], [{"role": "assistant",
                                                                                "content": text(30, 300)}]
        preference.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
        chat.append({"messages": prompt + chosen})
    return preference, chat


def run(src: Path, tok: Path, fmt: str, workers: int, backend: str) -> tuple[float, float, dict]:
    import packtool

    out = OUT / f"store_{fmt}"
    shutil.rmtree(out, ignore_errors=True)
    start, cpu = time.perf_counter(), time.process_time()
    result = packtool.tokenize_corpus(packtool.TokenizeConfig(
        inputs=(str(src),), tokenizer=str(tok), output=str(out), format=fmt, workers=workers, backend=backend))  # type: ignore[arg-type]
    return time.perf_counter() - start, time.process_time() - cpu, result.manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--backend", default="hf", choices=("hf", "fast"))
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(OUT / "tok")
    preference, chat = build_records(args.records)
    files = {"preference": OUT / "preference.jsonl", "chat": OUT / "chat.jsonl"}
    for fmt, rows in (("preference", preference), ("chat", chat)):
        files[fmt].write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    best = {"preference": float("inf"), "chat": float("inf")}
    cpu = dict(best)
    manifests: dict[str, dict] = {}
    for _ in range(args.repeat):
        for fmt in ("chat", "preference"):
            seconds, cpu_seconds, manifests[fmt] = run(files[fmt], tok, fmt, args.workers, args.backend)
            best[fmt], cpu[fmt] = min(best[fmt], seconds), min(cpu[fmt], cpu_seconds)
    print(f"{args.records} conversations, --backend {args.backend}, {args.workers} workers, best of {args.repeat}:")
    for fmt in ("chat", "preference"):
        m = manifests[fmt]
        print(f"  {fmt:10s}: {best[fmt]:.2f} s  {args.records / best[fmt]:8.0f} records/s  "
              f"{m['n_documents'] / best[fmt]:8.0f} documents/s  {m['n_tokens'] / best[fmt] / 1e6:6.2f}M tokens/s  "
              f"CPU {cpu[fmt]:.2f} s = {args.records / cpu[fmt]:6.0f} records per CPU-s  "
              f"({m['n_documents']} documents, {m['n_tokens']} tokens, {m['n_target_tokens']} targets)")
    print(f"  preference/chat records/s: wall {best['chat'] / best['preference']:.2f}, "
          f"CPU {cpu['chat'] / cpu['preference']:.2f}")


if __name__ == "__main__":
    main()
