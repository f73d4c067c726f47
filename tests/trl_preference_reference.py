"""Preference records of every shape and TRL 1.16 `DPOTrainer._prepare_dataset` written out step by step
(`trl_reference`), shared by tests/test_preference_tokenize.py (transformers only) and
tests/interop/test_trl_preference.py (which checks `trl_reference` against TRL's own code too).

`trl_reference` follows trl/trainer/dpo_trainer.py `_prepare_dataset` and trl/data_utils.py literally: the
prompt extracted from every record when the FIRST one has no `prompt` (`extract_prompt`), the EOS text
appended to the completions when the first is not conversational, then per record the prompt tokenized
(`apply_chat_template(prompt, tools=, add_generation_prompt=True)` or `tokenizer(prompt)`), prompt+chosen and
prompt+rejected tokenized whole, and the cut at the shorter common prefix of the prompt with the two.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_chat_templates import build_tokenizer, fixture
from tokenizers import Tokenizer, processors

FAMILIES = ["qwen2_5", "llama3_1"]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def U(text: str) -> dict[str, Any]:  # noqa: N802
    return {"role": "user", "content": text}


def A(text: str) -> dict[str, Any]:  # noqa: N802
    return {"role": "assistant", "content": text}


#: one file per shape: (shape name packtool must find, records)
SHAPES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "standard": ("preference", [
        {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
        {"prompt": "Q: 2+2? A: ", "chosen": "4", "rejected": "five"},  # the prompt's last space merges into " 4"
        {"prompt": "Привет, как", "chosen": " дела?", "rejected": ""},  # an empty completion: EOS only
        {"prompt": "東京の天気は", "chosen": "晴れです。", "rejected": "晴れです。"},  # identical completions
        {"prompt": "Tools are ignored here", "chosen": " ok", "rejected": " no", "tools": json.dumps(TOOLS)},
    ]),
    "standard_implicit": ("preference-implicit", [
        {"chosen": "The sky is blue.", "rejected": "The sky is green."},
        {"chosen": "Answer: yes", "rejected": "Answer: no"},  # the space before the cut goes to the completions
        {"chosen": "Same text", "rejected": "Same text"},  # identical: the prompt is all but the last character
        {"chosen": "prefix", "rejected": "prefix and more"},  # one is a prefix of the other
    ]),
    "conversational": ("conversational-preference", [
        {"prompt": [U("USR What color is the sky?")], "chosen": [A("Blue.")], "rejected": [A("Green.")]},
        {"prompt": [{"role": "system", "content": "Be brief."}, U("USR one"), A("Uno."), U("USR two")],
         "chosen": [A("Dos.")], "rejected": [A("Zwei.")]},
        {"prompt": [U("USR Weather in Paris?")], "chosen": [A("It is 21 °C.")], "rejected": [A("No idea.")],
         "tools": TOOLS},
        {"prompt": [U("USR 東京は？")], "chosen": [A("")], "rejected": [A("晴れ。"), U("USR more"), A("Sunny.")]},
    ]),
    "conversational_implicit": ("conversational-preference-implicit", [
        {"chosen": [U("USR What color?"), A("Blue.")], "rejected": [U("USR What color?"), A("Green.")]},
        {"chosen": [{"role": "system", "content": "Terse."}, U("USR hi"), A("Hello."), U("USR bye"), A("Bye.")],
         "rejected": [{"role": "system", "content": "Terse."}, U("USR hi"), A("Hello."), U("USR bye"), A("No.")]},
        {"chosen": [U("USR same"), A("Same.")], "rejected": [U("USR same"), A("Same.")]},  # identical
    ]),
    "ranking_sharegpt": ("ranking-sharegpt", [
        {"conversations": [{"from": "human", "value": "USR Hi?"}], "chosen": {"from": "gpt", "value": "Hello."},
         "rejected": {"from": "gpt", "value": "Go away."}},
        {"conversations": [{"from": "system", "value": "Be kind."}, {"from": "human", "value": "USR one"},
                           {"from": "gpt", "value": "Uno."}, {"from": "human", "value": "USR two"}],
         "chosen": {"from": "gpt", "value": "Dos."}, "rejected": {"from": "gpt", "value": "Three."}},
        {"conversations": [{"from": "human", "value": "USR weather?"}], "system": "You check weather.",
         "tools": json.dumps(TOOLS), "chosen": {"from": "gpt", "value": "21 °C."},
         "rejected": {"from": "gpt", "value": "Cold."}},
    ]),
    "ranking_alpaca": ("ranking-alpaca", [
        {"instruction": "USR Say hi", "input": "", "chosen": "Hi!", "rejected": "No."},
        {"instruction": "USR Translate", "input": "bonjour", "chosen": "hello", "rejected": "goodbye",
         "system": "You translate.", "history": [["USR first", "ok"]]},
    ]),
}


def as_trl(shape: str, record: dict[str, Any]) -> dict[str, Any]:
    """A record as TRL reads it: LLaMA-Factory's ranking records converted as docs/CHAT.md says."""
    if shape == "ranking_sharegpt":
        roles = {"human": "user", "gpt": "assistant", "system": "system"}
        turns = [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]]
        if turns[0]["role"] != "system" and record.get("system"):
            turns.insert(0, {"role": "system", "content": record["system"]})
        out: dict[str, Any] = {"prompt": turns, "chosen": [A(record["chosen"]["value"])],
                               "rejected": [A(record["rejected"]["value"])]}
        return {**out, **({"tools": record["tools"]} if "tools" in record else {})}
    if shape == "ranking_alpaca":
        prompt = [{"role": "system", "content": record["system"]}] if record.get("system") else []
        for user, assistant in record.get("history", []):
            prompt += [U(user), A(assistant)]
        prompt.append(U("\n".join(p for p in (record["instruction"], record.get("input")) if p)))
        return {"prompt": prompt, "chosen": [A(record["chosen"])], "rejected": [A(record["rejected"])]}
    return record


def build_tokenizers(root: Path, families: list[str] = FAMILIES) -> dict[str, Path]:
    """Tiny byte-level BPEs with the families' real templates; Llama's post-processor adds BOS, as Llama 3's does
    (standard records get it from the tokenizer, conversational ones from the template's text)."""
    out = {}
    for family in families:
        spec = fixture(family)
        directory = build_tokenizer(root / family, spec)
        if spec["bos_token"]:
            tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
            bos = spec["bos_token"]
            tok.post_processor = processors.Sequence([
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                              special_tokens=[(bos, tok.token_to_id(bos))]),
            ])
            tok.save(str(directory / "tokenizer.json"))
        out[family] = directory
    return out


def hf_tokenizer(tok_dir: Path, family: str) -> Any:
    import transformers

    spec = fixture(family)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(tok_dir / "tokenizer.json")), chat_template=spec["chat_template"],
        **{k: spec[k] for k in ("bos_token", "eos_token") if spec[k]})


# ---- TRL 1.16, step by step (trl/data_utils.py, trl/trainer/dpo_trainer.py) ----

def is_conversational(example: dict[str, Any]) -> bool:
    keys = [k for k in ("prompt", "chosen", "rejected") if k in example]
    value = example[keys[0]] if keys else None
    return isinstance(value, list) and isinstance(value[0], dict) and "role" in value[0]


def extract_prompt(example: dict[str, Any]) -> dict[str, Any]:
    for idx in range(min(len(example["chosen"]), len(example["rejected"]))):
        if example["chosen"][idx] != example["rejected"][idx]:
            if example["chosen"][idx - 1] == " ":
                idx -= 1
            break
    return {"prompt": example["chosen"][:idx], "chosen": example["chosen"][idx:], "rejected": example["rejected"][idx:]}


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def trl_reference(hf: Any, records: list[dict[str, Any]]) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt_ids, chosen_ids, rejected_ids) of each record, as `_prepare_dataset` leaves them."""
    if "prompt" not in records[0]:
        records = [{**r, **extract_prompt(r)} for r in records]
    if not is_conversational(records[0]):
        eos = hf.eos_token
        records = [{**r, "chosen": r["chosen"] if r["chosen"].endswith(eos) else r["chosen"] + eos,
                    "rejected": r["rejected"] if r["rejected"].endswith(eos) else r["rejected"] + eos}
                   for r in records]
    out = []
    for r in records:
        tools = r.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        if is_conversational(r):
            def ids(messages: list[dict[str, Any]], **kw: Any) -> list[int]:
                got = hf.apply_chat_template(messages, tokenize=True, return_dict=True, tools=tools, **kw)  # noqa: B023
                return list(got["input_ids"])
            prompt = ids(r["prompt"], add_generation_prompt=True)
            chosen, rejected = ids(r["prompt"] + r["chosen"]), ids(r["prompt"] + r["rejected"])
        else:
            prompt = list(hf(text=r["prompt"])["input_ids"])
            chosen = list(hf(text=r["prompt"] + r["chosen"])["input_ids"])
            rejected = list(hf(text=r["prompt"] + r["rejected"])["input_ids"])
        cut = min(common_prefix_length(prompt, chosen), common_prefix_length(prompt, rejected))
        out.append((prompt[:cut], chosen[cut:], rejected[cut:]))
    return out


def sequences(reference: list[tuple[list[int], list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """(ids, completion mask) of every sequence, chosen then rejected per pair, as DataCollatorForPreference
    concatenates them."""
    out = []
    for prompt, chosen, rejected in reference:
        for completion in (chosen, rejected):
            out.append((prompt + completion, [0] * len(prompt) + [1] * len(completion)))
    return out


# ---- what `datasets.Dataset.from_list` gives TRL: every object of a kind in a column holds every key of any ----

TIME = {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}


def _parts(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}


EPHEMERAL = {"type": "ephemeral"}
#: (records as written, the same records as TRL reads them): content parts with mixed keys, under a template that
#: prints a content list (Llama 3.1's); every record's parts hold the same keys, so the file's union is each one's
MIXED_PARTS = (
    [{"prompt": [_parts({"type": "text", "text": "USR What is"}, {"type": "text", "text": " this?", "cache_control": EPHEMERAL})],
      "chosen": [A("A cat.")], "rejected": [A("A dog.")]},
     {"prompt": [_parts({"type": "text", "text": "USR hi", "cache_control": EPHEMERAL}, {"type": "text", "text": "USR again"})],
      "chosen": [A("Hello.")], "rejected": [A("Go.")]}],
    [{"prompt": [_parts({"type": "text", "text": "USR What is", "cache_control": None},
                        {"type": "text", "text": " this?", "cache_control": EPHEMERAL})],
      "chosen": [A("A cat.")], "rejected": [A("A dog.")]},
     {"prompt": [_parts({"type": "text", "text": "USR hi", "cache_control": EPHEMERAL},
                        {"type": "text", "text": "USR again", "cache_control": None})],
      "chosen": [A("Hello.")], "rejected": [A("Go.")]}],
)
#: the tools of LIST_TOOLS as TRL reads them: each tool's properties hold the other's, None
LIST_TOOLS_READ = [
    {**TOOLS[0], "function": {**TOOLS[0]["function"], "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "tz": None}}}},
    {**TIME, "function": {**TIME["function"], "parameters": {
        "type": "object", "properties": {"city": None, "tz": {"type": "string"}}}}},
]
#: the same for a list of `tools` (not a JSON string) and tool calls whose arguments differ, under Qwen2.5's template
#: (it prints both with `tojson`): each tool's properties and each call's arguments hold every name of any, and an
#: integer beside a float is a float (`1.0`), as Arrow reads them
LIST_TOOLS = (
    [{"prompt": [U("USR weather and time?"), _call("get_weather", {"city": "Paris", "days": 2.5}),
                 {"role": "tool", "content": "21"}, _call("get_time", {"tz": "UTC", "days": 1}),
                 {"role": "tool", "content": "noon"}, U("USR so?")],
      "chosen": [A("Nice.")], "rejected": [A("Bad.")], "tools": [*TOOLS, TIME]},
     {"prompt": [U("USR hi")], "chosen": [A("Hello.")], "rejected": [A("Go.")], "tools": [*TOOLS, TIME]}],
    [{"prompt": [U("USR weather and time?"), _call("get_weather", {"city": "Paris", "days": 2.5, "tz": None}),
                 {"role": "tool", "content": "21"}, _call("get_time", {"city": None, "days": 1.0, "tz": "UTC"}),
                 {"role": "tool", "content": "noon"}, U("USR so?")],
      "chosen": [A("Nice.")], "rejected": [A("Bad.")], "tools": LIST_TOOLS_READ},
     {"prompt": [U("USR hi")], "chosen": [A("Hello.")], "rejected": [A("Go.")], "tools": LIST_TOOLS_READ}],
)
