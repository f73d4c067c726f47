#!/usr/bin/env bash
# The whole pipeline on the shipped sample (data/sample), run by `make demo`.
# tokenize (chat + text) -> pack (two sizes) -> stats (+ plot) -> verify -> 3 training steps
# on CPU, then the same pipeline again from one config file (`packtool run`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PT="$PY -m packtool"
OUT=demo_out
TOK=data/sample/tokenizer
rm -rf "$OUT"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "tokenize: chat (loss on assistant turns only)"
$PT tokenize data/sample/chat.jsonl --format chat --tokenizer "$TOK" --output "$OUT/tokens/chat"
step "tokenize: plain text (jsonl + .txt files)"
$PT tokenize data/sample/text.jsonl data/sample/docs --tokenizer "$TOK" --output "$OUT/tokens/text"
step "tokenize: prompt-completion (loss on completions only)"
$PT tokenize data/sample/prompt_completion.jsonl --format prompt-completion --tokenizer "$TOK" --output "$OUT/tokens/pc"

step "stats: waste of every strategy before packing (N=4096)"
$PT stats "$OUT/tokens/text" --size 4096 --batch-size 8 --plot "$OUT/stats.png"

step "pack: text at 4096 (training), chat at 2048 with --pad-multiple 8 (loss masks travel along)"
$PT pack "$OUT/tokens/text" --size 4096 --output "$OUT/packs/text" --algorithm bfd --seed 0
$PT pack "$OUT/tokens/chat" --size 2048 --output "$OUT/packs/chat" --algorithm bfd --seed 0 --pad-multiple 8

step "stats of the pack stores"
$PT stats "$OUT/packs/text"
$PT stats "$OUT/packs/chat"

step "verify: invariants, checksums, every document exactly once with identical tokens"
$PT verify "$OUT/packs/text" --source "$OUT/tokens/text"
$PT verify "$OUT/packs/chat" --source "$OUT/tokens/chat"

step "train: 3 steps of a tiny model on the chat packs (CPU, varlen attention fallback)"
$PY scripts/train_plain.py "$OUT/packs/chat" --steps 3 --batch-size 2

step "run: the same pipeline from one config file"
$PT run configs/demo.yaml

printf '\nDone. Outputs in %s/ (waste plot: %s/stats.png)\n' "$OUT" "$OUT"
