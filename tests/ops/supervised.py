"""``exactly run`` of the job files in tests/ops/jobs (:mod:`exactly.testing.supervised`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from exactly.testing.supervised import EXACTLY
from exactly.testing.supervised import SupervisedRun as _SupervisedRun

JOBS = Path(__file__).parent / "jobs"

__all__ = ["EXACTLY", "JOBS", "SupervisedRun"]


class SupervisedRun(_SupervisedRun):
    """:class:`exactly.testing.supervised.SupervisedRun` of ``tests/ops/jobs/<job>``."""

    def __init__(self, job: str, checkpoint: Path | str, env: dict[str, str], *args: str,
                 log: Path, name_checkpoint: bool = True, wrap: Sequence[str] = ()) -> None:
        super().__init__(JOBS / job, checkpoint, env, *args, log=log,
                         name_checkpoint=name_checkpoint, wrap=wrap)
