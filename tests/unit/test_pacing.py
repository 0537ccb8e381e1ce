"""The epoch sizer and the pacer, driven with synthetic epochs (no Spark)."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from exactly.connectors.admission import Admission
from exactly.errors import ConfigError
from exactly.ops.pacing import EpochSizer, Pacer

OVERHEAD_S, PER_ROW_S = 0.3, 20e-6  # a transform costing 0.3 s + 20 µs per row
TARGET_S = 2.0


def cost(rows: int) -> float:
    return OVERHEAD_S + PER_ROW_S * rows


def drive(sizer: EpochSizer, epochs: int, duration=cost, noise: float = 0.0,
          seed: int = 0) -> list[tuple[int, float]]:
    """Run ``epochs`` epochs of the budget's size; return (rows, duration) of each."""
    rnd = random.Random(seed)
    seen = []
    for _ in range(epochs):
        rows = sizer.budget()
        took = duration(rows) * (1 + rnd.uniform(-noise, noise))
        sizer.observe(rows, took)
        seen.append((rows, took))
    return seen


def test_the_budget_converges_so_that_predicted_epochs_fit_the_target():
    sizer = EpochSizer(TARGET_S)
    drive(sizer, 12)
    budget = sizer.budget()
    assert cost(budget) <= TARGET_S
    # it uses the room it has: headroom 0.8 of 2 s is 65,000 rows of this transform
    assert budget == pytest.approx((0.8 * TARGET_S - OVERHEAD_S) / PER_ROW_S, rel=0.02)
    assert not sizer.unreachable


def test_noisy_epochs_stay_within_the_target():
    sizer = EpochSizer(TARGET_S)
    seen = drive(sizer, 40, noise=0.1, seed=3)
    assert all(took <= TARGET_S for _, took in seen)
    assert min(rows for rows, _ in seen[10:]) > 40_000  # and stay near the 65,000 it can take


def test_the_budget_grows_at_most_by_the_growth_factor_from_a_small_start():
    sizer = EpochSizer(TARGET_S, initial_rows=1_000, growth=2.0)
    seen = drive(sizer, 12, duration=lambda rows: PER_ROW_S * rows)  # no overhead: all fits
    budgets = [rows for rows, _ in seen]
    assert budgets[0] == 1_000
    assert all(b <= 2 * a for a, b in itertools.pairwise(budgets))
    assert budgets[:6] == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000]


def test_after_an_idle_stretch_the_budget_starts_small_again():
    sizer = EpochSizer(TARGET_S, initial_rows=10_000)
    drive(sizer, 12)
    assert sizer.budget() > 60_000
    for _ in range(8):  # input trickles in: epochs far below the budget
        sizer.observe(50, cost(50))
    assert sizer.budget() <= 2 * 10_000  # a backlog arriving now is taken in slow start


def test_one_slow_epoch_does_not_move_the_budget():
    sizer = EpochSizer(TARGET_S)
    drive(sizer, 12)
    settled = sizer.budget()
    sizer.observe(settled, 6 * cost(settled))  # a GC pause, a slow commit
    assert sizer.budget() == pytest.approx(settled, rel=0.05)
    drive(sizer, 3)
    assert sizer.budget() == pytest.approx(settled, rel=0.05)


def test_a_lasting_slowdown_shrinks_the_budget_within_two_epochs():
    sizer = EpochSizer(TARGET_S)
    drive(sizer, 12)
    slower = drive(sizer, 6, duration=lambda rows: OVERHEAD_S + 3 * PER_ROW_S * rows)
    assert [took > TARGET_S for _, took in slower] == [True, True, False, False, False, False]


def test_an_overhead_above_the_target_gives_min_rows_and_says_the_target_is_unreachable():
    sizer = EpochSizer(TARGET_S, min_rows=100)
    drive(sizer, 10, duration=lambda rows: 3.0 + PER_ROW_S * rows)
    assert sizer.budget() == 100
    assert sizer.unreachable


def test_epochs_without_rows_are_ignored():
    sizer = EpochSizer(TARGET_S, initial_rows=5_000)
    sizer.observe(0, 0.3)
    sizer.observe(100, 0.0)
    assert sizer.budget() == 5_000
    assert sizer.predict(1) is None


@pytest.mark.parametrize("kwargs", [
    {"target_s": 0}, {"target_s": 1, "growth": 1.0}, {"target_s": 1, "headroom": 1.5},
    {"target_s": 1, "min_rows": 10, "initial_rows": 5}, {"target_s": 1, "min_rows": 0},
])
def test_impossible_sizer_settings_are_refused(kwargs):
    with pytest.raises(ConfigError, match="EpochSizer"):
        EpochSizer(**kwargs)


# -- Pacer ---------------------------------------------------------------------------------
def admission(path: Path) -> dict:
    return json.loads(path.read_text())


def progress(batch: int, rows: int, duration_ms: float) -> dict:
    return {"batchId": batch, "numInputRows": rows,
            "durationMs": {"triggerExecution": duration_ms, "addBatch": duration_ms / 2}}


def test_the_pacer_writes_the_pause_and_the_sizers_budget(tmp_path):
    path = tmp_path / "admission.json"
    pacer = Pacer(path, "/ck/q1", min_pause_s=1.5, target_s=TARGET_S)
    pacer.open()
    assert admission(path) == {"checkpoint": "/ck/q1", "min_pause_s": 1.5,
                               "max_rows": 10_000, "closed": False}
    assert Admission.from_json(admission(path)) == pacer.admission


def test_the_pacer_feeds_new_epochs_with_rows_only_and_rewrites_on_a_change(tmp_path):
    path = tmp_path / "admission.json"
    pacer = Pacer(path, "/ck/q1", target_s=TARGET_S)
    pacer.open()
    assert not pacer.observe_progress(progress(0, 10_000, 5_000))  # start-up epoch: not fed
    assert not pacer.observe_progress(progress(1, 0, 300))  # no data
    assert not pacer.observe_progress({"batchId": 1, "numInputRows": 5})  # no duration
    assert pacer.observe_progress(progress(2, 10_000, cost(10_000) * 1000))
    assert admission(path)["max_rows"] == 20_000 == pacer.sizer.budget()
    path.unlink()
    assert not pacer.observe_progress(progress(2, 10_000, 100))  # already seen: no rewrite
    assert not pacer.observe_progress(progress(1, 10_000, 100))  # older: ignored
    assert not path.exists()


def test_without_a_target_the_pacer_admits_any_size(tmp_path):
    path = tmp_path / "admission.json"
    pacer = Pacer(path, "/ck/q1", min_pause_s=0.5)
    pacer.open()
    assert not pacer.observe_progress(progress(3, 1_000_000, 60_000))
    assert admission(path)["max_rows"] is None


def test_close_reopen_and_remove_control_the_file(tmp_path):
    path = tmp_path / "admission.json"
    pacer = Pacer(path, "/ck/q1")
    pacer.open()
    pacer.close_admission()
    assert admission(path)["closed"] is True
    assert Admission.from_json(admission(path)).row_budget() == 0
    assert Admission.from_json(admission(path)).row_budget(bounded_run=True) is None
    pacer.reopen()
    assert admission(path)["closed"] is False
    pacer.remove()
    assert not path.exists()
    pacer.remove()  # twice is fine
