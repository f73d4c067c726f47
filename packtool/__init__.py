"""packtool: offline tokenization and whole-dataset bin packing of LLM training data."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["TokenizeConfig", "__version__", "pack_lengths", "tokenize_corpus"]


def __getattr__(name: str) -> object:
    """Lazy public names, so `import packtool` (e.g. from the loader) does not pull in numba."""
    if name == "pack_lengths":
        from packtool.packing import pack_lengths

        return pack_lengths
    if name in ("tokenize_corpus", "TokenizeConfig"):
        from packtool import tokenization

        return getattr(tokenization, name)
    raise AttributeError(f"module 'packtool' has no attribute {name!r}")
