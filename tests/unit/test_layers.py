"""The package's shape, as a test: no import cycles, and imports only run down the layers.

The graph is built from the source with ``ast`` (every import, also those inside functions:
an import deferred to dodge a cycle is still a cycle in the design). A module belongs to the
layer of its longest matching prefix in ``LAYERS``; a module may import its own layer and the
layers below it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "scaleguard"

# low to high; what each layer owns is said in its package's __init__ docstring
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "scaleguard.schema",
        "scaleguard.devices",
        "scaleguard.evidence.files",
    ),  # leaves: the schema, the reader
    ("scaleguard.case",),  # what one case is
    ("scaleguard.machine",),  # the host: inventory, load, probe
    ("scaleguard.workloads", "scaleguard.workload"),  # the contract, built-ins, registry
    ("scaleguard.evidence",),  # records, statistics, metrics, the verdict, baselines
    ("scaleguard.ranks",),  # rank processes: launcher, worker, timing
    ("scaleguard.history",),  # the database and change points
    ("scaleguard.report",),  # renderers only
    ("scaleguard.schedule",),  # matrix, runner, session, ab, bisect, cluster
    ("scaleguard.options", "scaleguard.config", "scaleguard.suite", "scaleguard.plugin", "scaleguard.cli"),
)


# beyond the order: renderers draw values computed below them, never a workload's own facts
FORBIDDEN: tuple[tuple[str, str], ...] = (("scaleguard.report", "scaleguard.workloads"),)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in (SRC / PACKAGE).rglob("*.py")}


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports (a ``from pkg import mod`` names the module)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(PACKAGE + "."):
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(path, name, set(mods)) for name, path in mods.items()}


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, layer = len(prefix), index
    return layer


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer() -> None:
    unplaced = [m for m in _modules() if m != PACKAGE and layer_of(m) < 0]
    assert not unplaced, f"modules without a layer in LAYERS: {unplaced}"


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_imports_run_down_the_layers() -> None:
    upward = [
        f"{src} (layer {layer_of(src)}) imports {dst} (layer {layer_of(dst)})"
        for src, dsts in sorted(graph().items())
        for dst in sorted(dsts)
        if src != PACKAGE and layer_of(dst) > layer_of(src)
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_no_forbidden_import() -> None:
    found = [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph().items())
        for dst in sorted(dsts)
        for low, high in FORBIDDEN
        if src.startswith(low) and dst.startswith(high)
    ]
    assert not found, "\n".join(found)


def test_every_subpackage_says_what_it_owns() -> None:
    for init in (SRC / PACKAGE).glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and "import" in doc, f"{init}: a docstring that says what it owns and may import"


@pytest.mark.parametrize(
    ("g", "expected"),
    [
        (
            {"scaleguard.a": {"scaleguard.b"}, "scaleguard.b": {"scaleguard.a"}},
            [["scaleguard.a", "scaleguard.b"]],
        ),
        ({"scaleguard.a": {"scaleguard.b"}, "scaleguard.b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(g: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(g) == expected


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    # the rule itself: a module of the evidence layer importing the report is one
    assert layer_of("scaleguard.evidence.records") < layer_of("scaleguard.report.terminal")
    assert layer_of("scaleguard.evidence.files") == 0


def test_the_evidence_layer_never_imports_torch() -> None:
    """What runs inside a rank (the phased and profiled steps, collectives) lives in ``ranks``;
    ``evidence`` reads and judges records and must load where torch cannot (the CLI, a report).
    The workloads' FLOP counts, which build models, are reached only through ``metrics``' one
    deferred import of ``scaleguard.workloads``, never torch itself."""
    found = []
    for path in sorted((SRC / PACKAGE / "evidence").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [
                f"{path.relative_to(SRC)}: {n}" for n in names if n == "torch" or n.startswith("torch.")
            ]
    assert not found, "torch imported by the evidence layer:\n" + "\n".join(found)
