"""The package layout's rules (docs/design.md section 8), checked on the source's import statements.

* the packages stand on floors, and no import runs back up a floor (any import, also one
  inside a function or under ``TYPE_CHECKING``): checkpoint -> protocol -> connectors ->
  spark -> savepoints -> monitoring -> ops;
* no two packages import each other;
* the checkpoint package needs no Spark (``pyspark``);
* a connector never imports another target's connector (shared SQL plumbing excepted);
* library modules never import the test kit (``exactly.testing``) or the demos;
* no import cycles among module-level imports.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from source_tree import SRC, files, tree

#: modules every connector may share (not a target of their own)
#: connector modules of no one target: SQL helpers, admission control, and the records the
#: table-format sinks (Delta, Iceberg) keep beside a table's data files
SHARED_CONNECTOR_MODULES = {"exactly.connectors.sql", "exactly.connectors.admission",
                            "exactly.connectors.lake_files"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def imports(path: Path, *, top_level_only: bool) -> frozenset[str]:
    """``exactly.*`` modules imported by ``path`` (optionally only at module level)."""
    module = tree(path)
    nodes = module.body if top_level_only else list(ast.walk(module))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("exactly"):
            found.add(node.module)
            for alias in node.names:  # from exactly import options -> exactly.options
                candidate = f"{node.module}.{alias.name}"
                if (SRC.parent / candidate.replace(".", "/")).with_suffix(".py").exists():
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("exactly"))
    return frozenset(found)


@functools.cache
def _modules() -> tuple[tuple[str, Path], ...]:
    return tuple((module_name(p), p) for p in files())


def modules() -> dict[str, Path]:
    """Every module of the package and its file (listed once per test session)."""
    return dict(_modules())


def target_of(module: str) -> str | None:
    """``postgres`` for exactly.connectors.postgres.two_phase, ``wal`` for ...wal."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "connectors" and module not in SHARED_CONNECTOR_MODULES:
        return parts[2]
    return None


#: the packages from the ground up: each may import those below it, never one above
FLOORS = ("checkpoint", "protocol", "connectors", "spark", "savepoints", "monitoring", "ops")


def package_of(module: str) -> str | None:
    """``ops`` for exactly.ops.driver; None for the modules beside the packages."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (SRC / parts[1]).is_dir() else None


def package_imports() -> set[tuple[str, str, str]]:
    """``(importing package, imported package, importing module)`` across packages."""
    found = set()
    for module, path in modules().items():
        mine = package_of(module)
        for imported in imports(path, top_level_only=False):
            theirs = package_of(imported)
            if mine and theirs and mine != theirs:
                found.add((mine, theirs, module))
    return found


def test_no_import_runs_back_up_a_floor():
    upward = {(module, theirs) for mine, theirs, module in package_imports()
              if mine in FLOORS and theirs in FLOORS
              and FLOORS.index(theirs) > FLOORS.index(mine)}
    assert upward == set()


def test_no_two_packages_import_each_other():
    pairs = {(mine, theirs) for mine, theirs, _ in package_imports()}
    both_ways = {tuple(sorted(pair)) for pair in pairs if pair[::-1] in pairs}
    assert both_ways == set()


def test_the_checkpoint_package_needs_no_spark():
    spark = set()
    for module, path in modules().items():
        if module.startswith("exactly.checkpoint"):
            for node in ast.walk(tree(path)):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                spark.update((module, n) for n in names if n.split(".")[0] == "pyspark")
    assert spark == set()


def test_the_protocol_imports_no_connector_and_no_spark_adapter():
    bad = {(m, i) for m, p in modules().items() if m.startswith("exactly.protocol")
           for i in imports(p, top_level_only=False)
           if i.startswith(("exactly.connectors", "exactly.spark", "exactly.demos",
                            "exactly.testing", "exactly.ops"))}
    assert bad == set()


def test_no_connector_imports_another_targets_connector():
    bad = set()
    for module, path in modules().items():
        mine = target_of(module)
        if mine is None:
            continue
        for imported in imports(path, top_level_only=False):
            theirs = target_of(imported)
            if theirs is not None and theirs != mine:
                bad.add((module, imported))
    assert bad == set()


def test_library_modules_never_import_the_test_kit_or_the_demos():
    bad = {(m, i) for m, p in modules().items()
           if not m.startswith(("exactly.testing", "exactly.demos")) and m != "exactly.cli"
           for i in imports(p, top_level_only=False)
           if i.startswith(("exactly.testing", "exactly.demos"))}
    assert bad == set()


def test_module_level_imports_have_no_cycles():
    known = modules()
    graph = {m: {i for i in imports(p, top_level_only=True) if i in known and i != m}
             for m, p in known.items()}
    cycles = []
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []
