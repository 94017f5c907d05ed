"""The layout's rules, checked by parsing every module's imports (``pytest tests/test_layout.py``).

Imports flow one way: ``kvtier/`` (the command line) may import everything; ``dashboard/``
imports ``collector`` and the recommendation's typed values from ``policy``; ``probes/``,
``refengine/`` and ``policy/`` import ``collector`` only (and never each other);
``collector/`` imports nothing of the project above it. Only ``kvtier/`` handles an
``argparse.Namespace``, no module is over 400 lines, and no two files import each other
(directly or round a loop, imports inside functions included). That product code is used by
the product, not only by tests: ``tests/test_layout_usage.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("collector", "probes", "refengine", "policy", "dashboard", "kvtier")
# package -> project packages it may import (besides itself)
ALLOWED = {
    "collector": set(),
    "probes": {"collector"},
    "refengine": {"collector"},
    "policy": {"collector"},
    "dashboard": {"collector", "policy"},
    "kvtier": set(PACKAGES),
}
# what dashboard/ may take from policy/: the recommendation's typed values and the config
# writers that render them (what push writes, shown to copy), the live curves' typed values,
# nothing that computes
DASHBOARD_FROM_POLICY = ("kvtier.policy.recommend.values", "kvtier.policy.recommend.recommendation",
                         "kvtier.policy.writers", "kvtier.policy.livecurve.curve_values")
MAX_LINES = 400


def modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


def imported(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth (lazy imports count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def part_of(name: str) -> str | None:
    """The folder an imported module lives in (``kvtier.collector.events`` -> ``collector``,
    ``kvtier.verbs.push`` -> ``kvtier``); ``None`` for a module outside the project."""
    parts = name.split(".")
    if parts[0] != "kvtier":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "kvtier"


def test_imports_flow_one_way():
    wrong = []
    for package, path in modules():
        for line, name in imported(path):
            top = part_of(name)
            if top is None or top == package:
                continue
            if top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
            elif package == "dashboard" and top == "policy" and not name.startswith(DASHBOARD_FROM_POLICY):
                wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name} "
                             f"(the dashboard takes only {', '.join(DASHBOARD_FROM_POLICY)})")
    assert not wrong, "imports that flow upwards or sideways:\n" + "\n".join(wrong)


def test_only_the_command_line_handles_argparse():
    wrong = [f"{path.relative_to(ROOT)}:{line}" for package, path in modules() if package != "kvtier"
             for line, name in imported(path) if name == "argparse"]
    wrong += [f"{path.relative_to(ROOT)}: reads args.*" for package, path in modules()
              if package != "kvtier" and _reads_args(path)]
    assert not wrong, "argparse outside kvtier/:\n" + "\n".join(wrong)


def _reads_args(path: Path) -> bool:
    """A function parameter named ``args`` whose attributes are read (a Namespace passed down)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(a.arg == "args" for a in node.args.args + node.args.kwonlyargs):
                if any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                       and n.value.id == "args" for n in ast.walk(node)):
                    return True
    return False


@pytest.mark.parametrize("folder", [*PACKAGES, "tests", "benchmarks"])
def test_no_module_over_the_line_budget(folder):
    long = [f"{p.relative_to(ROOT)} ({n} lines)" for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"split these along a noun (over {MAX_LINES} lines): {', '.join(long)}"


# Module names found in more than one folder, each naming one concept seen from two sides.
# A new clash fails until it is renamed or, if it really is one concept, listed here.
SAME_CONCEPT = {
    "__init__": "package", "__main__": "entry point", "conftest": "pytest",
    "base": "the base class of each family (readers, cache policies, dashboard views)",
    "events": "the event schema, and the engines' event formats it is mapped from",
    "config": "a component's typed configuration",
    "metrics": "Prometheus metrics: what the reference engine serves, what scrapers read",
    "server": "an HTTP server", "client": "an HTTP client", "stats": "summary statistics",
    "headroom": "host memory headroom: the probe that measures it, the cap recommend applies",
    "load": "the load probe, and its command-line wiring",
    "whatif": "the what-if replay, and the dashboard page that shows it",
    "reuse": "the reuse analysis, and the dashboard's data and page for it",
    "recommendation": "the recommendation value, and its Prometheus info export",
}


def test_no_module_name_means_two_things():
    """The same file name in two folders should mean the same thing (verbs, in
    ``kvtier/verbs/``, are named after what they act on and are left out)."""
    seen: dict[str, list[str]] = {}
    for package, path in modules():
        if path.parent != ROOT / "kvtier" / "verbs":
            seen.setdefault(path.stem, []).append(str(path.parent.relative_to(ROOT)))
    clashes = {name: where for name, where in seen.items()
               if len(where) > 1 and name not in SAME_CONCEPT}
    assert not clashes, f"module names in several folders (rename one): {clashes}"


def test_the_repository_speaks_of_the_product_only():
    """No words about the team or its issue tracker, and no citations of paths outside the
    repository (a user's checkout has only the repository); tests may read ../shared/traces."""
    import re
    import subprocess

    # spelled with character classes so this file does not match its own pattern
    words = re.compile(r"the [l]ead\b|[l]ead's|[h]elper [0-9]|\b[i]ssue[- ]?#?[0-9]|"
                       r"[s]hared/reference|[s]hared/seed|\.\./[s]hared/(?!traces)", re.IGNORECASE)
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix not in (".py", ".md", ".sh", ".toml", ".txt", ".yml", ".yaml") \
                and path.name != "Makefile" or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if words.search(line):
                found.append(f"{name}:{number}: {line.strip()[:80]}")
    assert not found, "\n".join(found)


def module_name(package: str, path: Path) -> str:
    """The import name of a project file (``collector/store.py`` -> ``kvtier.collector.store``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts if package == "kvtier" else ["kvtier", *parts])


def imported_modules(path: Path, project: set[str]) -> set[str]:
    """The project modules a file imports, at any depth (``from kvtier.collector import store``
    names the module ``kvtier.collector.store``; ``from kvtier.collector.store import X`` names
    ``kvtier.collector.store``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & project
            found |= submodules or {node.module}
    return found & project


def import_graph() -> dict[str, set[str]]:
    """Project module -> the project modules it imports."""
    files = {module_name(package, path): path for package, path in modules()}
    project = set(files)
    return {name: imported_modules(path, project) - {name} for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each group of modules that import each other (strongly connected
    components of more than one module, Tarjan's algorithm), as ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while not group or member != node:
                member = stack.pop()
                group.add(member)
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest import cycle through the group's first module (breadth-first, back to it)."""
    start = min(group)
    came_from = {start: start}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def test_no_import_cycles_between_files():
    """No two files import each other, directly or round a longer loop, imports inside
    functions included: a circle means a value type or function lives in the wrong module."""
    found = [" -> ".join(cycle) for cycle in cycles(import_graph())]
    assert not found, "files that import each other (move the shared thing to the module it " \
                      "belongs to):\n" + "\n".join(found)


def test_the_cycle_finder_finds_a_loop_and_no_more():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
