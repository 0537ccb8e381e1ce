"""The package layout's rules (docs/design.md section 8), checked on the source's import statements.

* the protocol knows no connector and no Spark adapter;
* a connector never imports another target's connector (shared SQL plumbing excepted);
* library modules never import the test kit (``exactly.testing``) or the demos;
* no import cycles among module-level imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import exactly

SRC = Path(exactly.__file__).parent
#: modules every connector may share (not a target of their own)
SHARED_CONNECTOR_MODULES = {"exactly.connectors.sql", "exactly.connectors.admission"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, *, top_level_only: bool) -> set[str]:
    """``exactly.*`` modules imported by ``path`` (optionally only at module level)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
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
    return found


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def target_of(module: str) -> str | None:
    """``postgres`` for exactly.connectors.postgres.two_phase, ``wal`` for ...wal."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "connectors" and module not in SHARED_CONNECTOR_MODULES:
        return parts[2]
    return None


#: the reader of Spark's checkpoint files: plain file parsing, no pyspark. The protocol
#: reads each epoch's input positions (offsets/N) through it (epoch identity).
CHECKPOINT_FILES = "exactly.spark.checkpoint"


def test_the_protocol_imports_no_connector_and_no_spark_adapter():
    bad = {(m, i) for m, p in modules().items() if m.startswith("exactly.protocol")
           for i in imports(p, top_level_only=False)
           if i.startswith(("exactly.connectors", "exactly.spark", "exactly.demos",
                            "exactly.testing", "exactly.ops")) and i != CHECKPOINT_FILES}
    assert bad == set()
    source = modules()[CHECKPOINT_FILES].read_text()
    assert "pyspark" not in source, "the checkpoint file reader must not need Spark"


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
    graph = {m: {i for i in imports(p, top_level_only=True) if i in modules() and i != m}
             for m, p in modules().items()}
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
