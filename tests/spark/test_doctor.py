"""``exactly doctor`` and ``exactly restore-offsets`` on a real checkpoint and sink log.

One checkpoint (a tiny exactly.files query under local[2]) per module, copied per test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from datagen_query import PER_EPOCH, ROWS, run_query

from exactly.cli import main
from exactly.procs import ProcessId, _stat


@pytest.fixture(scope="module")
def made(spark, tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("doctor")
    query = run_query(spark, base / "ck", base / "out")
    assert query.query.exception() is None
    return base


@pytest.fixture
def copy(made, tmp_path) -> Path:
    """A copy whose lease holder is a driver that has exited (this test's own driver JVM,
    which ran the query, still lives)."""
    shutil.copytree(made / "ck", tmp_path / "ck")
    shutil.copytree(made / "out", tmp_path / "out")
    write_lease(tmp_path / "out" / "_exactly", exited_pid(), 0)
    return tmp_path


def exited_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def snapshot(*roots: Path) -> dict[str, str]:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def doctor(copy: Path, *extra: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["doctor", str(copy / "ck"), *extra, "--json"])
    assert result.exit_code in (0, 1), result.output + (result.stderr or "")
    return result.exit_code, json.loads(result.stdout)


def findings(report: dict, severity: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if severity is None or f["severity"] == severity]


def sink_path(copy: Path) -> tuple[str, str]:
    return ("--sink-path", str(copy / "out"))


def name(epoch: int) -> str:
    return f"{epoch:020d}.json"


def test_a_clean_checkpoint_and_sink_log_exit_zero_and_name_the_query(copy):
    code, report = doctor(copy, *sink_path(copy))
    assert code == 0 and findings(report, "error") == []
    assert report["query_id"] == report["sink_query_id"] is not None


def test_doctor_reports_every_damaged_file_and_changes_nothing(copy):
    ck, log = copy / "ck", copy / "out" / "_exactly"
    (ck / "offsets" / "1").write_text("v1\n{\"batchWaterm")
    (ck / "commits" / "2").unlink()  # its .crc stays: a stray checksum
    (ck / "commits" / ".0.17ab.tmp").write_text("v1")
    (log / "lease.json").write_text('{"run_id": "r", "gen')
    (log / "complete" / name(1)).write_text("{")
    (log / "intents" / name(0)).write_text("")
    before = snapshot(copy)
    code, report = doctor(copy, *sink_path(copy))
    assert snapshot(copy) == before
    errors = {f["path"]: f for f in findings(report, "error")}
    assert code == 1
    assert set(errors) >= {str(ck / "offsets" / "1"), str(ck / "commits" / ".2.crc"),
                           str(log / "lease.json"), str(log / "complete" / name(1)),
                           str(log / "intents" / name(0))}
    assert errors[str(ck / "commits" / ".2.crc")]["repair"].startswith("delete ")
    assert errors[str(log / "lease.json")]["repair"].startswith("delete it once no driver")
    assert errors[str(log / "complete" / name(1))]["repair"].startswith(
        "delete it with the query stopped: recovery then finishes epoch 1 again")
    assert errors[str(log / "intents" / name(0))]["repair"].startswith(
        "delete it: epoch 0 is complete")
    warned = {f["path"] for f in findings(report, "warning")}
    assert str(ck / "commits" / ".0.17ab.tmp") in warned


def test_a_torn_intent_without_completion_says_when_deleting_it_is_safe(copy):
    log = copy / "out" / "_exactly"
    (log / "complete" / name(2)).unlink()
    (log / "intents" / name(2)).write_text('{"epoch": 2, "hand')
    code, report = doctor(copy, *sink_path(copy))
    error = next(f for f in findings(report, "error")
                 if f["path"] == str(log / "intents" / name(2)))
    assert "If nothing of epoch 2 is visible" in error["repair"]
    assert "restore it from a backup" in error["repair"] and code == 1


def test_doctor_reports_gaps_and_a_commit_without_its_offsets_entry(copy):
    ck = copy / "ck"
    for f in ("offsets/1", "offsets/.1.crc"):
        (ck / f).unlink()
    code, report = doctor(copy)
    problems = [f["problem"] for f in report["findings"]]
    assert any("offsets/1 missing inside offsets/0..2" in p for p in problems)
    assert any("commits/1 exists without offsets/1" in p for p in problems) and code == 1


def test_doctor_reports_a_sink_that_belongs_to_another_query(copy):
    owner = copy / "out" / "_exactly" / "query.json"
    owner.write_text(json.dumps({"query_id": "00000000-another-query"}))
    code, report = doctor(copy, *sink_path(copy))
    assert any(f["path"] == str(owner) and "OwnershipError" in f["problem"]
               for f in findings(report, "error")) and code == 1


def test_an_intent_without_completion_is_reported_as_pending_recovery(copy):
    (copy / "out" / "_exactly" / "complete" / name(2)).unlink()
    code, report = doctor(copy, *sink_path(copy))
    assert code == 0
    assert any("recovery is pending" in f["problem"] for f in findings(report, "info"))


def test_completed_epochs_beyond_sparks_offsets_are_errors_with_the_restore_command(copy):
    ck = copy / "ck"
    for f in ("offsets/2", "offsets/.2.crc", "commits/2", "commits/.2.crc"):
        (ck / f).unlink()
    code, report = doctor(copy, *sink_path(copy))
    assert code == 1
    error = next(f for f in findings(report, "error") if "ends at offsets/1" in f["problem"])
    assert error["path"] == str(copy / "out" / "_exactly" / "complete" / name(2))
    assert "exactly restore-offsets" in error["repair"] and "--epoch 2" in error["repair"]


def test_a_completed_epoch_whose_offsets_entry_changed_is_an_error(copy):
    entry = copy / "ck" / "offsets" / "2"
    lines = entry.read_text().splitlines()
    lines[2] = json.dumps({"rows": 999})  # Spark planned epoch 2 over other input
    entry.write_text("\n".join(lines))
    (copy / "ck" / "offsets" / ".2.crc").unlink()
    code, report = doctor(copy, *sink_path(copy))
    assert code == 1
    assert any("re-planned" in f["problem"] and "restore-offsets" in f["repair"]
               for f in findings(report, "error"))


def write_lease(log: Path, pid: int, start_ticks: int) -> None:
    holder = ProcessId(socket.gethostname(), pid, start_ticks)
    (log / "lease.json").write_text(json.dumps({
        "run_id": "another-run", "generation": 4, "holder": holder.to_json(),
        "acquired_at": 1.0, "renewed_at": 1.0}))


def test_doctor_names_the_lease_holder_and_whether_it_is_alive(copy):
    log = copy / "out" / "_exactly"
    _, report = doctor(copy, *sink_path(copy))
    lease = next(f for f in report["findings"] if f["path"] == str(log / "lease.json"))
    assert lease["severity"] == "info" and "that driver is gone" in lease["problem"]
    write_lease(log, 1, _stat(1)[2])  # pid 1 lives as long as the machine
    _, report = doctor(copy, *sink_path(copy))
    lease = next(f for f in report["findings"] if f["path"] == str(log / "lease.json"))
    assert lease["severity"] == "warning" and "driver pid 1" in lease["problem"]


def test_doctor_finds_the_sink_log_under_the_checkpoint_when_not_told(copy):
    shutil.copytree(copy / "out" / "_exactly", copy / "ck" / "exactly-sink")
    code, report = doctor(copy)
    assert code == 0 and report["sink_log"] == str(copy / "ck" / "exactly-sink")
    assert report["sink_query_id"] == report["query_id"]


def test_the_table_output_names_the_files_and_the_repairs(copy):
    (copy / "ck" / "commits" / "2").unlink()
    result = CliRunner().invoke(main, ["doctor", str(copy / "ck"), *sink_path(copy)])
    assert result.exit_code == 1
    assert ".2.crc" in result.stdout and "safe repair" in result.stdout


# -- restore-offsets -----------------------------------------------------------------------
def restore(copy: Path, epoch: int):
    return CliRunner().invoke(main, ["restore-offsets", str(copy / "ck"), *sink_path(copy),
                                     "--epoch", str(epoch)])


def test_restore_offsets_puts_back_a_torn_entry_and_the_query_resumes(spark, copy):
    entry = copy / "ck" / "offsets" / "2"
    original = entry.read_text()
    entry.write_text(original[:20])
    result = restore(copy, 2)
    assert result.exit_code == 0, result.stderr
    assert entry.read_text() == original and not (entry.parent / ".2.crc").exists()
    code, _ = doctor(copy, *sink_path(copy))
    assert code == 0
    query = run_query(spark, copy / "ck", copy / "out", rows=ROWS + PER_EPOCH)
    assert query.query.exception() is None
    assert (copy / "out" / "_exactly" / "complete" / name(3)).exists()


def test_restore_offsets_refuses_an_epoch_the_sink_has_no_record_of(copy):
    before = snapshot(copy)
    result = restore(copy, 7)
    assert result.exit_code == 1 and snapshot(copy) == before
    assert result.stderr.strip().splitlines()[-1].startswith(
        "restore-offsets failed: RefusedError: the sink log")
    assert "has no record of epoch 7" in result.stderr


def test_restore_offsets_refuses_when_the_entry_already_holds_the_recorded_input(copy):
    before = snapshot(copy)
    result = restore(copy, 2)
    assert result.exit_code == 1 and snapshot(copy) == before
    assert "already holds the input the sink recorded" in result.stderr.splitlines()[-1]


def test_restore_offsets_refuses_while_the_lease_holder_is_alive(copy):
    log = copy / "out" / "_exactly"
    (copy / "ck" / "offsets" / "2").write_text("v1\n{")
    write_lease(log, 1, _stat(1)[2])
    before = snapshot(copy)
    result = restore(copy, 2)
    assert result.exit_code == 1 and snapshot(copy) == before
    assert "the query seems to be running" in result.stderr.splitlines()[-1]
