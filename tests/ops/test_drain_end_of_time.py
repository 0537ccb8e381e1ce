"""``exactly stop --drain`` advances the event-time watermark to the end of time (issue 46).

The final epoch replays the last source offsets (no input) with the watermark at
9999-12-31, so the windows no row's event time closes are emitted and committed before
the stop, as Flink's ``stop --drain`` fires every window."""

from __future__ import annotations

import pandas as pd
import pytest
from supervised import SupervisedRun

from exactly.audit import data_files
from exactly.checkpoint.spark_files import END_OF_TIME_MS, read_offsets


def _committed(out) -> pd.DataFrame:
    """The window counts the files sink committed below ``out`` (empty before any)."""
    files = data_files(out) if out.exists() else []
    if not files:
        return pd.DataFrame(columns=["window_start", "k", "count"])
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def _expected(rows: int) -> pd.DataFrame:
    """The batch computation of the job over its whole input: every window, counted."""
    ids = pd.Series(range(rows))
    frame = pd.DataFrame({"window_start": ids // 10 * 10, "k": ids % 3})
    return frame.groupby(["window_start", "k"]).size().rename("count").reset_index()


def _rows(frame: pd.DataFrame) -> list[tuple[int, int, int]]:
    return sorted((int(a), int(b), int(c))
                  for a, b, c in frame[["window_start", "k", "count"]].itertuples(index=False))


def _drain(tmp_path, *stop_args: str) -> tuple[str, object]:
    """Run the windowed job, check the last window waits, ``exactly stop --drain`` it;
    returns the stop's answer and the checkpoint."""
    rows, out, ck = 95, tmp_path / "out", tmp_path / "ck"
    run = SupervisedRun("windowed_job.py", ck, {"JOB_OUT": str(out), "JOB_ROWS": str(rows)},
                        log=tmp_path / "run.log")
    try:  # the input is in; the watermark (94 s) closed the windows before [90, 100)
        run.wait_for(lambda: (_committed(out)["window_start"] == 80).any(),
                     "the windows below the watermark")
        assert not (_committed(out)["window_start"] == 90).any()
        drained = run.command("stop", "--drain", *stop_args, str(ck))
        answer = drained.stdout + drained.stderr
        assert drained.returncode == 0, answer
        assert "end of time" in answer
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
        status = run.status()
        assert status is not None and "end of time" in status.detail, status
    finally:
        run.close()
    assert _rows(_committed(out)) == _rows(_expected(rows))
    last = max(int(p.name) for p in (ck / "offsets").iterdir() if p.name.isdigit())
    entry = read_offsets(str(ck), last)
    assert entry is not None and entry.metadata["batchWatermarkMs"] == END_OF_TIME_MS
    assert (ck / "commits" / str(last)).exists()
    return answer, ck


# CI budget: a slow proof; the drain with a savepoint below runs the same drain and checks
@pytest.mark.slow
def test_stop_drain_fires_the_windows_only_the_end_of_time_watermark_closes(tmp_path):
    _drain(tmp_path)


def test_stop_drain_with_savepoint_takes_it_after_the_final_epoch(tmp_path):
    answer, ck = _drain(tmp_path, "--savepoint", str(tmp_path / "sp"))
    assert "savepoint" in answer and str(tmp_path / "sp") in answer, answer
    last = max(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert [p.name for p in (tmp_path / "sp").iterdir()
            if p.name.startswith(f"savepoint-{last}-")], answer  # holds the final epoch


def test_stop_drain_fires_the_event_time_timers_no_row_reaches(tmp_path):
    """transformWithStateInPandas (EventTime): each key's timer at 2001 emits its total
    only when the drain's final epoch advances the watermark to the end of time."""
    rows, out, ck = 95, tmp_path / "out", tmp_path / "ck"
    run = SupervisedRun("event_timer_job.py", ck, {"JOB_OUT": str(out), "JOB_ROWS": str(rows)},
                        log=tmp_path / "run.log")
    try:  # the input is in and committed; no timer has fired
        run.wait_for(lambda: len(run.committed_epochs()) >= 1, "the input committed")
        assert _committed(out).empty
        drained = run.command("stop", "--drain", str(ck))
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert run.wait(timeout=120) == 0, run.output()[-3000:]
    finally:
        run.close()
    found = sorted(map(tuple, _committed(out)[["k", "count"]].astype(int).values.tolist()))
    ids = pd.Series(range(rows))
    assert found == sorted((int(k), int(n)) for k, n in (ids % 3).value_counts().items())
