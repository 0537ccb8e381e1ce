"""The wheel installed as a user installs it: built from the checkout (sdist, then the wheel
from the sdist), installed with pip into a fresh virtualenv outside the checkout, and run
with an empty cache directory and a ``PATH`` that has ``java`` but no ``javac``, ``jar``,
``mvn``, ``npm``, ``npx`` or ``node``.

``installed_wheel`` (session scope) is shared by every scenario: build and install cost about
half a minute once. A new scenario takes the fixture and runs commands with
``installed_wheel.run(...)`` / ``installed_wheel.start(...)`` (the venv's ``exactly``,
``python``, ...), in ``installed_wheel.workdir``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).parents[2]
#: tools a user of the wheel does not have: the runtime needs a Java runtime only
HIDDEN_TOOLS = ("javac", "jar", "mvn", "npm", "npx", "node")
#: what the build needs in the fresh venv besides the pinned PySpark (removed before the
#: wheel is installed, so they cannot stand in for an undeclared runtime dependency)
BUILD_TOOLS = ("setuptools>=77", "build>=1.2")
STATE_WRITER = "exactly/spark/jvm/exactly-state-writer.jar"
#: packages of the testkit extra: not installed by ``pip install exactly``
TESTKIT_MODULES = ("port_for", "pytest", "selenium")


def pinned_pyspark() -> str:
    found = re.search(r'"pyspark(?:\[[^\]]*\])?(==[^"]+)"',
                      (CHECKOUT / "pyproject.toml").read_text())
    assert found, "pyproject.toml pins pyspark"
    return "pyspark" + found.group(1)


@dataclass
class InstalledWheel:
    """The installed wheel: its virtualenv, the user's environment, a working directory."""

    wheel: Path
    sdist: Path
    venv: Path
    env: dict[str, str]  # the user's environment: venv bin + tools without a JDK's extras
    workdir: Path  # outside the checkout
    cache: Path  # XDG_CACHE_HOME, empty at the start

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        return next((self.venv / "lib").glob("python3.*/site-packages"))

    def run(self, *command: str | Path, timeout: float = 300, check: bool = True,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``command`` (``exactly ...``: the venv's) as the user (``env``: more
        variables); fails the test with the output when it exits non-zero and ``check``."""
        result = subprocess.run([str(c) for c in command], env={**self.env, **(env or {})},
                                cwd=self.workdir, capture_output=True, text=True,
                                timeout=timeout)
        if check:
            assert result.returncode == 0, (f"{command} exited {result.returncode}:\n"
                                            f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
        return result

    def start(self, *command: str | Path, log: Path,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``command`` in the background as the user, its output into ``log``."""
        with open(log, "ab") as out:
            return subprocess.Popen([str(c) for c in command], env={**self.env, **(env or {})},
                                    cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)


def _clean_env() -> dict[str, str]:
    """The test's environment without what points Python at the checkout (its PYTHONPATH
    would show pip the checkout's sources as exactly, already installed)."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _pip(venv: Path, *args: str) -> None:
    result = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "-q",
                             "--disable-pip-version-check", *args], env=_clean_env(),
                            cwd=venv.parent, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"pip {args}:\n{result.stdout}\n{result.stderr}"


def _tools_without_jdk_extras(directory: Path) -> Path:
    """A directory of symlinks to everything in /usr/bin and /bin but ``HIDDEN_TOOLS``."""
    directory.mkdir()
    for folder in (Path("/usr/bin"), Path("/bin")):
        for tool in folder.iterdir():
            if tool.name not in HIDDEN_TOOLS and not (directory / tool.name).exists():
                (directory / tool.name).symlink_to(tool)
    return directory


def _user_env(venv: Path, tools: Path, cache: Path) -> dict[str, str]:
    """The test's environment without anything pointing into the checkout or its caches
    (PYTHONPATH, PySpark's and exactly's settings, JAVA_HOME, the virtualenv)."""
    kept = {k: v for k, v in _clean_env().items()
            if k != "JAVA_HOME" and not k.startswith(("PYSPARK_", "SPARK_"))
            and (not k.startswith("EXACTLY_") or k == "EXACTLY_DRIVER_JAVA_OPTIONS")}
    return {**kept, "PATH": f"{venv / 'bin'}:{tools}", "XDG_CACHE_HOME": str(cache)}


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    root = tmp_path_factory.mktemp("wheel-install")
    assert not root.is_relative_to(CHECKOUT)
    venv, dist = root / "venv", root / "dist"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120,
                   env=_clean_env())
    # the build: sdist, then the wheel from the unpacked sdist, in this venv (no isolation:
    # PySpark is installed once and stays for the runtime)
    _pip(venv, "install", *BUILD_TOOLS, pinned_pyspark())
    built = subprocess.run([str(venv / "bin" / "python"), "-m", "build", "--no-isolation",
                            "--outdir", str(dist), str(CHECKOUT)],
                           capture_output=True, text=True, timeout=600, cwd=root,
                           env=_clean_env())
    assert built.returncode == 0, f"{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    [wheel], [sdist] = dist.glob("exactly-*.whl"), dist.glob("exactly-*.tar.gz")
    assert STATE_WRITER in zipfile.ZipFile(wheel).namelist(), "the wheel carries the jar"
    _pip(venv, "uninstall", "-y", "build", "pyproject_hooks", "setuptools")
    # the install: pip alone (dependencies from the pip cache or PyPI)
    _pip(venv, "install", str(wheel))
    assert list(venv.glob("lib/python3.*/site-packages/exactly/cli.py")), "installed"
    for module in TESTKIT_MODULES:  # the scenarios run without the testkit extra
        assert not list(venv.glob(f"lib/python3.*/site-packages/{module}")), module

    cache, workdir = root / "cache", root / "work"
    cache.mkdir()
    workdir.mkdir()
    env = _user_env(venv, _tools_without_jdk_extras(root / "tools"), cache)
    java = subprocess.run(["java", "-version"], env=env, capture_output=True, text=True)
    assert java.returncode == 0, java.stderr
    for tool in HIDDEN_TOOLS:
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    return InstalledWheel(wheel=wheel, sdist=sdist, venv=venv, env=env, workdir=workdir,
                          cache=cache)
