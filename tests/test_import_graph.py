"""gcc's import graph (docs/design.md, "Code map"): no circle between gcc's modules and no import that climbs back
up a layer, counting every import, a function's deferred one included (deferring an import hides a circle from
Python, not from a reader). Read from the source with `ast`: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

GCC = Path(__file__).resolve().parents[1] / "gcc"

# The layers, lowest first: a module imports only from its own layer and the ones before it. The first entry whose
# prefix names a module gives its layer (a package's own modules by the package's name).
LAYERS: list[tuple[str, ...]] = [
    ("gcc",),  # the plumbing at the top of gcc/: errors, inputs, storage, names, settings, launch_command, ...
    ("gcc.compat", "gcc.workers"),  # the libraries' insides; the worker processes (over compat/python.py)
    ("gcc.data", "gcc.synth", "gcc.model"),
    ("gcc.sampling",),
    ("gcc.training",),
    ("gcc.tools", "gcc.launcher", "gcc.train"),  # the entry points
]


def layer_of(module: str) -> int:
    best, found = -1, 0
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, found = len(p), i
    return found


def modules() -> dict[str, Path]:
    found = {}
    for path in GCC.rglob("*.py"):
        parts = path.relative_to(GCC.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom, known: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        wanted = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        wanted = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    out = []
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.append(target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = {
            t
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for t in _imported(name, path, node, known)
        }
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def climbs(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if layer_of(b) > layer_of(a)
    ]


def test_no_module_imports_in_a_circle():
    assert circles(import_graph()) == []


def test_no_import_climbs_back_up_a_layer():
    assert climbs(import_graph()) == []


def test_the_checks_see_a_circle_and_a_climb():
    """The checks themselves, on a graph with one of each (and one a deferred import would hide at run time)."""
    graph = {"gcc.errors": {"gcc.inputs"}, "gcc.inputs": {"gcc.errors"}, "gcc.data.shards": {"gcc.errors"}}
    graph["gcc.compat.streaming"] = {"gcc.data.shards"}
    assert circles(graph) == [["gcc.errors", "gcc.inputs"]]
    assert climbs(graph) == ["gcc.compat.streaming (layer 1) imports gcc.data.shards (layer 2)"]
    assert layer_of("gcc.launcher") == layer_of("gcc.tools.plot") > layer_of("gcc.launch_command") == 0


def test_a_deferred_import_is_an_edge(tmp_path):
    """An import inside a function counts as one at the top (the circles this test was written for hid that way)."""
    tree = ast.parse("def f():\n    from gcc.inputs import read_text\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    known = modules()
    assert _imported("gcc.errors", GCC / "errors.py", node, known) == ["gcc.inputs"]
