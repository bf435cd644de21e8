"""The import rules between pymq's packages, checked on the source (issue #17, point 4).

Every module under ``pymq/`` is parsed with ``ast``; its *runtime* imports of ``pymq.*`` are
collected: module-level ones and ones inside functions alike, but not those under an
``if TYPE_CHECKING:`` block (they never run). Then:

* common imports nothing of pymq (outside itself);
* remoting imports only common;
* the feature packages named after RocketMQ's modules sit just above: filter (the SQL92
  selector) and trace (the trace topic's data) import only common; acl imports only common and
  remoting (its client hook signs a RemotingCommand, as AclClientRPCHook is an RPCHook), and
  remoting does not import acl (it calls a signer it is given);
* store imports neither remoting nor broker, nor filter or trace (the pull path hands it a
  record filter callable; it may use acl's address patterns, for the HA port's allow list);
* namesrv imports neither filter nor trace;
* broker does not import admin;
* client imports neither broker nor store, nor filter (it sends the expression as text);
* export imports neither broker nor acl;
* dledger (the Raft log) imports only common and remoting: the store will import it;
* the graph between the top-level packages has no cycle.

Entry points are not part of a layer: the top-level modules (``pymq/__main__.py``,
``embedded.py``, ``testing.py``) and every package's ``__main__.py`` are where packages are wired
together (``python -m pymq.broker`` hands the broker its admin channel, as ``embedded.py`` does).
Nothing may import a ``__main__`` module, so this exemption cannot close a cycle at run time.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pymq

ROOT = Path(pymq.__file__).parent
LAYERS = (
    "common",
    "remoting",
    "filter",
    "acl",
    "trace",
    "namesrv",
    "store",
    "broker",
    "client",
    "admin",
    "export",
    "dledger",
)

# package -> the packages it must not import at run time
FORBIDDEN: dict[str, frozenset[str]] = {
    "common": frozenset(LAYERS) - {"common"},
    "remoting": frozenset(LAYERS) - {"common", "remoting"},
    "filter": frozenset(LAYERS) - {"common", "filter"},
    "trace": frozenset(LAYERS) - {"common", "trace"},
    "acl": frozenset(LAYERS) - {"common", "remoting", "acl"},
    "store": frozenset({"remoting", "broker", "filter", "trace"}),
    "namesrv": frozenset({"filter", "trace"}),
    "broker": frozenset({"admin"}),
    "client": frozenset({"broker", "store", "filter"}),
    "export": frozenset({"broker", "acl"}),
    "dledger": frozenset(LAYERS) - {"common", "remoting", "dledger"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def runtime_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for each runtime import of pymq.* in ``source`` (of ``module``)."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:  # the else branch does run
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            if target == "pymq":  # from pymq import broker
                found.extend((node.lineno, f"pymq.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, target))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source, module))
    return [(line, name) for line, name in found if name == "pymq" or name.startswith("pymq.")]


def _layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def _all_imports() -> list[tuple[Path, int, str]]:
    """(file, line, imported module) for every runtime import of pymq.* under pymq/."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        is_package = path.name == "__init__.py"
        for line, target in runtime_imports(text, _module_name(path), is_package):
            found.append((path, line, target))
    return found


def _edges() -> dict[tuple[str, str], list[str]]:
    """(from layer, to layer) -> where ("file:line -> module") for every cross-package import."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path, line, target_module in _all_imports():
        source = _layer(_module_name(path))
        if source is None or path.name == "__main__.py":
            continue
        target = _layer(target_module)
        if target is not None and target != source:
            where = f"{path.relative_to(ROOT.parent)}:{line} -> {target_module}"
            edges.setdefault((source, target), []).append(where)
    return edges


def test_the_walk_sees_the_packages() -> None:
    edges = _edges()
    # a sanity check that the walk finds imports at all (and relative ones resolve)
    assert ("broker", "store") in edges
    assert ("broker", "common") in edges
    # and the feature packages are layers of their own
    assert ("broker", "filter") in edges
    assert ("acl", "remoting") in edges
    assert ("admin", "trace") in edges


def test_type_checking_imports_do_not_count() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n    from pymq.broker import controller\n"
        "if typing.TYPE_CHECKING:\n    import pymq.admin\nelse:\n    import pymq.client\n"
        "def f():\n    from pymq.store import config\n"
        "from . import serde\n"
        "from pymq import export\n"
    )
    names = [name for _, name in runtime_imports(source, "pymq.common.probe")]
    assert names == ["pymq.client", "pymq.store", "pymq.common", "pymq.export"]


def test_nothing_imports_an_entry_point() -> None:
    offenders = [
        f"{path.relative_to(ROOT.parent)}:{line} -> {target}"
        for path, line, target in _all_imports()
        if "__main__" in target.split(".")
    ]
    assert not offenders, "\n".join(offenders)


def test_import_rules() -> None:
    violations = [
        f"{source} must not import {target}: {where}"
        for (source, target), wheres in sorted(_edges().items())
        if target in FORBIDDEN.get(source, ())
        for where in wheres
    ]
    assert not violations, "\n".join(violations)


def test_no_cycle_between_packages() -> None:
    edges = _edges()
    graph: dict[str, set[str]] = {layer: set() for layer in LAYERS}
    for source, target in edges:
        graph[source].add(target)

    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for layer in LAYERS:
        if layer not in state:
            walk(layer)

    def explain(cycle: list[str]) -> str:
        hops = [f"  {a} -> {b}: {edges[(a, b)][0]}" for a, b in itertools.pairwise(cycle)]
        return " -> ".join(cycle) + "\n" + "\n".join(hops)

    assert not cycles, "\n".join(explain(c) for c in cycles)
