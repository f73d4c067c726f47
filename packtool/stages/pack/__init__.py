"""The pack stage: a token store bin-packed into a pack store (`packtool pack`)."""

from __future__ import annotations

from packtool.stages.pack.config import PackConfig
from packtool.stages.pack.stage import PackResult, pack_store

__all__ = ["PackConfig", "PackResult", "pack_store"]
