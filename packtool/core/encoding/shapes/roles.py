"""Role names and `--role-map`: how a record's speaker names become transformers' chat roles."""

from __future__ import annotations

from collections.abc import Mapping

#: the roles a message may have after mapping (transformers' chat roles)
TARGET_ROLES = ("system", "user", "assistant", "tool")
RoleMap = tuple[tuple[str, str], ...]  # (from, to) pairs: hashable and picklable for the chunk settings


def role_key(name: str) -> str:
    """How a role name is matched: case and surrounding space ignored (`Human`, ` GPT ` are `human`, `gpt`)."""
    return name.strip().casefold()


def parse_role_map(spec: str) -> RoleMap:
    """`from=to,from2=to2` -> pairs; ValueError with the reason when malformed or a target is not a role."""
    pairs: list[tuple[str, str]] = []
    for piece in spec.split(","):
        name, eq, role = (s.strip() for s in piece.partition("="))
        if not eq or not name or not role:
            raise ValueError(f"{piece.strip()!r} is not FROM=TO (e.g. --role-map 'human=user,gpt=assistant')")
        if role not in TARGET_ROLES:
            raise ValueError(f"{name}={role}: {role!r} is not one of {', '.join(TARGET_ROLES)}")
        if any(role_key(name) == role_key(seen) for seen, _ in pairs):
            raise ValueError(f"{name!r} is mapped twice (role names match whatever their case)")
        pairs.append((name, role))
    return tuple(pairs)


def role_table(extra: RoleMap, base: Mapping[str, str]) -> dict[str, str]:
    """`base` overridden and extended by `extra`, keyed by `role_key` (look names up through it too)."""
    table = {role_key(k): v for k, v in base.items()}
    table.update((role_key(k), v) for k, v in extra)
    return table
