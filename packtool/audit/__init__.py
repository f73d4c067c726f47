"""`packtool audit MODEL`: does packing keep documents apart in THIS architecture? (needs torch + transformers)

Torch side, imported only when the audit runs: the CLI imports nothing of it at start-up, and the
names below resolve lazily, so `packtool.audit.source` can name the missing extra before torch loads.
"""

from __future__ import annotations

import importlib

_PUBLIC = {
    "AuditConfig": "packtool.audit.audit",
    "AuditReport": "packtool.audit.audit",
    "audit_model": "packtool.audit.audit",
    "Measurement": "packtool.audit.probe",
    "STYLES": "packtool.audit.probe",
}

__all__ = list(_PUBLIC)


def __getattr__(name: str) -> object:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'packtool.audit' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
