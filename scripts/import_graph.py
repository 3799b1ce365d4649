#!/usr/bin/env python3
"""Print the app-level import graph of the project and any cycles in it.

    python scripts/import_graph.py            # edges, then cycles; exit 1 if there is a cycle
    python scripts/import_graph.py --modules  # also name the importing modules per edge

Reads the source with :mod:`ast` (nothing is imported or executed), so it runs with a bare
Python on any checkout. Every ``import``/``from … import`` counts, also those inside a
function (a lazy import is still a dependency) and under ``TYPE_CHECKING``. Tests and
migrations are left out: they may import whatever they check.

A *room* is one node of the graph: each ``apps/<name>`` package, ``apps.scheduling.policy``
on its own (it must import no Django, Redis or app), the top-level packages ``worker`` and
``cli``, ``yoloportal`` (settings and the project's helpers) and ``yoloportal.entry`` (its
URL table and ASGI/WSGI entry points); ``bench/`` and ``scripts/`` are tools and only
importers. "third-party" imports of a room are listed too, so the rules "apps/core imports
no app" and "policy imports no Django/Redis" can be checked from the same walk
(``tests/test_architecture.py`` does).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("apps", "worker", "yoloportal", "cli")
TOOL_DIRS = ("bench", "scripts")
SUBROOMS = ("apps.scheduling.policy",)  # packages that are rooms of their own inside an app
# The project's entry points import every app; the rest of ``yoloportal`` (settings, env,
# logs, secret, body_limit) is the base any app may import. Two rooms, so the base is not
# drawn into a cycle through the URL table.
ENTRY_POINTS = {"yoloportal.urls", "yoloportal.asgi", "yoloportal.wsgi"}
ENTRY_ROOM = "yoloportal.entry"
SKIP_PARTS = {"migrations", "tests", "__pycache__"}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(root: Path = ROOT, dirs: Iterable[str] = SOURCE_DIRS + TOOL_DIRS) -> Iterator[Path]:
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            if not SKIP_PARTS & set(path.relative_to(root).parts):
                yield path


def room_of(module: str) -> str | None:
    """The room a dotted module name belongs to, or None if it is not ours."""
    if module in ENTRY_POINTS or any(module.startswith(entry + ".") for entry in ENTRY_POINTS):
        return ENTRY_ROOM
    for sub in SUBROOMS:
        if module == sub or module.startswith(sub + "."):
            return sub
    parts = module.split(".")
    if parts[0] == "apps":
        return ".".join(parts[:2]) if len(parts) > 1 else None
    if parts[0] in SOURCE_DIRS + TOOL_DIRS:
        return parts[0]
    return None


def imported_modules(path: Path, module: str) -> Iterator[str]:
    """Every module ``path`` imports (relative imports resolved against ``module``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            yield target
            # ``from apps.accounts import openapi`` imports apps.accounts.openapi
            for alias in node.names:
                yield f"{target}.{alias.name}"


def module_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Each of our modules → every module name it imports (not yet resolved to files)."""
    found: dict[str, set[str]] = {}
    for path in source_files(root):
        module = module_name(path, root)
        found[module] = set(imported_modules(path, module))
    return found


def collect(root: Path = ROOT) -> tuple[dict[tuple[str, str], set[str]], dict[str, set[str]]]:
    """(room → room edges with the modules that make them, room → third-party top-level names)."""
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    external: dict[str, set[str]] = defaultdict(set)
    for module, targets in module_imports(root).items():
        source = room_of(module)
        if source is None:
            continue
        for target in targets:
            room = room_of(target)
            if room is None:
                external[source].add(target.split(".")[0])
            elif room != source and not (source.startswith(room + ".") and _is_package_itself(target, room)):
                edges[(source, room)].add(module)
    return edges, external


def _is_package_itself(target: str, room: str) -> bool:
    # A sub-room's own modules reach its parent package's ``__init__`` implicitly; the
    # parent *package name* alone (``from apps.scheduling import x``) is not a dependency.
    return target == room


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with more than one room (Tarjan), each sorted."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def module_cycles(root: Path = ROOT) -> list[list[str]]:
    """Cycles of modules that span two or more rooms (e.g. ``jobs.services`` ↔ ``scheduling.inputs``).

    A name that is not a module of ours (``from .models import Job`` also yields
    ``apps.jobs.models.Job``) is dropped; a package name counts as its ``__init__``.
    """
    imports = module_imports(root)
    ours = set(imports)
    edges = [(a, b) for a, targets in imports.items() for b in targets if b in ours and b != a]
    return [c for c in cycles(edges) if len({room_of(m) for m in c}) > 1]


def report(root: Path = ROOT, *, with_modules: bool = False) -> tuple[str, list[list[str]]]:
    edges, external = collect(root)
    lines = ["# room -> rooms it imports"]
    by_source: dict[str, list[str]] = defaultdict(list)
    for source, target in sorted(edges):
        by_source[source].append(target)
    rooms = sorted({room for pair in edges for room in pair} | set(external))
    for room in rooms:
        targets = by_source.get(room, [])
        lines.append(f"{room:26} -> {', '.join(targets) if targets else '(no app)'}")
        if with_modules:
            for target in targets:
                lines.append(f"{'':28}{target}: {', '.join(sorted(edges[(room, target)]))}")
    found = cycles(edges)
    lines.append("")
    if found:
        lines.append(f"# cycles: {len(found)}")
        for component in found:
            members = set(component)
            links = [f"{a} -> {b} ({', '.join(sorted(edges[(a, b)]))})"
                     for a, b in sorted(edges) if a in members and b in members]
            lines.append(f"cycle: {' , '.join(component)}")
            lines.extend(f"  {link}" for link in links)
    else:
        lines.append("# cycles: none")
    lines.append("")
    loops = module_cycles(root)
    lines.append(f"# module cycles across rooms: {len(loops) or 'none'}")
    lines.extend(f"module cycle: {' , '.join(c)}" for c in loops)
    return "\n".join(lines), found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="name the importing modules of each edge")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to read (default: this one)")
    args = parser.parse_args(argv)
    text, found = report(args.root.resolve(), with_modules=args.modules)
    print(text)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
