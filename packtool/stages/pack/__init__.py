"""The pack stage: a token store bin-packed into a pack store (`packtool pack`)."""

from __future__ import annotations

from packtool.stages.pack.config import PackConfig, mixture_args, parse_store_spec
from packtool.stages.pack.stage import PackResult, pack_store

__all__ = ["PackConfig", "PackResult", "mixture_args", "pack_store", "parse_store_spec"]
