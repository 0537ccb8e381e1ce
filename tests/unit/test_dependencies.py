"""What ``pip install exactly`` brings is enough for the library: the packages of the
``testkit`` extra (the test kit's ports, pytest plugin and browser driver) are needed only by
``exactly.testing``. Every other module imports with them blocked, and none imports them
inside a function either."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from importlib.metadata import packages_distributions

import tomllib
from source_tree import SRC, files, tree

PYPROJECT = SRC.parents[1] / "pyproject.toml"

#: imports every module of the package except the test kit, with ``BLOCKED`` unimportable
IMPORT_ALL = """
import importlib, importlib.abc, pkgutil, sys
BLOCKED = set(sys.argv[1].split(","))

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: testkit extra)")
        return None

sys.meta_path.insert(0, Block())
import exactly
names = [m.name for m in pkgutil.walk_packages(exactly.__path__, "exactly.")
         if not m.name.startswith("exactly.testing")]
for name in names:
    importlib.import_module(name)
leaked = sorted(n for n in sys.modules if n.split(".")[0] in BLOCKED)
assert not leaked, leaked
print(len(names))
"""


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


@functools.cache
def extra_modules() -> frozenset[str]:
    """Top-level import names of the distributions in the ``testkit`` extra (from the
    installed distributions' file lists; read once per test session)."""
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    extra = {_name(r) for r in project["optional-dependencies"]["testkit"]}
    assert not extra & runtime, extra & runtime
    modules = {module for module, dists in packages_distributions().items()
               if {d.lower().replace("_", "-") for d in dists} & extra}
    assert {"port_for", "pytest", "selenium"} <= modules, modules
    return frozenset(modules)


def test_every_module_but_the_test_kit_imports_without_the_testkit_extra(tmp_path):
    blocked = extra_modules()
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL, ",".join(sorted(blocked))],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip()) > 100  # every module of the package, not a few


def test_no_module_but_the_test_kit_imports_a_testkit_package_even_inside_a_function():
    blocked = extra_modules()
    found = []
    for path in files():
        if path.relative_to(SRC).parts[0] == "testing":
            continue
        for node in ast.walk(tree(path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and node.level == 0 else [])
            found += [f"{path.relative_to(SRC)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in blocked]
    assert not found, found
