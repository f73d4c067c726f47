"""The token store manifest's keys that describe the run (the writer adds dtype, counts and file hashes):
the tokenizer, BOS/EOS policy, record shape and fields, template, per-source counts, rejects by reason,
the `preference` key of a preference store (its pairs), backend and build id. A run that tokenized no document is an error here, before anything is committed.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from packtool import __version__
from packtool.errors import InputError
from packtool.formats.token_store import preference_key
from packtool.stages.tokenize.config import TokenizeConfig
from packtool.stages.tokenize.engine.tokenizer import TokenizerInfo
from packtool.stages.tokenize.inputs.chunk import Chunk
from packtool.stages.tokenize.inputs.plan import SourceFile
from packtool.stages.tokenize.journal import ChunkResult
from packtool.stages.tokenize.settings import ChunkSettings
from packtool.stages.tokenize.shape import Shape

log = logging.getLogger(__name__)


def token_manifest(
    chunks: list[Chunk],
    results: dict[int, ChunkResult],
    sources: list[SourceFile],
    digests: dict[str, str],
    settings: ChunkSettings,
    info: TokenizerInfo,
    config: TokenizeConfig,
    build: str,
    backend: dict[str, Any],
    shape: Shape,
) -> dict[str, Any]:
    """The manifest's keys that the writer does not fill in; InputError when nothing was tokenized."""
    counts = {s.path: [0, 0, 0] for s in sources}
    reasons: dict[str, int] = {}
    for chunk in chunks:
        for kind, n in results[chunk.index].reasons.items():
            reasons[kind] = reasons.get(kind, 0) + n
        for path, (records, documents, rejected) in results[chunk.index].sources.items():
            got = counts[path]
            got[0], got[1], got[2] = got[0] + records, got[1] + documents, got[2] + rejected
    if not any(c[1] for c in counts.values()) and config.num_shards == 1:  # a shard may be empty
        records = sum(c[0] for c in counts.values())
        raise InputError(
            f"no documents to tokenize ({len(sources)} input files, {records} records, "
            f"{sum(c[2] for c in counts.values())} rejected)",
            ", ".join(s.path for s in sources[:3]),
            hint="check the inputs and --field / --format",
        )
    own = dict(shape.sources)  # per file, when --format auto found several shapes
    for path, (records, _, _) in counts.items():
        if records == 0 and config.num_shards == 1:  # a shard reads only part of the inputs
            log.warning("input %s holds no records", path)
    return {
        "packtool_version": __version__,
        "tokenizer": info.manifest(),
        **settings.policy.manifest,
        "input_format": settings.format,
        "input_shape": {
            "name": shape.name,
            "detected": shape.detected,
            **({"shapes": list(dict.fromkeys(one.name for one in shape.all()))} if shape.sources else {}),
        },
        "fields": shape.manifest_fields(config, settings.role_map),
        "chat_template_sha256": hashlib.sha256(settings.chat_template.encode()).hexdigest()
        if settings.chat_template
        else None,
        "sources": [
            {
                "path": s.path,
                "sha256": digests[s.path],
                "records": counts[s.path][0],
                "documents": counts[s.path][1],
                "rejected": counts[s.path][2],
                **(
                    {
                        "input_format": own[s.path].format.value,
                        "input_shape": own[s.path].name,
                        "fields": own[s.path].manifest_fields(config, settings.role_map),
                    }
                    if s.path in own
                    else {}
                ),
            }
            for s in sources
        ],
        **({"preference": preference_key(sum(c[1] for c in counts.values()))} if shape.spec.pairs else {}),
        "n_rejected": sum(c[2] for c in counts.values()),
        "rejected_by_reason": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "backend": backend,
        "build": build,
    }
