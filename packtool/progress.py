"""The one progress callback type: the library reports, the CLI draws (tqdm lives in `packtool.cli`)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int, int], None]
"""Called as `progress(done, total)` after each unit of work (bytes, packs or tokens; the stage says which)."""
