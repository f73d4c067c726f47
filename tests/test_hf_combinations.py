"""Every batch a real collator makes gives each document alone under "packtool", or a refusal by name.

The batch keys transformers hands an attention function (`cu_seq_lens_q/_k`, `max_length_q/_k`,
`position_ids`, `attention_mask`, `seq_idx`, a KV cache) come in the combinations real collators
make: transformers' `DataCollatorWithFlattening` in all 8 settings of its flags, TRL 1.16's
`DataCollatorForLanguageModeling` (padding-free or padded, with and without positions, padded to a
multiple), `PackedCollator` in its modes (flattened or `[B, N]` rows, `keys=HF_KEYS` with and
without positions, `seq_idx`, `pad_to_length`, `static_segments`) and `PaddedCollator`, plus the
hand-built ones a custom collator makes (issue 32: a mask beside `cu_seq_lens`, tail-padded
packed rows, holes in a mask, keys that disagree, offsets that decrease, a batch of padding). Each
runs with and without `use_cache=True` on a windowed (Mistral: window 4 < the documents), a
softcapped (Gemma 2), a sinks (gpt-oss) and a plain (Llama) family, in float64, against each
document alone under eager: logits within 1e-6 x their largest value, or the same `ConfigError`
on every family. A batch with no document key at all is one sequence per row: it must equal eager
on that same batch.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from hf_support import build, documents, trl_collate  # noqa: E402

import packtool.hf  # noqa: E402
from packtool.errors import ConfigError  # noqa: E402
from packtool.loader import HF_KEYS, PackedCollator, PaddedCollator  # noqa: E402

RTOL = 1e-6
FAMILIES = ("llama", "mistral", "gemma2", "gpt_oss")  # plain, windowed, softcapped (+ local layers), sinks (+ local)
WINDOWED = frozenset({"mistral", "gemma2", "gpt_oss"})


@dataclass
class Case:
    batch: dict[str, Any]
    places: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (row, columns) of each document
    refuse: str | None = None  # a ConfigError matching this, on every family
    same_as_eager: bool = False  # no document key: compare with eager on this very batch
    windowed_refuse: str | None = None  # refused where a window bites; elsewhere same_as_eager


def flat_places(docs, order=None) -> list[tuple[int, torch.Tensor]]:
    order = range(len(docs)) if order is None else order
    bounds = np.concatenate([[0], np.cumsum([len(docs[i]) for i in order])])
    return [(0, torch.arange(a, b)) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def row_places(docs, groups, offset: int = 0) -> list[tuple[int, torch.Tensor]]:
    out = []
    for row, group in enumerate(groups):
        at = offset
        for i in group:
            out.append((row, torch.arange(at, at + len(docs[i]))))
            at += len(docs[i])
    return out


def packed_items(docs, groups):
    items = []
    for group in groups:
        parts = [docs[i] for i in group]
        ids = torch.cat(parts)
        items.append({"input_ids": ids, "labels": ids.clone(),
                      "position_ids": torch.cat([torch.arange(len(p)) for p in parts]),
                      "cu_seqlens": torch.tensor(np.concatenate([[0], np.cumsum([len(p) for p in parts])]),
                                                 dtype=torch.int32)})  # fmt: skip
    return items


def drop(batch: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k not in names and k != "labels"}


def cases(docs) -> dict[str, Case]:
    out: dict[str, Case] = {}
    singles, pairs = [[i] for i in range(len(docs))], [[0, 1], [2, 3]]
    features = [{"input_ids": d.tolist()} for d in docs]
    # transformers' DataCollatorWithFlattening, every setting of its three flags
    for pos in (True, False):
        for flash in (True, False):
            for seq in (True, False):
                batch = transformers.DataCollatorWithFlattening(
                    return_position_ids=pos, return_flash_attn_kwargs=flash, return_seq_idx=seq)(features)
                name = f"flattening(position_ids={pos}, flash_attn_kwargs={flash}, seq_idx={seq})"
                out[name] = Case(drop(batch), flat_places(docs), same_as_eager=not (pos or flash or seq))
    # TRL 1.16's DataCollatorForLanguageModeling
    for multiple in (None, 8):
        out[f"trl(padding_free, pad_to_multiple_of={multiple})"] = Case(
            drop(trl_collate(features, padding_free=True, pad_to_multiple_of=multiple)), flat_places(docs))
        for positions in (False, True):
            batch = trl_collate(features, return_position_ids=positions, pad_to_multiple_of=multiple)
            out[f"trl(padded, position_ids={positions}, pad_to_multiple_of={multiple})"] = Case(
                drop(batch), [(i, torch.arange(len(d))) for i, d in enumerate(docs)])
    # PackedCollator
    flat_hf = PackedCollator(flatten=True, keys=HF_KEYS)(packed_items(docs, singles))
    rows_hf = PackedCollator(keys=HF_KEYS)(packed_items(docs, pairs))
    out["PackedCollator(flatten, HF_KEYS)"] = Case(drop(flat_hf), flat_places(docs))
    out["PackedCollator(flatten, HF_KEYS - position_ids)"] = Case(drop(flat_hf, "position_ids"), flat_places(docs))
    out["PackedCollator(rows, HF_KEYS)"] = Case(drop(rows_hf), row_places(docs, pairs))
    out["PackedCollator(rows, HF_KEYS - position_ids)"] = Case(drop(rows_hf, "position_ids"), row_places(docs, pairs))
    out["PackedCollator(rows, input_ids + position_ids)"] = Case(
        drop(rows_hf, "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"), row_places(docs, pairs))
    seq = PackedCollator(flatten=True, keys=(*HF_KEYS, "seq_idx"), seq_idx=True)(packed_items(docs, singles))
    out["PackedCollator(flatten, HF_KEYS + seq_idx)"] = Case(drop(seq), flat_places(docs))
    out["PackedCollator(flatten, input_ids + seq_idx)"] = Case(
        {"input_ids": seq["input_ids"], "seq_idx": seq["seq_idx"]}, flat_places(docs))
    padded_rows = PackedCollator(pad_to_length=20, keys=HF_KEYS)(packed_items(docs, pairs))
    out["PackedCollator(rows, pad_to_length=20, HF_KEYS)"] = Case(drop(padded_rows), row_places(docs, pairs))
    out["PackedCollator(flatten, pad_to_length=40, HF_KEYS)"] = Case(
        drop(PackedCollator(flatten=True, pad_to_length=40, keys=HF_KEYS)(packed_items(docs, singles))),
        flat_places(docs))
    out["PackedCollator(flatten, static_segments=8, HF_KEYS)"] = Case(
        drop(PackedCollator(flatten=True, static_segments=8, keys=HF_KEYS)(packed_items(docs, singles))),
        flat_places(docs))
    out["PackedCollator(flatten) every key"] = Case(
        drop(PackedCollator(flatten=True)(packed_items(docs, singles))),
        refuse=r"PackedCollator's .* keys .* reached the model.*keys=HF_KEYS")
    # PaddedCollator: its own extra keys (lengths, n_target_tokens) come along
    padded = PaddedCollator()([{"input_ids": d, "labels": d} for d in docs])
    out["PaddedCollator"] = Case(drop(padded), [(i, torch.arange(len(d))) for i, d in enumerate(docs)])
    out["PaddedCollator - position_ids"] = Case(drop(padded, "position_ids"),
                                                [(i, torch.arange(len(d))) for i, d in enumerate(docs)])
    empty = PaddedCollator()([{"input_ids": d, "labels": d} for d in [*docs, docs[0][:0]]])
    out["PaddedCollator with an empty document"] = Case(drop(empty),
                                                        [(i, torch.arange(len(d))) for i, d in enumerate(docs)])
    # hand-built: what custom collators make
    ones = {**drop(flat_hf), "attention_mask": torch.ones_like(flat_hf["input_ids"])}
    out["cu_seq_lens + an all-ones mask (32.2)"] = Case(ones, flat_places(docs))
    tail = torch.zeros(2, 20, dtype=torch.long)
    tail[:, :16] = rows_hf["input_ids"]
    mask = torch.zeros_like(tail)
    mask[:, :16] = 1
    for pad_pos in ("zeros", "counting on"):
        pos = torch.zeros_like(tail)
        pos[:, :16] = rows_hf["position_ids"]
        if pad_pos != "zeros":
            pos[:, 16:] = pos[:, 15:16] + torch.arange(1, 5)
        out[f"tail-padded packed rows + mask + restarting positions, padding {pad_pos} (32.3)"] = Case(
            {"input_ids": tail, "attention_mask": mask, "position_ids": pos}, row_places(docs, pairs))
    consistent = {**drop(padded_rows), "attention_mask": (padded_rows["labels"] != -100) | (padded_rows["position_ids"] > 0)}
    consistent["attention_mask"] = consistent["attention_mask"].long()
    consistent["attention_mask"][:, 16:] = 0
    out["cu_seq_lens over padded rows + their padding mask (32.4)"] = Case(consistent, row_places(docs, pairs))
    real_only = {**consistent, "cu_seq_lens_q": rows_hf["cu_seq_lens_q"], "cu_seq_lens_k": rows_hf["cu_seq_lens_k"]}
    out["cu_seq_lens counting only the real tokens of padded rows (32.4)"] = Case(
        real_only, refuse=r"cu_seq_lens_q runs from 0 to 32, the batch holds 2 x 20 = 40 tokens")
    holed = torch.zeros(1, 12, dtype=torch.long)
    holed[0, :5], holed[0, 6:] = docs[2][:5], docs[2][5:11]
    hole_mask = torch.ones_like(holed)
    hole_mask[0, 5] = 0
    out["a hole inside a document on windowed layers (32.5)"] = Case(
        {"input_ids": holed, "attention_mask": hole_mask}, same_as_eager=True,
        windowed_refuse=r"padding inside a document of 12 tokens on a sliding-window layer \(window 4\)")
    disagree = {**drop(flat_hf), "position_ids": torch.arange(16).repeat(2)[None]}  # restarting at 16 only
    out["cu_seq_lens and position_ids that disagree (32.6)"] = Case(
        disagree, refuse=r"position_ids and cu_seq_lens_q disagree: position_ids does not start a document at row 0, "
                         r"token 9")  # fmt: skip
    out["cu_seq_lens and seq_idx that disagree"] = Case(
        {**drop(flat_hf), "seq_idx": torch.zeros_like(flat_hf["input_ids"], dtype=torch.int32)},
        refuse=r"seq_idx and cu_seq_lens_q disagree")
    down = {**drop(flat_hf), "cu_seq_lens_q": torch.tensor([0, 9, 7, 27, 32], dtype=torch.int32)}
    down["cu_seq_lens_k"] = down["cu_seq_lens_q"]
    out["decreasing cu_seq_lens (32.17)"] = Case(
        down, refuse=r"cu_seq_lens_q decreases at entry 2 \(9 -> 7\) in the batch passed to the model")
    out["cu_seq_lens_k other than cu_seq_lens_q"] = Case(
        {**drop(flat_hf), "cu_seq_lens_k": torch.tensor([0, 16, 32], dtype=torch.int32)},
        refuse=r"cu_seq_lens_k differ from cu_seq_lens_q")
    out["max_length below the longest document"] = Case(
        {**drop(flat_hf), "max_length_q": 5, "max_length_k": 5}, refuse=r"max_length_q=5 is below the longest")
    across = {**drop(rows_hf, "position_ids"), "cu_seq_lens_q": torch.tensor([0, 9, 20, 27, 32], dtype=torch.int32)}
    across["cu_seq_lens_k"] = across["cu_seq_lens_q"]
    out["cu_seq_lens with a document across rows"] = Case(across, refuse=r"put a document across rows 0 and 1")
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    name = request.param
    model = build(name)
    docs = documents()
    with torch.no_grad():
        ref = [model(input_ids=d[None]).logits[0] for d in docs]
    return name, model, docs, ref


def test_every_collator_combination_gives_each_document_alone_or_a_named_refusal(family) -> None:
    assert_every_combination(*family)


@pytest.mark.parametrize("name", ["gemma3", "qwen2", "cohere2", "olmo3", "deepseek_v3"])
def test_every_collator_combination_on_more_windowed_families_and_mla(name) -> None:
    """The same sweep on Gemma 3 (its own mask functions), Qwen2 (max_window_layers), Cohere2, OLMo 3 (windows
    of 4 on local layers) and DeepSeek-V3 (MLA: values narrower than queries)."""
    model = build(name)
    docs = documents()
    with torch.no_grad():
        ref = [model(input_ids=d[None]).logits[0] for d in docs]
    assert_every_combination(name, model, docs, ref, windowed=name != "deepseek_v3")


def assert_every_combination(name, model, docs, ref, windowed: bool | None = None) -> None:
    windowed = name in WINDOWED if windowed is None else windowed
    scale = max(float(r.abs().max()) for r in ref)
    failures = []
    for label, case in cases(docs).items():
        refuse = case.windowed_refuse if windowed and case.windowed_refuse else case.refuse
        # a cache changes what transformers builds only without a mask (it then skips finding packed documents)
        for use_cache in (False,) if "attention_mask" in case.batch else (False, True):
            model.set_attn_implementation("packtool")
            try:
                with torch.no_grad():
                    got = model(**case.batch, use_cache=use_cache).logits
            except ConfigError as exc:
                if refuse is None or not re.search(refuse, str(exc)):
                    failures.append(f"{label} use_cache={use_cache}: refused: {exc}")
                continue
            if refuse is not None:
                failures.append(f"{label} use_cache={use_cache}: ran, expected a refusal /{refuse}/")
                continue
            if case.same_as_eager:
                model.set_attn_implementation("eager")
                with torch.no_grad():
                    want = model(**case.batch, use_cache=use_cache).logits
                keep = case.batch.get("attention_mask", torch.ones_like(case.batch["input_ids"])).bool()
                worst = float((got - want)[keep].abs().max())
            else:
                worst = max(float((got[row, cols] - r).abs().max()) for (row, cols), r in zip(case.places, ref,
                                                                                              strict=True))
            if not worst <= RTOL * scale:
                failures.append(f"{label} use_cache={use_cache}: differs by {worst:.2e}")
    model.set_attn_implementation("packtool")
    assert not failures, f"{name}:\n" + "\n".join(failures)


def test_a_batch_of_padding_runs_alike_on_every_family() -> None:
    """32.18: no real token anywhere: attention gives padding 0 (as flash-attention does) on every family."""
    for name in FAMILIES:
        model = build(name, attn="packtool")
        ids = torch.zeros(2, 6, dtype=torch.long)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=torch.zeros_like(ids)).logits
        assert out.shape == (2, 6, 96) and bool(torch.isfinite(out).all()), name


@pytest.mark.interop
def test_trl_collate_is_trl_s(monkeypatch) -> None:
    trl = pytest.importorskip("trl.trainer.sft_trainer")
    features = [{"input_ids": d.tolist()} for d in documents()]
    for kwargs in ({"padding_free": True}, {"padding_free": True, "pad_to_multiple_of": 8},
                   {"return_position_ids": True, "pad_to_multiple_of": 8}, {}):  # fmt: skip
        theirs = trl.DataCollatorForLanguageModeling(pad_token_id=0, **kwargs)(features)
        ours = trl_collate(features, **kwargs)
        assert theirs.keys() == ours.keys()
        for key, value in theirs.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ours[key])), key


def test_output_attentions_warns_as_sdpa_does(caplog) -> None:
    """32.9: attentions cannot come back from a varlen kernel: said once, as transformers' sdpa and flash say it."""
    packtool.hf.attention._warn_no_weights.cache_clear()
    model = build("llama", attn="packtool")
    with caplog.at_level(logging.WARNING, logger="packtool.hf.attention"):
        out = model(input_ids=documents()[0][None], output_attentions=True)
    assert "does not return attention weights" in caplog.text and "attn_implementation='eager'" in caplog.text
    assert not out.attentions


def test_register_refuses_names_transformers_reads_otherwise() -> None:
    """32.12: transformers takes any name holding "flash" for flash-attention (`"flash" in name`), an `org/repo`
    name for a hub kernel, and keeps its own names: refused in one line, before transformers sees them."""
    for name, why in (("packtool_flash", "holds 'flash'"), ("flash", "holds 'flash'"), ("me/kernel", "hub kernel"),
                      ("paged|packtool", "paged"), ("sdpa", "transformers' own"), ("", "non-empty")):  # fmt: skip
        with pytest.raises(ConfigError, match=rf"attention name .*{re.escape(why)}.*packtool.hf.register, pick another"):
            packtool.hf.register(name, "fallback")
    assert packtool.hf.register("packtool_fallback_test", "fallback") == "packtool_fallback_test"
    assert packtool.hf.register() == "packtool"  # registering its own name again is fine
    assert "packtool_flash" not in transformers.AttentionInterface._global_mapping


def test_a_hand_built_decreasing_cu_seqlens_names_the_batch_not_a_store() -> None:
    """32.17: the varlen kernels' own check (a caller's offsets) says how to build them, not `packtool verify`."""
    from packtool.attention import varlen_attention
    from packtool.errors import FormatError
    from packtool.loader import validate_cu_seqlens

    cu = torch.tensor([0, 9, 7, 32], dtype=torch.int32)
    for call in (lambda: validate_cu_seqlens(cu, 32, 32),
                 lambda: varlen_attention(*(torch.zeros(32, 2, 4),) * 3, cu, 32)):  # fmt: skip
        with pytest.raises(FormatError, match=r"decreases at entry 2 \(9 -> 7\).*build the offsets with PackedCollator") as e:
            call()
        assert "packtool verify" not in str(e.value)


COMPILE = """
import torch, packtool.hf
from hf_support import build, documents
model = build("llama", attn="packtool")
docs = documents()
ids = torch.cat(docs)[None]
pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
with torch.no_grad():
    compiled = torch.compile(model, backend="eager")(input_ids=ids, position_ids=pos).logits
    eager = model(input_ids=ids, position_ids=pos).logits
    alone = [model(input_ids=d[None]).logits[0] for d in docs]
assert torch.equal(compiled, eager), float((compiled - eager).abs().max())
assert torch.allclose(torch.cat(alone), compiled[0], rtol=0, atol=1e-9)
print("exact")
"""


@pytest.mark.slow  # a fresh interpreter and dynamo's tracing: ~15-40 s on 2 shared cores
def test_torch_compile_before_any_eager_forward_is_exact() -> None:
    """32.11: `torch.compile(model)` in a fresh process (no eager "packtool" forward before it, so numba's
    offsets check was never compiled) runs, and gives the eager forward's logits: dynamo never traces packtool's
    host-side reading of the batch. backend="eager" traces with dynamo (what failed) without inductor's codegen."""
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "NUMBA_DISABLE_CACHING": "1"}  # numba compiles in the process, as on a fresh install
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and "exact" in run.stdout, run.stderr[-3000:]


def test_a_static_cache_without_a_mask_equals_eager() -> None:
    """A static cache filled by `model(input_ids, past_key_values=StaticCache(...))` with no attention_mask: the
    mask function marks the slots written, wider than the queries. Those are a prefill (the queries are the first
    keys), then one token after them; the empty slots are neither keys nor the queries' place (llama and gpt-oss
    read the prefill's queries from the empty slots before)."""
    doc = documents()[2][None]
    for name in ("llama", "mistral", "gpt_oss"):
        got = {}
        for attn in ("eager", "packtool"):
            model = build(name, attn)
            cache = transformers.StaticCache(config=model.config, max_cache_len=24)
            with torch.no_grad():
                first = model(input_ids=doc, past_key_values=cache, use_cache=True).logits
                then = model(input_ids=doc[:, :1], past_key_values=cache, use_cache=True).logits
            got[attn] = (first, then)
        for want, have in zip(got["eager"], got["packtool"], strict=True):
            torch.testing.assert_close(have, want, rtol=0, atol=RTOL * float(want.abs().max()))


def test_a_batch_refilled_in_place_is_read_again() -> None:
    """The reading is kept on the batch's tensors for the forward's other layers; a training loop that refills the
    same buffers in place (static shapes, CUDA graphs) gives another batch, read again: each document alone."""
    model = build("llama", attn="packtool")  # no mask: the reading is kept on cu_seq_lens_q
    docs = documents()
    joined = [torch.cat(docs[:2]), torch.cat(docs[2:])]  # the same tokens as two documents of 16
    first = PackedCollator(flatten=True, keys=HF_KEYS)(packed_items(docs, [[i] for i in range(4)]))
    second = PackedCollator(flatten=True, keys=HF_KEYS)(packed_items(joined, [[0], [1]]))
    batch = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in drop(first).items()}
    batch["cu_seq_lens_k"] = batch["cu_seq_lens_q"]
    batch["max_length_q"] = batch["max_length_k"] = 16  # static: the row's longest possible document
    with torch.no_grad():
        model(**batch)
        cu = torch.zeros_like(batch["cu_seq_lens_q"])  # the same 5 slots: [0, 16, 32, 32, 32]
        cu[1:3] = second["cu_seq_lens_q"][1:]
        cu[3:] = 32
        batch["cu_seq_lens_q"].copy_(cu)
        batch["position_ids"].copy_(second["position_ids"])
        got = model(**batch).logits[0]
        want = torch.cat([model(input_ids=d[None]).logits[0] for d in joined])
    torch.testing.assert_close(got, want, rtol=0, atol=RTOL * float(want.abs().max()))
