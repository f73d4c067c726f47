#!/usr/bin/env bash
# The whole pipeline on the shipped sample (data/sample), run by `make demo`.
# tokenize (chat, text, prompt-completion, ShareGPT, Alpaca) -> pack (two sizes, a mixture with a
# validation split) -> stats (+ plot, step balance) -> verify -> 3 training steps on CPU -> DPO pairs packed with a
# shared prompt and 3 DPO steps -> image records (LLaMA-Factory's mllm demo) tokenized with the shipped tiny
# Qwen2-VL folder, packed under a patch budget, verified, 2 training steps -> audit of a model config, then the
# same pipeline again from one config file (`packtool run`).
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

step "tokenize: ShareGPT and Alpaca records, shape detected (--format auto), loss on assistant turns"
$PT tokenize data/sample/sharegpt.jsonl --format auto --tokenizer "$TOK" --output "$OUT/tokens/sharegpt"
$PT tokenize data/sample/alpaca.jsonl --format auto --tokenizer "$TOK" --output "$OUT/tokens/alpaca"

step "stats: waste of every strategy before packing (N=4096)"
$PT stats "$OUT/tokens/text" --size 4096 --batch-size 8 --plot "$OUT/stats.png"

step "pack: text at 4096 (training), chat at 2048 with --pad-multiple 8 (loss masks travel along)"
$PT pack "$OUT/tokens/text" --size 4096 --output "$OUT/packs/text" --algorithm bfd --seed 0
$PT pack "$OUT/tokens/chat" --size 2048 --output "$OUT/packs/chat" --algorithm bfd --seed 0 --pad-multiple 8

step "pack: a mixture (text once, ShareGPT twice, Alpaca a seeded half) with 5% held out as validation"
$PT pack "$OUT/tokens/text" "$OUT/tokens/sharegpt:2" "$OUT/tokens/alpaca:0.5" --size 4096 \
    --output "$OUT/packs/mix" --validation 0.05

step "stats of the pack stores (and the step balance of 8 data-parallel ranks, 7B-shaped cost)"
$PT stats "$OUT/packs/text" --world-size 8 --hidden-size 4096
$PT stats "$OUT/packs/chat"
$PT stats "$OUT/packs/mix"

step "verify: invariants, checksums, every document exactly once with identical tokens"
$PT verify "$OUT/packs/text" --source "$OUT/tokens/text"
$PT verify "$OUT/packs/chat" --source "$OUT/tokens/chat"
$PT verify "$OUT/packs/mix" --source "$OUT/tokens/text" --source "$OUT/tokens/sharegpt" --source "$OUT/tokens/alpaca"

step "train: 3 steps of a tiny model on the chat packs (CPU, varlen attention fallback)"
$PY scripts/train_plain.py "$OUT/packs/chat" --steps 3 --batch-size 2

step "preference pairs (DPO): TRL conversational pairs, each pair in one pack, its prompt held once"
$PT tokenize data/sample/preference.jsonl --format auto --tokenizer "$TOK" --output "$OUT/tokens/pairs"
$PT pack "$OUT/tokens/pairs" --size 2048 --share-prompt --output "$OUT/packs/pairs"
$PT verify "$OUT/packs/pairs" --source "$OUT/tokens/pairs"
$PT export "$OUT/packs/pairs" --to trl --output "$OUT/export/trl-dpo"
$PY scripts/train_dpo.py "$OUT/packs/pairs" --steps 3

step "images: LLaMA-Factory's mllm demo with the shipped tiny Qwen2-VL folder (processor rules, M-RoPE, no torch)"
VLM=data/sample/vision_model/qwen2_vl_tiny
$PT tokenize data/sample/vision/mllm_demo.json --format auto --tokenizer "$VLM" --output "$OUT/tokens/vision"
$PT pack "$OUT/tokens/vision" --size 512 --vision-budget 256 --output "$OUT/packs/vision"
$PT stats "$OUT/packs/vision"
$PT verify "$OUT/packs/vision" --source "$OUT/tokens/vision"
if $PY -c "import accelerate" 2>/dev/null; then
    # a tiny Qwen2VLForConditionalGeneration built from the folder's config.json (seed 0), packs through
    # PackedCollator(flatten=True, keys=HF_KEYS), attn_implementation="packtool"
    OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} $PY scripts/train_vision.py "$OUT/packs/vision" --model-dir "$VLM" \
        --steps 2 --batch-size 1 --output-dir "$OUT/vision_train"
else
    echo "(skipped the 2 training steps: scripts/train_vision.py needs accelerate, pip install \"packtool[hf]\")"
fi

step "audit: is packing exact on a Llama-shaped model? (config only, tiny random weights, CPU)"
$PY -c "from transformers import LlamaConfig; LlamaConfig().save_pretrained('$OUT/llama')"
$PT audit "$OUT/llama"

step "run: the same pipeline from one config file"
$PT run configs/demo.yaml

printf '\nDone. Outputs in %s/ (waste plot: %s/stats.png)\n' "$OUT" "$OUT"
