"""exactly's build backend: setuptools' own (``setup.py`` adds the state writer's jar to a
wheel), plus the pinned PySpark in the isolated environment of a wheel build, whose jars the
state writer compiles against. An sdist or an editable install needs setuptools only."""

from __future__ import annotations

import re
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every hook not overridden below


def _pyspark_requirement() -> str:
    """The ``pyspark==...`` requirement of ``[project] dependencies`` in pyproject.toml."""
    text = Path("pyproject.toml").read_text()
    found = re.search(r'"pyspark(?:\[[^\]]*\])?\s*(==\s*[^"]+)"', text)
    if found is None:
        raise RuntimeError("pyproject.toml names no pinned pyspark dependency (pyspark==...)")
    return "pyspark" + found.group(1)


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    return [*_setuptools.get_requires_for_build_wheel(config_settings), _pyspark_requirement()]
