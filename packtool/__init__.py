"""packtool: offline tokenization and whole-dataset bin packing of LLM training data.

The public library API: every CLI command is one of these calls first. Names resolve lazily, so
`import packtool` (e.g. from the torch-side loader) pulls in neither numba nor tokenizers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> module that defines it
_PUBLIC = {
    "pack_lengths": "packtool.core.packing",
    "TokenizeConfig": "packtool.stages.tokenize",
    "tokenize_corpus": "packtool.stages.tokenize",
    "merge_shards": "packtool.stages.merge",
    "PackConfig": "packtool.stages.pack",
    "pack_store": "packtool.stages.pack",
    "StatsConfig": "packtool.stages.stats",
    "compute_stats": "packtool.stages.stats",
    "plot_stats": "packtool.stages.stats",
    "VerifyConfig": "packtool.stages.verify",
    "verify_path": "packtool.stages.verify",
    "ExportConfig": "packtool.stages.export",
    "export_store": "packtool.stages.export",
    "run_pipeline": "packtool.stages.run",
    "CostModel": "packtool.core.cost",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'packtool' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
