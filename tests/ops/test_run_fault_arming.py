"""``exactly run`` without ``--checkpoint`` of a job that names none fails in one line.

(That the environment arms no fault and chooses no commit path, and that a run without
``--checkpoint`` runs on the checkpoint its job names, is shown by the second start of
tests/ops/test_launcher_where_it_runs.py; ``exactly run --fault`` does kill:
tests/ops/test_run_restarts.py.)"""

from __future__ import annotations

import subprocess

from supervised import EXACTLY


def test_a_run_without_checkpoint_of_a_job_that_names_none_fails_in_one_line(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("from exactly import Job\n"
                   "def build(spark):\n"
                   "    df = spark.readStream.format('exactly.datagen').load()\n"
                   f"    return Job(df, sink_format='exactly.files', path={str(tmp_path)!r})\n")
    shown = subprocess.run([*EXACTLY, "run", str(job)], capture_output=True, text=True,
                           timeout=180, cwd=tmp_path)
    assert shown.returncode == 3, shown.stderr
    last = shown.stderr.strip().splitlines()[-1]
    assert last.startswith("run failed: ConfigError: exactly run without --checkpoint: ")
    assert "give --checkpoint DIR, or CheckpointConfig(storage=DIR)" in last
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]
