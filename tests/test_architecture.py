"""The dependency rule, enforced: every import in packtool/ (function-level ones too) is walked.

    base (errors, choices, progress, signals, the lazy `packtool` API)
      ^
    formats            the only owner of on-disk names, dtypes, manifests, atomic writers
      ^
    core | exec        pure algorithms and encoders | executors; neither imports the other
      ^
    stages             tokenize, merge, pack, stats, verify (and export): config -> plan -> tasks -> commit
      ^
    cli                typer commands and `packtool run`

    torch side (loader/, attention, hf, loss, audit/) -> base, formats and the torch-free parts of core only

The CLI reaches the torch side in one place only: `packtool audit` imports `packtool.audit` inside
its command function, so no other command (nor `--help`) loads torch or transformers.

A lower layer never imports a higher one, no module imports its own layer's package back in a
cycle, and the torch side never reaches the CLI, the stages or the tokenizer stack.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "packtool"

LAYERS = {"base": 0, "formats": 1, "vision": 1.5, "core": 2, "exec": 2, "stages": 3, "cli": 4, "torch": 2}
TORCH_SIDE = ("packtool.loader", "packtool.attention", "packtool.loss", "packtool.audit", "packtool.hf")
#: torch-side packages the CLI may import, inside a command function only (checked below)
LAZY_FROM_CLI = ("packtool.audit",)
#: what the torch side may import of packtool: no CLI, no stages, no tokenizer stack
TORCH_ALLOWED = (
    "base",
    "formats",
    "packtool.core.packing",
    "packtool.core.batching",
    "packtool.core.cost",
    "packtool.core.balance",
    "packtool.core.blend",
    "packtool.core.mixture",
    "packtool.vision",
    "torch",
)
#: third-party modules the torch side must never import (directly or through packtool modules)
TORCH_FORBIDDEN_THIRD_PARTY = {"typer", "tqdm", "tokenizers", "jinja2", "click", "fastokens", "yaml"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def layer(mod: str) -> str:
    if mod.startswith(TORCH_SIDE):
        return "torch"
    parts = mod.split(".")
    if len(parts) == 1 or parts[1] in ("errors", "choices", "progress", "signals", "__main__") and len(parts) == 2:
        return "cli" if mod == "packtool.__main__" else "base"
    return parts[1]


def imports_of(path: Path, mods: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(packtool modules, top-level third-party names) imported anywhere in the file."""
    tree = ast.parse(path.read_text("utf-8"))
    own: set[str] = set()
    third: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
            # `from pkg import submodule` depends on the submodule; anything else on the module itself
            names = subs if subs and len(subs) == len(node.names) else [node.module, *subs]
        else:
            continue
        for name in names:
            if name == "packtool" or name.startswith("packtool."):
                while name not in mods and "." in name:
                    name = name.rsplit(".", 1)[0]
                own.add(name)
            else:
                third.add(name.split(".")[0])
    return own, third


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = modules()
    edges, third = {}, {}
    for mod, path in mods.items():
        own, ext = imports_of(path, mods)
        edges[mod] = own - {mod}
        third[mod] = ext
    return edges, third


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a module path), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def violations(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for src, targets in edges.items():
        for dst in targets:
            a, b = layer(src), layer(dst)
            if a == "torch":
                if not (b in TORCH_ALLOWED or dst.startswith(TORCH_ALLOWED[2:]) or b == "torch"):
                    out.append(f"torch side {src} imports {dst} ({b})")
            elif b == "torch" and not (a == "cli" and dst.startswith(LAZY_FROM_CLI)):
                out.append(f"{src} ({a}) imports the torch side {dst}")
            elif LAYERS[b] > LAYERS[a] or (a != b and LAYERS[a] == LAYERS[b]):
                out.append(f"{src} ({a}) imports upward/sideways {dst} ({b})")
    return sorted(out)


def test_no_import_cycle() -> None:
    edges, _ = graph()
    assert find_cycle(edges) is None, f"import cycle: {' -> '.join(find_cycle(edges) or [])}"


def test_no_upward_or_sideways_import() -> None:
    edges, _ = graph()
    assert violations(edges) == []


def test_torch_side_never_reaches_cli_or_tokenizer_stack() -> None:
    edges, third = graph()
    torch_mods = [m for m in edges if layer(m) == "torch"]
    assert "packtool.loader" in torch_mods and "packtool.attention" in torch_mods
    seen: set[str] = set()
    todo = list(torch_mods)
    while todo:  # everything the torch side loads, transitively
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(edges[m])
    reached = {name for m in seen for name in third[m]} & TORCH_FORBIDDEN_THIRD_PARTY
    assert reached == set(), f"the torch side imports {sorted(reached)}"
    assert not [m for m in seen if layer(m) in ("cli", "stages")]


def module_level_imports(path: Path) -> set[str]:
    """Names imported when the module loads: top-level statements (and top-level if/try blocks)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text("utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, (ast.If, ast.Try)):
            todo.extend([*node.body, *node.orelse, *getattr(node, "finalbody", []), *getattr(node, "handlers", [])])
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return names


def test_cli_imports_the_torch_side_only_inside_functions() -> None:
    heavy = (*TORCH_SIDE, "torch", "transformers")
    for mod, path in modules().items():
        if layer(mod) == "cli":
            eager = {n for n in module_level_imports(path) if n == "torch" or n.startswith(heavy)}
            assert eager == set(), f"{mod} imports {sorted(eager)} at module level"


#: rooms inside a stage: each imports itself and the layers below, never the run around it nor a sibling room
ROOMS = ("packtool.stages.tokenize.inputs", "packtool.stages.tokenize.engine")


def room_violations(edges: dict[str, set[str]], rooms: tuple[str, ...] = ROOMS) -> list[str]:
    out = []
    for room in rooms:
        parent = room.rsplit(".", 1)[0]
        for src, targets in edges.items():
            if src != room and not src.startswith(room + "."):
                continue
            for dst in targets:
                inside = dst == room or dst.startswith(room + ".")
                if (dst == parent or dst.startswith(parent + ".")) and not inside:
                    out.append(f"{src} (room {room}) imports {dst} of the run around it")
    return sorted(out)


def test_rooms_never_import_the_run_around_them() -> None:
    edges, _ = graph()
    assert all(any(m.startswith(room + ".") for m in edges) for room in ROOMS)
    assert room_violations(edges) == []
    # and the check would catch one: a reader importing the pipeline
    edges["packtool.stages.tokenize.inputs.plan"] = {"packtool.stages.tokenize.pipeline"}
    assert room_violations(edges) == [
        "packtool.stages.tokenize.inputs.plan (room packtool.stages.tokenize.inputs) imports "
        "packtool.stages.tokenize.pipeline of the run around it"
    ]


def test_every_module_has_a_layer() -> None:
    edges, _ = graph()
    assert {layer(m) for m in edges} <= set(LAYERS)


@pytest.mark.parametrize(
    ("edges", "expect"),
    [
        ({"packtool.formats.a": {"packtool.stages.b"}, "packtool.stages.b": set()}, "upward"),
        ({"packtool.core.a": {"packtool.exec.b"}, "packtool.exec.b": set()}, "sideways"),
        ({"packtool.loader.a": {"packtool.cli.b"}, "packtool.cli.b": set()}, "torch side"),
        ({"packtool.loader.a": {"packtool.core.encoding.x"}, "packtool.core.encoding.x": set()}, "torch side"),
        ({"packtool.cli.a": {"packtool.loader.b"}, "packtool.loader.b": set()}, "torch side"),
        ({"packtool.audit.a": {"packtool.stages.b"}, "packtool.stages.b": set()}, "torch side"),
    ],
)
def test_the_rule_catches_a_reintroduced_violation(edges: dict[str, set[str]], expect: str) -> None:
    assert any(expect in v for v in violations(edges))


def test_the_cycle_check_catches_a_reintroduced_cycle() -> None:
    edges, _ = graph()
    edges = {k: set(v) for k, v in edges.items()}
    edges["packtool.exec.task"].add("packtool.exec")  # e.g. the old executors <-> writer cycle
    assert find_cycle(edges) is not None
