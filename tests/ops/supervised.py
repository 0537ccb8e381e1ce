"""``exactly run`` of the job files in tests/ops/jobs (:mod:`exactly.testing.supervised`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from exactly.audit import audit_ids, file_ids
from exactly.testing.supervised import EXACTLY
from exactly.testing.supervised import SupervisedRun as _SupervisedRun

JOBS = Path(__file__).parent / "jobs"

__all__ = ["EXACTLY", "JOBS", "SupervisedRun", "audit_rows", "ids_in"]


def ids_in(out: Path) -> int:
    """The distinct ids the file sink committed below ``out`` so far; 0 before its first
    commit made the directory (a job shows ``running`` before that)."""
    if not out.exists():
        return 0
    return len(np.unique(file_ids(out)[0]))


def audit_rows(out: Path, rows: int) -> None:
    """Every id 0..``rows``-1 exactly once below ``out``, and no other (the generator's)."""
    report = audit_ids(file_ids(out)[0], np.arange(rows, dtype=np.int64))
    assert report.ok, report.rows()


class SupervisedRun(_SupervisedRun):
    """:class:`exactly.testing.supervised.SupervisedRun` of ``tests/ops/jobs/<job>``."""

    def __init__(self, job: str, checkpoint: Path | str, env: dict[str, str], *args: str,
                 log: Path, name_checkpoint: bool = True, wrap: Sequence[str] = ()) -> None:
        super().__init__(JOBS / job, checkpoint, env, *args, log=log,
                         name_checkpoint=name_checkpoint, wrap=wrap)
