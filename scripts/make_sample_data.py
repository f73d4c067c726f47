"""Build the shipped sample corpus and tokenizer under data/sample/, reproducibly and offline.

Source text (PSF License), read from the running interpreter: docstrings of a FIXED, sorted
list of pure-Python CPython standard-library modules, plus the 79 language-reference topics
`pydoc` ships (`pydoc_data.topics`, 0.2 KB to 62 KB each). Generated with CPython 3.11.7;
another minor version changes the docstrings, hence the committed outputs are what ships.
Lengths are naturally long-tailed (one-line helpers next to 15k-token reference pages),
which is exactly the shape packing has to cope with.

Outputs (all committed, `make demo` never regenerates them):
  text.jsonl               {"text"}                       ~2000 docs
  prompt_completion.jsonl  {"prompt", "completion"}       ~500
  chat.jsonl               {"messages": [{role, content}]} ~500, system/user/assistant, multi-turn
  docs/*.txt               a few plain-text "module pages" (one document per file)
  tokenizer/               byte-level BPE, vocab 8192, trained on all of the above
  sharegpt.jsonl           the first 8 chats as ShareGPT {"system", "conversations": [{from, value}]}
  alpaca.jsonl             the first 8 chats as Alpaca (system, history), 8 prompt-completions with `input`
  preference.jsonl         64 DPO pairs (TRL conversational, explicit prompt): a chat's last answer is chosen,
                           an unhelpful deflection rejected

Run: python scripts/make_sample_data.py [--out data/sample]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import json
import re
import sys
import warnings
from pathlib import Path
from pydoc_data.topics import topics

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 20240601
VOCAB_SIZE = 8192
TOKENIZER_NAME = "packtool-sample-bpe-8k"
SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
N_TEXT, N_PROMPT_COMPLETION, N_CHAT = 2000, 500, 500
DOC_PAGES = ("dataclasses", "difflib", "json", "statistics", "textwrap")
SYSTEM_PROMPTS = (
    "You are a helpful assistant that answers questions about the Python standard library.",
    "You are a concise Python expert. Quote the documentation when it helps.",
    "You explain Python APIs to engineers. Be precise.",
)
ASK_TEMPLATES = (
    "Explain `{name}`.",
    "What does `{name}` do?",
    "Can you describe {name} from the Python standard library?",
    "I keep seeing `{name}` in code. What is it for?",
    "Document `{name}` for me.",
)
FOLLOW_UPS = (
    "Which module is it in?",
    "What is its signature?",
    "Is there something related in the same module?",
)
#: Pure-Python modules present in every CPython 3.11 build (no tkinter/curses/OS-specific ones).
MODULES = sorted(
    """
    abc argparse ast base64 bdb bisect calendar cmd code codecs collections colorsys configparser
    contextlib copy csv dataclasses datetime decimal difflib dis doctest email.message email.utils
    enum filecmp fileinput fnmatch fractions ftplib functools getopt gettext glob gzip hashlib heapq
    hmac html html.parser http.client http.cookies imaplib inspect ipaddress json json.decoder
    json.encoder keyword linecache locale logging logging.handlers lzma mailbox mimetypes numbers
    operator optparse os pathlib pickle pickletools pkgutil platform plistlib poplib pprint profile
    pstats queue quopri random re reprlib sched secrets selectors shelve shlex shutil smtplib socket
    socketserver statistics string struct subprocess tarfile tempfile textwrap threading timeit
    token tokenize trace traceback types typing unittest.case unittest.mock urllib.parse
    urllib.request uuid warnings wave weakref xml.dom.minidom xml.etree.ElementTree zipfile zipimport
    """.split()  # noqa: SIM905 - a word list reads better than 111 quoted strings
)


def _clean(doc: object) -> str | None:
    if not isinstance(doc, str):
        return None
    text = inspect.cleandoc(doc).strip()
    return text if len(text) >= 20 else None


def _signature(obj: object) -> str | None:
    """The signature with object addresses removed (`<object object at 0x7f..>` differs per run)."""
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return re.sub(r" at 0x[0-9a-fA-F]+", "", sig)


def collect_entries() -> list[dict[str, str | None]]:
    """Every (qualified name, docstring, signature) defined in MODULES, in a stable order."""
    entries: list[dict[str, str | None]] = []
    seen: set[str] = set()
    for modname in MODULES:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            mod = importlib.import_module(modname)
        candidates: list[tuple[str, object]] = [(modname, mod)]
        for name, obj in sorted(vars(mod).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            candidates.append((f"{modname}.{name}", obj))
            if inspect.isclass(obj):
                for mname, member in sorted(vars(obj).items()):
                    if not mname.startswith("_") and inspect.isfunction(member):
                        candidates.append((f"{modname}.{name}.{mname}", member))
        for qualname, obj in candidates:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                doc = _clean(getattr(obj, "__doc__", None))
            if doc is None or doc in seen:
                continue
            seen.add(doc)
            kind = "module" if inspect.ismodule(obj) else "class" if inspect.isclass(obj) else "function"
            sig = None if kind == "module" else _signature(obj)
            entries.append({"name": qualname, "module": modname, "kind": kind, "doc": doc, "signature": sig})
    return entries


def text_docs(entries: list[dict[str, str | None]], rng: np.random.Generator) -> list[dict[str, str]]:
    """Plain documents: every language-reference topic (the long tail) and sampled docstrings, shuffled."""
    out = [{"text": str(topics[name]).strip()} for name in sorted(topics)]
    picks = rng.choice(len(entries), size=N_TEXT - len(out), replace=False)
    for i in sorted(picks.tolist()):
        e = entries[i]
        head = f"{e['name']}{e['signature'] or ''}\n\n" if rng.random() < 0.5 else ""
        out.append({"text": head + str(e["doc"])})
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def prompt_completion_docs(entries: list[dict[str, str | None]], rng: np.random.Generator) -> list[dict[str, str]]:
    funcs = [e for e in entries if e["kind"] != "module"]
    picks = rng.choice(len(funcs), size=N_PROMPT_COMPLETION, replace=False)
    out = []
    for i in picks.tolist():
        e = funcs[i]
        prompt = ASK_TEMPLATES[int(rng.integers(len(ASK_TEMPLATES)))].format(name=e["name"])
        sig = f"`{e['name']}{e['signature']}`\n\n" if e["signature"] else ""
        out.append({"prompt": prompt, "completion": sig + str(e["doc"])})
    return out


def _follow_up(q: str, e: dict[str, str | None], sibling: dict[str, str | None]) -> str:
    if q == FOLLOW_UPS[0]:
        return f"`{e['name']}` is defined in the `{e['module']}` module; import it with `import {e['module']}`."
    if q == FOLLOW_UPS[1]:
        if e["signature"]:
            return f"`{e['name']}{e['signature']}`"
        return f"`{e['name']}` has no introspectable signature; see its docstring above."
    return f"Yes, `{sibling['name']}`:\n\n{sibling['doc']}"


def chat_docs(entries: list[dict[str, str | None]], rng: np.random.Generator) -> list[dict[str, list[dict[str, str]]]]:
    """Multi-turn ChatML-style conversations: system, then 1-4 user/assistant exchanges."""
    funcs = [e for e in entries if e["kind"] != "module"]
    by_module: dict[str, list[int]] = {}
    for i, e in enumerate(funcs):
        by_module.setdefault(str(e["module"]), []).append(i)
    out = []
    for i in rng.choice(len(funcs), size=N_CHAT, replace=False).tolist():
        e = funcs[i]
        messages = []
        if rng.random() < 0.8:
            messages.append({"role": "system", "content": SYSTEM_PROMPTS[int(rng.integers(len(SYSTEM_PROMPTS)))]})
        ask = ASK_TEMPLATES[int(rng.integers(len(ASK_TEMPLATES)))].format(name=e["name"])
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": str(e["doc"])}]
        n_follow = int(min(rng.geometric(0.5) - 1, len(FOLLOW_UPS)))
        siblings = by_module[str(e["module"])]
        for q in rng.permutation(FOLLOW_UPS)[:n_follow].tolist():
            sibling = funcs[siblings[int(rng.integers(len(siblings)))]]
            messages += [{"role": "user", "content": q}, {"role": "assistant", "content": _follow_up(q, e, sibling)}]
        out.append({"messages": messages})
    return out


def module_pages(entries: list[dict[str, str | None]]) -> dict[str, str]:
    """A few long plain-text pages: a module's docstring followed by every documented member."""
    pages = {}
    for modname in DOC_PAGES:
        parts = [f"{modname}\n{'=' * len(modname)}\n"]
        for e in entries:
            if e["module"] != modname:
                continue
            title = e["name"] if e["kind"] == "module" else f"{e['name']}{e['signature'] or ''}"
            parts.append(f"{title}\n\n{e['doc']}\n")
        pages[modname] = "\n".join(parts)
    return pages


def write_jsonl(path: Path, rows: list) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def corpus_texts(out: Path) -> list[str]:
    """Every string of the sample, in file order, as the tokenizer trainer sees it."""
    texts: list[str] = []
    for line in (out / "text.jsonl").read_text("utf-8").splitlines():
        texts.append(json.loads(line)["text"])
    for line in (out / "prompt_completion.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        texts += [row["prompt"], row["completion"]]
    for line in (out / "chat.jsonl").read_text("utf-8").splitlines():
        texts += [m["content"] for m in json.loads(line)["messages"]]
    texts += [p.read_text("utf-8") for p in sorted((out / "docs").glob("*.txt"))]
    return texts


CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(texts: list[str], directory: Path) -> None:
    """Byte-level BPE (GPT-2 style), specials first so their ids are 0..3; no BOS, EOS appended by packtool."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config = {
        "name_or_path": TOKENIZER_NAME,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True}
            for t in SPECIAL_TOKENS
        },
        "chat_template": CHAT_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


TOKENIZER_README = f"""# {TOKENIZER_NAME}

A small byte-level BPE tokenizer shipped with packtool so that the demo, the docs and the
tests run offline. It is not meant for training real models.

- Trained by `scripts/make_sample_data.py` (Hugging Face `tokenizers`, `BpeTrainer`,
  vocab {VOCAB_SIZE}, min_frequency 2, the 256 byte-level symbols as initial alphabet) on the
  sample corpus in `data/sample/` (every string of text.jsonl, prompt_completion.jsonl,
  chat.jsonl and docs/*.txt). Re-running the script reproduces `tokenizer.json` byte for byte
  with CPython 3.11.7 and tokenizers 0.23.3; the committed file is what ships.
- Special tokens (ids 0-3): `<|endoftext|>` (eos), `<|pad|>` (pad), `<|im_start|>`,
  `<|im_end|>` (ChatML turns). No BOS token (`bos_token: null`, like GPT-2/Qwen2 base).
  The post-processor adds nothing; packtool appends the EOS itself.
- `tokenizer_config.json` carries `name_or_path` = `{TOKENIZER_NAME}`, the eos/pad tokens and a
  ChatML `chat_template` (Jinja, as transformers renders it; every turn, the assistant's
  included, ends with `<|im_end|>` and a newline).
- Every id is below 65,536, so token stores made with it are `uint16`.

License: the tokenizer files are Apache-2.0 (like packtool). The text it was trained on is
CPython documentation (docstrings and `pydoc_data.topics`), PSF License.
"""


def shape_samples(out: Path, n: int = 8) -> None:
    """sharegpt.jsonl and alpaca.jsonl: the first chat / prompt-completion rows in those shapes (after the
    tokenizer is trained, so they change nothing else). Alpaca rows take LLaMA-Factory's fields: with and
    without `input`, `system` and `history`."""
    chats = [json.loads(line)["messages"] for line in (out / "chat.jsonl").read_text("utf-8").splitlines()[:n]]
    names = {"system": "system", "user": "human", "assistant": "gpt"}
    sharegpt = []
    for messages in chats:
        system = [m["content"] for m in messages[:1] if m["role"] == "system"]
        turns = [{"from": names[m["role"]], "value": m["content"]} for m in messages[len(system) :]]
        sharegpt.append({**({"system": system[0]} if system else {}), "conversations": turns})
    write_jsonl(out / "sharegpt.jsonl", sharegpt)
    alpaca = []
    for messages in chats:
        system = [m["content"] for m in messages[:1] if m["role"] == "system"]
        turns = messages[len(system) :]  # user, assistant, user, assistant, ...
        pairs = [[u["content"], a["content"]] for u, a in zip(turns[::2], turns[1::2], strict=True)]
        row = {"instruction": pairs[-1][0], "input": "", "output": pairs[-1][1]}
        alpaca.append({**row, **({"system": system[0]} if system else {}), **({"history": pairs[:-1]} if pairs[:-1] else {})})
    for line in (out / "prompt_completion.jsonl").read_text("utf-8").splitlines()[:n]:
        row = json.loads(line)
        alpaca.append({"instruction": "Answer this question about the Python standard library.", "input": row["prompt"],
                       "output": row["completion"]})
    write_jsonl(out / "alpaca.jsonl", alpaca)


REFUSALS = (
    "I am not sure. Please look it up in the documentation.",
    "That is outside what I can answer here.",
    "It depends; try it and see what happens.",
    "I would rather not guess about that.",
)


def preference_samples(out: Path, n: int = 64) -> None:
    """preference.jsonl: TRL conversational preference records with an explicit prompt, from the first `n` chats:
    the prompt is the chat up to its last answer, `chosen` that answer, `rejected` an unhelpful deflection
    (one of four, in turn): a consistent contrast, so a few DPO steps on it raise the reward margin."""
    chats = [json.loads(line)["messages"] for line in (out / "chat.jsonl").read_text("utf-8").splitlines()[:n]]
    rows = []
    for i, messages in enumerate(chats):
        rejected = [{"role": "assistant", "content": REFUSALS[i % len(REFUSALS)]}]
        rows.append({"prompt": messages[:-1], "chosen": [messages[-1]], "rejected": rejected})
    write_jsonl(out / "preference.jsonl", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "data" / "sample")
    args = parser.parse_args()
    out: Path = args.out
    if sys.version_info[:2] != (3, 11):
        print(f"warning: generated with CPython 3.11; this is {sys.version.split()[0]}, docstrings will differ", file=sys.stderr)
    entries = collect_entries()
    rng = np.random.default_rng(SEED)
    (out / "docs").mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "text.jsonl", text_docs(entries, rng))
    write_jsonl(out / "prompt_completion.jsonl", prompt_completion_docs(entries, rng))
    write_jsonl(out / "chat.jsonl", chat_docs(entries, rng))
    for old in (out / "docs").glob("*.txt"):
        old.unlink()
    for name, page in module_pages(entries).items():
        (out / "docs" / f"{name}.txt").write_text(page, encoding="utf-8", newline="\n")
    train_tokenizer(corpus_texts(out), out / "tokenizer")
    (out / "tokenizer" / "README.md").write_text(TOKENIZER_README, encoding="utf-8")
    shape_samples(out)
    preference_samples(out)
    print(f"{len(entries)} docstrings from {len(MODULES)} modules -> {out}")


if __name__ == "__main__":
    main()
