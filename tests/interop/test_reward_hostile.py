"""Issue 39, a hostile pass on PackedRewardTrainer against TRL 1.16's RewardTrainer (helpers: test_trl_reward.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.interop

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from tests.interop.test_trl_reward import compare, config, model, trl_run  # noqa: E402


def test_a_pad_multiple_pack_store_equals_trl(tmp_path: Path) -> None:
    """`pack --pad-multiple 8`: each segment ends with padding (whose id is not the model's pad id here); the
    rewards are read at each sequence's last real token and num_tokens leaves the padding out, as TRL's run."""
    import numpy as np

    from packtool.hf.dpo import packs_dataset
    from packtool.hf.reward import PackedRewardTrainer, with_margins
    from packtool.stages.pack import PackConfig, pack_store
    from tests.preference_support import write_pref_store

    tok, rows, want, prepared = trl_run(tmp_path, "llama", pad=True)
    store = write_pref_store(tmp_path / "store", [tuple(np.asarray(x, np.int64) for x in p) for p in prepared],
                             vocab=64)  # fmt: skip
    pack_store(PackConfig(store, 64, tmp_path / "packs", pad_multiple=8, overlong="drop"))
    packs = with_margins(packs_dataset(tmp_path / "packs", size=64), [r["margin"] for r in rows])
    m = model("llama")
    m.set_attn_implementation("packtool")
    got = PackedRewardTrainer(model=m, args=config(tmp_path / "got", len(packs)), train_dataset=packs,
                              processing_class=tok)  # fmt: skip
    inputs = next(iter(got.get_train_dataloader()))
    assert bool((inputs["cu_seqlens"] != inputs["cu_seqlens_unpadded"]).any())  # padding is there
    compare(want, got, next(iter(want.get_train_dataloader())), inputs)
