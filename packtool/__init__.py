"""packtool: offline tokenization and whole-dataset bin packing of LLM training data."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "pack_lengths"]


def __getattr__(name: str) -> object:
    """Lazy public names, so `import packtool` (e.g. from the loader) does not pull in numba."""
    if name == "pack_lengths":
        from packtool.packing import pack_lengths

        return pack_lengths
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")
