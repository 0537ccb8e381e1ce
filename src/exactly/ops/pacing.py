"""Epoch sizing and pacing: the driver side of admission control.

On Spark an epoch cannot be cut short once it runs (it is one BSP step), so the goal that
Flink's unaligned checkpoints serve — checkpoint time bounded under backpressure and after
an outage — is met by admitting per epoch only as many rows as fit in a target duration.

:class:`EpochSizer` is the controller: a pure function of the epochs it has seen.
:class:`Pacer` owns one query's admission file (:mod:`exactly.connectors.admission`), which
exactly's sources read before every epoch: it writes the minimum pause, the sizer's row
budget and the ``closed`` flag of a graceful stop.

The model: an epoch of ``r`` rows takes ``overhead + per_row * r`` seconds (Spark's fixed
cost per epoch plus the pipeline's cost per row), fitted with the Theil-Sen estimator
(median of pairwise slopes: one slow epoch — a GC pause, a slow commit — does not move it)
over the last :data:`WINDOW` epochs that had rows. The budget is the larger of what the fit
says fits in ``headroom * target`` and what the recent throughput says (``headroom * target``
times the median ``rows / duration`` of the last :data:`RATE_EPOCHS` epochs). The throughput
rule counts the overhead as per-row cost, so when scaling up it never over-estimates what
fits, and its fixed point is also ``duration = headroom * target``; it alone decides while the
fit is degenerate (too few epochs, all of about one size as in a steady state, no positive
slope), and it keeps a fit distorted by a change of regime from collapsing the budget. A
lasting slowdown shrinks the budget after two slow epochs (the median of three), one slow
epoch does not. When the fitted overhead alone misses the target and the last epochs all
did, the budget is ``min_rows`` and :attr:`EpochSizer.unreachable` is true.

The pacer polls progress, so a new budget reaches the sources one epoch late when epochs
run back to back (Spark plans the next epoch as soon as the previous one ends).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from exactly.connectors.admission import Admission
from exactly.errors import ConfigError
from exactly.fsutil import atomic_write_json

#: epochs (with rows) the model is fitted over
WINDOW = 8
#: epochs whose median throughput sizes the next epoch when the fit is degenerate
RATE_EPOCHS = 3
#: two epochs whose row counts differ by less than this fraction give no slope
MIN_SPREAD = 0.1
#: epochs needed before the overhead + per-row fit is trusted
MIN_FIT_EPOCHS = 4


class EpochSizer:
    """Rows the next epoch may take so that it completes within ``target_s``.

    ``observe(rows, duration_s)`` after every completed epoch (Spark's progress
    ``numInputRows`` and ``durationMs.triggerExecution``); ``budget()`` is the limit for the
    next one. Guarantees: ``min_rows <= budget()``; ``budget()`` never exceeds ``growth``
    times the previous budget, nor ``growth`` times the largest epoch in the window (or
    ``initial_rows`` if larger): the controller only ever extrapolates a bounded step from
    what it has measured (slow start at a start and after an idle stretch). Epochs without
    rows or with a non-positive duration are ignored.
    """

    def __init__(self, target_s: float, *, initial_rows: int = 10_000, min_rows: int = 100,
                 growth: float = 2.0, headroom: float = 0.8) -> None:
        if not target_s > 0 or not math.isfinite(target_s):
            raise ConfigError(f"EpochSizer: target_s must be a positive number of seconds, got "
                              f"{target_s!r}")
        if min_rows < 1 or initial_rows < min_rows:
            raise ConfigError(f"EpochSizer: need 1 <= min_rows <= initial_rows, got min_rows="
                              f"{min_rows}, initial_rows={initial_rows}")
        if not growth > 1:
            raise ConfigError(f"EpochSizer: growth must be > 1 (the slow-start factor), got "
                              f"{growth!r}")
        if not 0 < headroom <= 1:
            raise ConfigError(f"EpochSizer: headroom must be in (0, 1], got {headroom!r}")
        self.target_s = float(target_s)
        self.initial_rows = int(initial_rows)
        self.min_rows = int(min_rows)
        self.growth = float(growth)
        self.headroom = float(headroom)
        self._epochs: deque[tuple[int, float]] = deque(maxlen=WINDOW)
        self._budget = self.initial_rows
        self._fit: tuple[float, float] | None = None
        self._rate: float | None = None

    # -- inputs --------------------------------------------------------------------------
    def observe(self, rows: int, duration_s: float) -> None:
        """Record a completed epoch and recompute the budget."""
        if rows <= 0 or not duration_s > 0 or not math.isfinite(duration_s):
            return
        self._epochs.append((int(rows), float(duration_s)))
        self._fit = self._fit_model()
        recent = [r / d for r, d in list(self._epochs)[-RATE_EPOCHS:]]
        self._rate = float(np.median(recent))
        self._budget = self._next_budget()

    # -- outputs -------------------------------------------------------------------------
    def budget(self) -> int:
        """The most rows the next epoch may take."""
        return self._budget

    @property
    def overhead_s(self) -> float | None:
        """Fitted fixed cost of an epoch (seconds), ``None`` while the fit is degenerate."""
        return self._fit[0] if self._fit else None

    @property
    def per_row_s(self) -> float | None:
        """Fitted cost of one row (seconds), ``None`` while the fit is degenerate."""
        return self._fit[1] if self._fit else None

    def predict(self, rows: int) -> float | None:
        """Predicted duration of an epoch of ``rows`` rows; ``None`` before any epoch."""
        if self._fit is not None:
            overhead, per_row = self._fit
            return overhead + per_row * rows
        if self._rate:
            return rows / self._rate
        return None

    @property
    def unreachable(self) -> bool:
        """True when even a ``min_rows`` epoch is predicted to exceed the target (the fixed
        overhead alone is about the target or more): the budget is ``min_rows`` and the
        target cannot be met by sizing; the supervisor should say so."""
        predicted = self.predict(self.min_rows)
        return predicted is not None and predicted > self.target_s

    # -- model ---------------------------------------------------------------------------
    def _fit_model(self) -> tuple[float, float] | None:
        """Theil-Sen fit of ``duration = overhead + per_row * rows``; ``None`` if degenerate."""
        if len(self._epochs) < MIN_FIT_EPOCHS:
            return None
        slopes = [(d2 - d1) / (r2 - r1)
                  for (r1, d1), (r2, d2) in itertools.combinations(self._epochs, 2)
                  if abs(r2 - r1) >= MIN_SPREAD * max(r1, r2)]
        if len(slopes) < MIN_FIT_EPOCHS - 1:
            return None
        per_row = float(np.median(slopes))
        if not per_row > 0:
            return None
        overhead = float(np.median([d - per_row * r for r, d in self._epochs]))
        return max(0.0, overhead), per_row

    def _next_budget(self) -> int:
        goal = self.headroom * self.target_s
        assert self._rate is not None
        wanted = goal * self._rate
        recent = list(self._epochs)[-RATE_EPOCHS:]
        if self._fit is not None:
            overhead, per_row = self._fit
            if overhead >= goal and len(recent) == RATE_EPOCHS and all(
                    d > self.target_s for _, d in recent):
                wanted = self.min_rows  # the fixed cost alone misses the target, every time
            else:  # the fit may only add to what the throughput shows
                wanted = max(wanted, (goal - overhead) / per_row)
        largest = max(self.initial_rows, max(r for r, _ in self._epochs))
        ceiling = self.growth * min(self._budget, largest)
        return int(max(self.min_rows, min(wanted, ceiling)))


class Pacer:
    """Owns the admission file of one query: min pause, epoch sizing and graceful close.

    The file is replaced atomically on every change, so a source reads the old or the new
    admission, never a torn one. ``checkpoint_dir`` must be the query's local checkpoint
    directory: the pause is measured from its newest ``commits/N``. The first epoch with
    rows after :meth:`open` is not fed to the sizer (``warmup_epochs``): a fresh query's
    first epoch pays Python worker start-up and imports, which says nothing about its size.
    """

    def __init__(self, admission_file: Path, checkpoint_dir: str, *,
                 min_pause_s: float = 0.0, target_s: float | None = None,
                 warmup_epochs: int = 1) -> None:
        if min_pause_s < 0:
            raise ConfigError(f"Pacer: min_pause_s must be >= 0, got {min_pause_s!r}")
        self.path = Path(admission_file)
        self.checkpoint_dir = checkpoint_dir
        self.min_pause_s = float(min_pause_s)
        self.sizer = EpochSizer(target_s) if target_s is not None else None
        self.warmup_epochs = warmup_epochs
        self._closed = False
        self._pause_waived = False
        self._last_batch: int | None = None
        self._seen_epochs = 0
        self._written: Admission | None = None

    @property
    def admission(self) -> Admission:
        """The admission this pacer wants in force now."""
        pause = 0.0 if self._pause_waived else self.min_pause_s
        return Admission(checkpoint=self.checkpoint_dir, min_pause_s=pause,
                         max_rows=self.sizer.budget() if self.sizer else None,
                         closed=self._closed)

    def open(self) -> Admission:
        """Write the admission file (before the query starts)."""
        return self._write()

    def observe_progress(self, progress: dict[str, Any]) -> bool:
        """Feed one ``StreamingQueryProgress`` (its JSON dict) to the sizer.

        Entries without rows and batch ids already seen are ignored. Returns True when the
        admission file was rewritten (the budget changed).
        """
        rows = int(progress.get("numInputRows") or 0)
        batch = progress.get("batchId")
        if rows <= 0 or batch is None:
            return False
        batch = int(batch)
        if self._last_batch is not None and batch <= self._last_batch:
            return False
        self._last_batch = batch
        self._seen_epochs += 1
        if self.sizer is None or self._seen_epochs <= self.warmup_epochs:
            return False
        duration_ms = (progress.get("durationMs") or {}).get("triggerExecution")
        if duration_ms is None:
            return False
        self.sizer.observe(rows, float(duration_ms) / 1000.0)
        if self.admission == self._written:
            return False
        self._write()
        return True

    def close_admission(self) -> None:
        """Admit nothing more (a graceful stop: the epoch in flight finishes)."""
        self._closed = True
        self._write()

    def reopen(self) -> None:
        """Admit again after :meth:`close_admission`."""
        self._closed = False
        self._write()

    def waive_pause(self, waived: bool) -> None:
        """Waive the min pause (a manual checkpoint: ``exactly checkpoint``) or restore it;
        rewrites the admission file only when that changes it. ``closed`` still wins."""
        if waived == self._pause_waived:
            return
        self._pause_waived = waived
        self._write()

    def remove(self) -> None:
        """Delete the admission file: sources behave as Spark alone would."""
        self.path.unlink(missing_ok=True)
        self._written = None

    def _write(self) -> Admission:
        admission = self.admission
        atomic_write_json(self.path, admission.to_json())
        self._written = admission
        return admission
