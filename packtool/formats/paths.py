"""One guard for every path built from data: it must stay inside the directory it belongs to.

Names that come from files or from the text after `hf://` (a hub dataset's PATH, the commit a `refs/*` file
holds, the Arrow files `state.json` lists, the splits `dataset_dict.json` lists) and the files a directory
walk or a glob finds are joined to a root only through `contained` / `check_within`: a name that is empty,
absolute or holds a `..` part is refused as written (so it cannot walk out through a directory that does
not exist yet), and the joined path, links followed, must lie inside the root (so a link inside it cannot
lead out). A link may lead further than the root only where the layout says so: a hub snapshot's files are
links into the repo's `blobs/`, so there the links may go anywhere inside the repo (`links_within`).

Either failure is an InputError naming the path, what named it and the root it left; nothing outside is
ever opened.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from packtool.errors import InputError


def contained(
    root: Path, name: str, what: str, *, hint: str, one_part: bool = False, links_within: Path | None = None
) -> Path:
    """`root / name` for a `name` read from data (`what` says where it was read); InputError when it leaves `root`.

    `one_part`: the name must be a single path component (a commit, a split). `links_within`: where links
    met on the way may lead (default: `root` itself)."""
    reason = _lexical_fault(name, one_part)
    if reason is not None:
        raise InputError(f"{what} names {name!r}, {reason}", str(root), hint=hint)
    return check_within(root / name, links_within or root, f"{what} names {name!r}, which", hint=hint)


def check_within(path: Path, root: Path, what: str, *, hint: str) -> Path:
    """`path` itself when it (links followed) lies inside `root`; InputError naming both otherwise.

    `what` names the path for the message: "`what` leads outside ROOT (to TARGET)"."""
    try:
        resolved = path.resolve()
        inside = resolved.is_relative_to(root.resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # a link loop, a NUL byte
        raise InputError(f"{what} cannot be resolved ({exc})", str(path), hint=hint) from exc
    if not inside:
        raise InputError(f"{what} leads outside {root} (to {resolved})", str(path), hint=hint)
    return path


def _lexical_fault(name: str, one_part: bool) -> str | None:
    if not isinstance(name, str) or not name:
        return "an empty path"
    if "\x00" in name:
        return "a path with a NUL byte"
    if name.startswith("/") or os.path.isabs(name):
        return "an absolute path, not one inside the directory"
    parts = PurePosixPath(name).parts
    if ".." in parts:
        return "a path that climbs out of the directory with '..'"
    if one_part and (len(parts) != 1 or parts[0] in (".", "")):
        return "not a single name inside the directory"
    return None
