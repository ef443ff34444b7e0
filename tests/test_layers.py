"""The package layers run one way (docs/architecture.md): every import in zoo/, function-level ones
included, goes to its own package or to a lower layer, and no two modules import each other in a
circle. Read from the source with ``ast`` (nothing is imported), so a lazy import cannot hide an
upward dependency."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top. A package imports only from its own package and from lower layers.
LAYERS = (
    ("utils",),
    ("amp", "data", "weights", "losses", "metrics", "postprocess", "tracking"),
    ("models", "tasks"),
    ("engine",),
    ("diagnostics",),
    ("export", "report", "bench"),
    ("deploy",),  # the deploy check (issue 35) reuses the export's resize rule, resolution and numerics
)
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}
# ``import zoo`` (create_model, list_models) is the facade of zoo.models: the models layer.
RANK[""] = RANK["models"]
# (importer module, imported module) -> why it is allowed. Keep it empty.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(path: Path, module: str):
    """(imported zoo module, names imported from it, line) for every import of ``path``, at any depth."""
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "zoo" or alias.name.startswith("zoo."):
                    yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "zoo" or name.startswith("zoo."):
                yield name, [alias.name for alias in node.names], node.lineno


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported module: line}}``. ``from pkg import mod`` imports ``pkg.mod``, and ``pkg``
    itself only if some other name comes from its ``__init__``."""
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for name, names, line in _targets(path, module):
            subs = [f"{name}.{sub}" for sub in names if f"{name}.{sub}" in modules]
            if len(subs) < len(names) or not names:
                edges.setdefault(name, line)
            for sub in subs:
                edges.setdefault(sub, line)
    return graph


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_violations(graph: dict[str, dict[str, int]], paths: dict[str, Path], root: Path = ROOT) -> list[str]:
    bad = []
    for module, edges in graph.items():
        own = _package(module)
        for target, line in edges.items():
            other = _package(target)
            if other == own or {own, other} == {"", "models"} or (module, target) in ALLOWED:
                continue
            if other not in RANK or own not in RANK:
                bad.append(f"{paths[module].relative_to(root)}:{line}: package zoo.{own or other} has no layer")
            elif RANK[other] >= RANK[own]:
                bad.append(f"{paths[module].relative_to(root)}:{line}: {module} (layer {RANK[own]}) imports "
                           f"{target} (layer {RANK[other]})")
    return bad


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def zoo_graph():
    paths = {_module_name(p, ROOT): p for p in sorted((ROOT / "zoo").rglob("*.py"))}
    return import_graph(paths), paths


def test_every_import_goes_down_a_layer(zoo_graph):
    graph, paths = zoo_graph
    bad = layer_violations(graph, paths)
    assert not bad, "imports that go up or across a layer:\n" + "\n".join(bad)


def test_no_import_circle(zoo_graph):
    graph, _ = zoo_graph
    found = cycles(graph)
    assert not found, "modules importing each other in a circle: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_package_has_a_layer():
    packages = {p.name for p in (ROOT / "zoo").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(RANK) - {""}, f"packages without a layer: {sorted(packages - set(RANK))}"


# The folders above the package: tools/ is the top layer (entry points), configs/ is theirs to read.
# A module of zoo/ that builds a path into them is an upward dependency no import shows (issue 34.5:
# engine/sweep.py ran tools/train.py by path, report/parity.py read configs/report.yaml by path).
ABOVE = ("tools", "configs")


def _mentions(node, names) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def reaches_by_path(path: Path) -> list[str]:
    """``path:line`` of every ``<a path from __file__> / "tools"`` (or ``"configs/..."``) in a module:
    a path built from the module's own location (directly, or through a name assigned from it) that
    goes on into tools/ or configs/. Other paths (a PaddleOCR source tree's tools/) are not the zoo's."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    located = {"__file__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _mentions(node.value, {"__file__"}):
            located |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                and isinstance(node.right.value, str) and node.right.value.split("/")[0] in ABOVE \
                and _mentions(node.left, located):
            found.append((node.lineno, f"{path.name}:{node.lineno}: / {node.right.value!r}"))
    return [text for _, text in sorted(found)]


def test_no_module_reaches_tools_or_configs_by_path(zoo_graph):
    _, paths = zoo_graph
    bad = [hit for p in paths.values() for hit in reaches_by_path(p)]
    assert not bad, "paths into tools/ or configs/ built inside zoo/ (pass them in from tools/):\n" + "\n".join(bad)


def test_the_path_check_catches_a_reach(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("from pathlib import Path\nROOT = Path(__file__).resolve().parents[2]\n"
                   "T = ROOT / 'tools' / 'train.py'\nC = Path(__file__).parent.parent / 'configs/report.yaml'\n"
                   "ok = Path('/src/PaddleOCR') / 'tools' / 'train.py'\nok2 = ROOT / 'tooling'\n")
    assert reaches_by_path(mod) == ["m.py:3: / 'tools'", "m.py:4: / 'configs/report.yaml'"]


def test_the_allow_list_says_why():
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_catches_an_upward_and_a_lazy_import_and_a_circle(tmp_path):
    """The checks above fail on the mistakes they exist for (a made-up tree)."""
    pkg = tmp_path / "zoo"
    for sub in ("utils", "engine", "data"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "utils" / "a.py").write_text("def f():\n    from zoo.engine import b  # lazy, still upward\n")
    (pkg / "engine" / "b.py").write_text("from zoo.data.c import g\n")
    (pkg / "data" / "c.py").write_text("import zoo.data.d\ng = 1\n")
    (pkg / "data" / "d.py").write_text("from zoo.data import c\n")
    paths = {_module_name(p, tmp_path): p for p in sorted(pkg.rglob("*.py"))}
    graph = import_graph(paths)
    assert layer_violations(graph, paths, tmp_path) == [
        "zoo/utils/a.py:2: zoo.utils.a (layer 0) imports zoo.engine.b (layer 3)"]
    assert cycles(graph) == [["zoo.data.c", "zoo.data.d"]]
