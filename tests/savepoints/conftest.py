"""Fixtures of the savepoint tests (helpers: savepoint_jobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def savepoints(tmp_path: Path) -> Path:
    return tmp_path / "savepoints"
