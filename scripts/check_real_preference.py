"""Real preference data through `packtool tokenize --format preference`, checked against TRL 1.16's own
`DPOTrainer` preprocessing on a real tokenizer.

For each data file (jsonl or a `.json` array; one preference shape per file: TRL standard or conversational,
explicit or implicit prompt, LLaMA-Factory ShareGPT or Alpaca ranking records) packtool tokenizes it with
`--backend hf` and `--backend fast` when fastokens is installed (`--on-error skip`). TRL's `DPOTrainer._prepare_dataset` and
`DataCollatorForPreference` run on the records packtool kept (LLaMA-Factory's converted by this script's
own code, from the conventions in docs/CHAT.md, not packtool's), and every pair must hold TRL's forward ids
and completion mask, byte for byte, as documents 2i and 2i+1; both backends must write the same bytes.
Records packtool rejected are listed with their reasons.

The tokenizer is a directory (tokenizer.json + tokenizer_config.json with a chat template) or a hub name read
from the local Hugging Face cache only; when it is not there, or TRL is not installed (it lives in the interop
venv: `make interop`), the script says so and exits 0. Nothing is downloaded. Without FILES it checks a few
built-in records of every shape.

Run: .venv-interop/bin/python scripts/check_real_preference.py --tokenizer Qwen/Qwen2.5-0.5B-Instruct [FILE...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

U = lambda text: {"role": "user", "content": text}  # noqa: E731
A = lambda text: {"role": "assistant", "content": text}  # noqa: E731
BUILT_IN: dict[str, list[dict[str, Any]]] = {
    "standard": [{"prompt": "The capital of France is", "chosen": " Paris.", "rejected": " Lyon."},
                 {"prompt": "Q: 2+2? A: ", "chosen": "4", "rejected": "five"},
                 {"prompt": "Привет, как", "chosen": " дела?", "rejected": ""}],
    "standard_implicit": [{"chosen": "The sky is blue.", "rejected": "The sky is green."}],
    "conversational": [{"prompt": [U("What color is the sky?")], "chosen": [A("Blue.")], "rejected": [A("Green.")]},
                       {"prompt": [{"role": "system", "content": "Be brief."}, U("one"), A("Uno."), U("two")],
                        "chosen": [A("Dos.")], "rejected": [A("Zwei.")]}],
    "conversational_implicit": [{"chosen": [U("東京は？"), A("晴れ。")], "rejected": [U("東京は？"), A("雨。")]}],
    "ranking_sharegpt": [{"conversations": [{"from": "human", "value": "Hi?"}], "system": "Be kind.",
                          "chosen": {"from": "gpt", "value": "Hello!"}, "rejected": {"from": "gpt", "value": "Go."}}],
    "ranking_alpaca": [{"instruction": "Translate", "input": "bonjour", "chosen": "hello", "rejected": "bye"}],
}
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
         "observation": "tool", "tool": "tool", "function": "tool"}


def as_trl(record: dict[str, Any]) -> dict[str, Any]:
    """LLaMA-Factory's ranking records as TRL conversational explicit-prompt records (docs/CHAT.md)."""
    tools = {"tools": record["tools"]} if record.get("tools") else {}
    if isinstance(record.get("chosen"), dict):  # ShareGPT ranking
        turns = []
        for turn in record["conversations"]:
            if turn["from"] == "function_call":
                calls = json.loads(turn["value"])
                calls = calls if isinstance(calls, list) else [calls]
                turns.append({"role": "assistant", "tool_calls": [
                    {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]})
            else:
                turns.append({"role": ROLES[turn["from"].strip().lower()], "content": turn["value"]})
        if turns[0]["role"] != "system" and record.get("system"):
            turns.insert(0, {"role": "system", "content": record["system"]})
        return {"prompt": turns, "chosen": [A(record["chosen"]["value"])],
                "rejected": [A(record["rejected"]["value"])], **tools}
    if "instruction" in record:  # Alpaca ranking
        prompt = [{"role": "system", "content": record["system"]}] if record.get("system") else []
        for user, assistant in record.get("history") or []:
            prompt += [U(user), A(assistant)]
        prompt.append(U("\n".join(p for p in (record["instruction"], record.get("input")) if p)))
        return {"prompt": prompt, "chosen": [A(record["chosen"])], "rejected": [A(record["rejected"])], **tools}
    return record


def locate(name: str) -> Path | None:
    if Path(name).is_dir():
        return Path(name)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True,
                                      allow_patterns=["tokenizer*", "*.jinja", "special_tokens_map.json"]))
    except Exception:
        return None


def trl_sequences(hf: Any, records: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    import datasets
    from trl.trainer.dpo_trainer import DataCollatorForPreference, DPOTrainer

    rows = [{**r, "tools": json.dumps(r["tools"]) if isinstance(r.get("tools"), list) else r.get("tools")}
            if any("tools" in x for x in records) else r for r in records]
    args = SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_start")
    prepared = DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=hf), datasets.Dataset.from_list(rows), hf,
                                           args, "train")
    collate = DataCollatorForPreference(pad_token_id=hf.pad_token_id if hf.pad_token_id is not None else 0)
    out = []
    for example in prepared:
        batch = collate([example])
        for row in range(2):
            keep = batch["attention_mask"][row].bool()
            out.append((batch["input_ids"][row][keep].tolist(), batch["completion_mask"][row][keep].tolist()))
    return out


def tokenize(src: Path, tok: Path, backend: str, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "packtool", "tokenize", str(src), "--tokenizer", str(tok), "--output",
                    str(out), "--format", "preference", "--backend", backend, "--on-error", "skip", "-q",
                    "--overwrite"], check=True)


def check(name: str, records: list[dict[str, Any]], tok: Path, hf: Any, work: Path) -> bool:
    from packtool.formats.token_store import open_token_store

    src = work / f"{name}.jsonl"
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    import importlib.util

    backends = ("hf", "fast") if importlib.util.find_spec("fastokens") else ("hf",)
    outs = {b: work / f"{name}_{b}" for b in backends}
    for backend, out in outs.items():
        tokenize(src, tok, backend, out)
    same = all((outs["hf"] / f).read_bytes() == (out / f).read_bytes()
               for out in outs.values() for f in ("tokens.bin", "tokens.boundaries", "tokens.loss"))
    rejects = outs["hf"] / "rejects.jsonl"
    rejected = {json.loads(x)["line"]: json.loads(x)["reason"] for x in rejects.read_text().splitlines()} \
        if rejects.is_file() else {}
    kept = [as_trl(r) for i, r in enumerate(records, start=1) if i not in rejected]
    store = open_token_store(outs["hf"])
    got = [(store.document(d).tolist(), store.loss[store.starts[d]: store.boundaries[d]].tolist())
           for d in range(store.n_documents)]
    want = trl_sequences(hf, kept) if kept else []
    equal = sum(g == w for g, w in zip(got, want, strict=False)) // 2 if len(got) == len(want) else 0
    ok = same and len(got) == len(want) and equal * 2 == len(want)
    both = f"hf and fast identical: {same}" if len(backends) > 1 else "hf backend only (fastokens not installed)"
    print(f"{name}: {len(records)} records, {len(kept)} pairs, {equal} equal to TRL, {len(rejected)} rejected, "
          f"{both} -> {'OK' if ok else 'MISMATCH'}")
    for line, reason in list(rejected.items())[:5]:
        print(f"  rejected line {line}: {reason}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a directory or a hub name in the local HF cache")
    ap.add_argument("files", type=Path, nargs="*")
    args = ap.parse_args()
    try:
        import trl  # noqa: F401
        from transformers import AutoTokenizer
    except ImportError:
        print("skipped: TRL is not installed here (run it with the interop venv: make interop)")
        return
    tok = locate(args.tokenizer)
    if tok is None:
        print(f"skipped: tokenizer {args.tokenizer!r} is not a directory nor in the local Hugging Face cache")
        return
    hf = AutoTokenizer.from_pretrained(str(tok))
    sets = {p.stem: (json.loads(p.read_text("utf-8")) if p.suffix == ".json" else
                     [json.loads(x) for x in p.read_text("utf-8").splitlines() if x.strip()]) for p in args.files}
    with tempfile.TemporaryDirectory() as work:
        results = [check(name, records, tok, hf, Path(work)) for name, records in (sets or BUILT_IN).items()]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
