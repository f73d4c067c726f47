"""The record type's old home, kept for the record shapes' modules (`config.py`, `settings.py`, `records.py`,
`shape.py`) that import it from here: it now lives in `packtool.stages.tokenize.inputs.record`. At the
merge their imports move there and this module goes.
"""

from __future__ import annotations

from packtool.stages.tokenize.inputs.record import DEFAULT_MAX_RECORD_BYTES, PlainText

__all__ = ["DEFAULT_MAX_RECORD_BYTES", "PlainText"]
