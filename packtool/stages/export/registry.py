"""The export registry: `--to` target -> `Exporter`, the one list of trainer formats.

Adding a trainer = its module (building `EXPORTER`), its member in `choices.ExportTarget` (the CLI
choices, importable without this stage), one line in `_MODULES`, its names in `formats.exports`,
and docs/EXPORT.md. `tests/test_export.py` fails when the registry and the enum disagree.
"""

from __future__ import annotations

from packtool.choices import ExportTarget
from packtool.errors import UsageError
from packtool.stages.export import megatron_bridge, nemo, olmo_core, trl
from packtool.stages.export.config import Exporter

_MODULES = (megatron_bridge, nemo, trl, olmo_core)

EXPORTERS: dict[ExportTarget, Exporter] = {m.EXPORTER.target: m.EXPORTER for m in _MODULES}


def exporter(target: ExportTarget | str) -> Exporter:
    """The exporter of `target`, or a UsageError listing the registered ones."""
    found = next((e for t, e in EXPORTERS.items() if t.value == str(target)), None)
    if found is None:
        raise UsageError(
            f"unknown export target {str(target)!r}, --to, use one of {', '.join(t.value for t in EXPORTERS)}"
        )
    return found
