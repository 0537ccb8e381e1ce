"""The package's modules and their syntax trees, read and parsed once per test process:
test_layout, test_dependencies and test_environment_variables each look at every module
(a parse of the whole source costs seconds)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import exactly

SRC = Path(exactly.__file__).resolve().parent


@functools.cache
def files() -> tuple[Path, ...]:
    """Every ``.py`` file of the package, sorted."""
    return tuple(sorted(SRC.rglob("*.py")))


def tree(path: Path) -> ast.Module:
    """The syntax tree of ``path`` (parsed once; the source does not change meanwhile)."""
    return _parsed(path.resolve())


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))
