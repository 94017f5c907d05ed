"""Product code is used by the product: every function, class, method and module in the product
folders is referred to by product code, not only by tests (``pytest tests/test_layout_usage.py``).
What only tests run belongs under tests/ (an oracle, a helper) or nowhere; the few names a
framework or an engine calls by name are listed with why."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_layout import PACKAGES, ROOT, import_graph, module_name, modules

# Names the product never calls itself because something outside it calls them by name. Each is
# what a framework or an engine invokes; anything else used only by tests moves under tests/
# (an oracle, a helper) or goes.
CALLED_BY_NAME = {
    # vLLM's OffloadingManager and OffloadingSpec contract (probes/vllm/spec.py wraps vLLM's
    # manager; vLLM loads the spec classes from kv_connector_extra_config by name)
    "lock", "on_new_request", "on_request_finished", "on_schedule_end", "has_pending_work",
    "reset_cache", "on_reset_flushed", "get_stats", "config_info", "get_manager",
    "KvtierCPUOffloadingSpec", "KvtierTieringOffloadingSpec",
    # vLLM's CPU ARC manager's list attributes, which its tests read on vLLM's own manager and ours
    "t2",
    # http.server and socketserver hooks (refengine/server.py, collector/exports/http.py)
    "do_GET", "do_POST", "log_message", "process_request", "process_request_thread",
    "handle_error",
    # urllib.request's OpenerDirector calls a handler's <scheme>_open by name (probes/polling.py)
    "http_open", "https_open",
    # torch.nn.Module.__call__ runs forward
    "forward",
    # the structural protocol every trace reader satisfies (collector/events.py)
    "TraceReader",
}
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DOTTED = re.compile(r"[A-Za-z_][\w.:]*")  # a string that names code: "kvtier.probes.vllm.spec:X"


def definitions(tree: ast.Module):
    """(name, qualified name) of every top-level function and class and their methods."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.name
            for item in node.body if isinstance(node, ast.ClassDef) else ():
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield item.name, f"{node.name}.{item.name}"


def references(path: Path) -> set[str]:
    """Names a file uses: names, attributes, imported names, and the identifiers of strings that
    name code (plug-in paths, ``__all__``); docstrings and a definition's use of itself (recursion)
    do not count. Cython sources count every identifier in them."""
    text = path.read_text()
    if path.suffix != ".py":
        return set(_IDENTIFIER.findall(text))
    found: set[str] = set()

    def visit(node: ast.AST, inside: frozenset[str]) -> None:
        children = list(ast.iter_child_nodes(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            inside = inside | {getattr(node, "name", "")}
            if ast.get_docstring(node, clean=False) is not None:
                children.remove(node.body[0])
        names: set[str] = set()
        if isinstance(node, ast.Name):
            names = {node.id}
        elif isinstance(node, ast.Attribute):
            names = {node.attr}
        elif isinstance(node, ast.alias):
            names = {node.name.rsplit(".", 1)[-1]}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and _DOTTED.fullmatch(node.value):
            names = set(_IDENTIFIER.findall(node.value))
        found.update(names - inside)
        for child in children:
            visit(child, inside)

    visit(ast.parse(text, str(path)), frozenset())
    return found


def product_files():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            if path.suffix in (".py", ".pyx", ".pxi") and "__pycache__" not in path.parts:
                yield path


def used_only_by_tests() -> list[str]:
    """Product functions, classes and methods no product code refers to (entry points in
    ``setup.py``/``pyproject.toml`` count), less the dunders and the allow-lists."""
    product = set().union(*(references(path) for path in product_files()))
    for name in ("setup.py", "pyproject.toml"):
        product |= set(_IDENTIFIER.findall((ROOT / name).read_text()))
    orphans = []
    for path in product_files():
        if path.suffix == ".py":
            for name, qualified in definitions(ast.parse(path.read_text(), str(path))):
                if name not in product and not (name.startswith("__") and name.endswith("__")) \
                        and name not in CALLED_BY_NAME:
                    orphans.append(f"{path.relative_to(ROOT)}: {qualified}")
    return orphans


def test_no_product_function_is_used_only_by_tests():
    """Every function, class and method in the product folders is used by product code: what
    only tests call belongs under tests/ (an oracle, a helper) or nowhere (conventions: no
    product modules only tests import, no second implementation of a concept)."""
    orphans = used_only_by_tests()
    assert not orphans, "product code no product code uses (move it under tests/ as an oracle " \
                        "or helper, or delete it):\n" + "\n".join(orphans)


def test_the_orphan_finder_sees_past_docstrings_and_recursion(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('"""Uses documented()."""\n\ndef fact(n):\n    """See helper."""\n'
                    '    return 1 if n < 2 else n * fact(n - 1)\n\n'
                    'PLUGIN = "kvtier.probes.vllm.spec:Spec"\nx = thing.attr\n')
    assert references(path) == {"n", "fact", "kvtier", "probes", "vllm", "spec", "Spec", "thing",
                                "attr", "x", "PLUGIN"} - {"fact"}


# Product modules no other product module imports: what engines, Streamlit or the interpreter
# load by path or by name.
LOADED_BY_NAME = {
    "kvtier.__main__",           # python -m kvtier
    "kvtier.dashboard.app",      # streamlit run <path> (kvtier dashboard)
    # not yet decided: vLLM's scored-LRU plug-in, which no writer configures (the vLLM writer
    # deploys the learned gate through it, or it goes)
    "kvtier.probes.vllm.cache_policy",
}


def test_no_module_is_used_only_by_tests():
    """Every product module (probes/ included: each tap, scraper and plug-in) is imported by
    another product module, or named by one as a plug-in path, or loaded by name."""
    files = {module_name(package, path): path for package, path in modules()}
    graph = import_graph()
    imported_somewhere = set().union(*graph.values())
    named: set[str] = set()
    registries: set[str] = set()  # packages whose modules a registry imports by name
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))) if path.suffix == ".py" else ():
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and node.value.startswith("kvtier."):
                named.add(node.value.split(":")[0])
            elif isinstance(node, ast.JoinedStr) and isinstance(node.values[0], ast.Constant) \
                    and str(node.values[0].value).startswith("kvtier."):
                # f"kvtier.policy.writers.{engine}": a registry names each module of the package
                registries.add(str(node.values[0].value).rstrip("."))
    for name in ("setup.py", "pyproject.toml"):
        named |= set(re.findall(r"kvtier(?:\.\w+)+", (ROOT / name).read_text()))
    unused = sorted(module for module, path in files.items()
                    if module not in imported_somewhere | named | LOADED_BY_NAME
                    and path.name != "__init__.py" and module.rsplit(".", 1)[0] not in registries)
    assert not unused, "modules no product code imports or loads:\n" + "\n".join(unused)
