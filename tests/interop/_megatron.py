"""Import Megatron-Bridge 0.6.2's packed SFT datasets on a CPU machine without its model zoo.

`megatron.bridge.__init__` and `megatron.bridge.data.__init__` import every model (and Transformer
Engine): they are registered as bare packages so that only `data.packing.gpt_sft` / `.parquet` and
what they import load. megatron-core 0.19.2 ships a cp312 wheel only; `make interop` installs it with
`--no-deps --target .venv-interop/megatron-core` (its compiled helper is not used by these modules).
Python 3.11 lacks `typing.override` (3.12), and the MoE paged-stash ops need triton: both shimmed.
"""

from __future__ import annotations

import sys
import sysconfig
import types
import typing
from pathlib import Path


def import_megatron_bridge_packing() -> tuple[type, type]:
    """(GPTSFTPackedParquetDataset, GPTSFTPackedDataset) from the installed megatron-bridge."""
    site = Path(sysconfig.get_paths()["purelib"])
    side = Path(sys.prefix) / "megatron-core"
    if not (site / "megatron" / "bridge").is_dir() or not side.is_dir():
        raise ImportError("megatron-bridge / megatron-core are not installed here (run `make interop`)")
    if str(side) not in sys.path:
        sys.path.append(str(side))
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # type: ignore[attr-defined]
    for name in ("megatron.bridge", "megatron.bridge.data"):
        if name not in sys.modules:
            mod = types.ModuleType(name)
            mod.__path__ = [str(site / name.replace(".", "/"))]
            sys.modules[name] = mod
    try:
        import triton  # noqa: F401
    except ImportError:
        stub = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
        stub.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]
        stub.paged_stash_copy_kernel = stub.paged_stash_pop_kernel = None  # type: ignore[attr-defined]
        sys.modules[stub.__name__] = stub
    from megatron.bridge.data.packing.gpt_sft import GPTSFTPackedDataset
    from megatron.bridge.data.packing.parquet import GPTSFTPackedParquetDataset

    return GPTSFTPackedParquetDataset, GPTSFTPackedDataset


class EosTokenizer:
    """What the packed datasets use of a MegatronTokenizer: `eos_id` (collate pads and masks with it)."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id
        self.eod = eos_id


def dataset_kwargs(size: int) -> dict:
    """The keyword arguments `megatron.bridge.data.builders.gpt_sft.build_gpt_sft_split` passes (0.6.2 defaults)."""
    return {
        "max_seq_length": size,
        "memmap_workers": 1,
        "hf_dataset": False,
        "global_sample_mapping": False,
        "add_bos": False,
        "add_eos": True,
        "add_sep": False,
        "seed": 1234,
        "label_key": "output",
        "answer_only_loss": True,
        "truncation_field": "input",
        "pad_to_max_length": False,
        "index_mapping_dir": None,
        "prompt_template": "{input} {output}",
        "truncation_method": "right",
        "get_attention_mask_from_fusion": True,
        "prompt_completion_config": None,
        "is_test": False,
    }
