import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from exactly.cli import main

#: what `exactly run` sets in its process's environment (``os.environ.setdefault``): run in
#: the test process, a command's setting ends with the command
COMMAND_ENV: dict[str, str | None] = {"EXACTLY_SPARK_LOG_LEVEL": None}


def write(directory: Path, ids: list[int]) -> None:
    directory.mkdir(parents=True)
    pq.write_table(pa.table({"id": ids}), directory / "part.parquet")


def test_verify_exits_zero_on_a_match_and_one_on_duplicates(tmp_path):
    write(tmp_path / "in", [1, 2, 3])
    write(tmp_path / "good" / "epoch-1", [3, 2, 1])
    write(tmp_path / "bad" / "epoch-1", [1, 2, 2, 3])
    ok = CliRunner(env=COMMAND_ENV).invoke(main, ["verify", "--input", str(tmp_path / "in"),
                                   "--output", str(tmp_path / "good")])
    assert ok.exit_code == 0 and "EXACTLY ONCE" in ok.output
    bad = CliRunner(env=COMMAND_ENV).invoke(main, ["verify", "--input", str(tmp_path / "in"),
                                    "--output", str(tmp_path / "bad"), "--json"])
    assert bad.exit_code == 1 and json.loads(bad.stdout)["duplicated"]["count"] == 1


def test_faults_lists_every_point():
    result = CliRunner(env=COMMAND_ENV).invoke(main, ["faults"])
    assert "after_intent" in result.output and "in_write" in result.output


def _run_cli(*args: str):
    from click.testing import CliRunner

    from exactly.cli import main

    return CliRunner(env=COMMAND_ENV).invoke(main, list(args))


def test_run_refuses_bad_restart_settings_before_anything_starts(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("def build(spark):\n    raise AssertionError('must not run')\n")
    ck = str(tmp_path / "ck")
    unknown = _run_cli("run", str(job), "--checkpoint", ck, "--restart-strategy", "sometimes")
    assert unknown.exit_code == 2 and "'sometimes' is not one of" in unknown.output
    negative = _run_cli("run", str(job), "--checkpoint", ck, "--restart-strategy",
                        "fixed-delay", "--restart-option", "delay=-1s")
    assert negative.exit_code == 3
    assert "fixed-delay.delay: a duration cannot be negative" in negative.output
    orphan = _run_cli("run", str(job), "--checkpoint", ck, "--restart-option", "attempts=2")
    assert orphan.exit_code == 3 and "without --restart-strategy" in orphan.output
    assert not (tmp_path / "ck").exists(), "a refused run must not touch the checkpoint"


def test_every_restart_strategy_name_the_docs_list_is_accepted_by_exactly_run(tmp_path):
    """docs/operations.md's strategy table and `exactly run --restart-strategy` agree: each
    name (and alias) the table lists reaches the strategy (here refused for an option it
    does not have, after the name was accepted), in any case."""
    import re

    lines = (Path(__file__).parents[2] / "docs" / "operations.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `--restart-strategy`"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    names = {n for line in rows for n in re.findall(r"`([a-z-]+)`", line.split("|")[1])}
    assert {"exponential-delay", "fixed-delay", "failure-rate", "none", "off"} <= names
    job = tmp_path / "job.py"
    job.write_text("def build(spark):\n    raise AssertionError('must not run')\n")
    for name in [*sorted(names), "Fixed-Delay", "OFF"]:
        result = _run_cli("run", str(job), "--checkpoint", str(tmp_path / "ck"),
                          "--restart-strategy", name, "--restart-option", "nonsense=1")
        assert result.exit_code == 3, (name, result.output)
        assert "has no option 'nonsense'" in result.output, (name, result.output)
    assert not (tmp_path / "ck").exists()


def test_stop_of_a_checkpoint_without_a_running_job_says_so(tmp_path):
    result = _run_cli("stop", str(tmp_path / "ck"))
    assert result.exit_code == 3
    assert "NoRunningJob: no running job on checkpoint" in result.output


def test_stop_with_savepoint_takes_the_checkpoint_with_or_without_a_target(tmp_path):
    """`stop --savepoint CK` (no TARGET) names the checkpoint, not a missing argument; the
    target forms reach the same checkpoint (here: no job runs on it, so each says that)."""
    ck = str(tmp_path / "ck")
    for args in (["--savepoint", ck], [ck, "--savepoint"], ["--savepoint", "sps", ck],
                 ["-p", "sps", ck], [ck, "--savepoint-path", "sps"]):
        result = _run_cli("stop", *args)
        assert result.exit_code == 3, (args, result.output)
        assert f"no running job on checkpoint {Path(ck).absolute()}" in result.output, args
    both = _run_cli("stop", ck, "--savepoint", "a", "--savepoint-path", "b")
    assert both.exit_code == 2 and "give the savepoint's TARGET once" in both.output
    neither = _run_cli("stop")
    assert neither.exit_code == 2 and "give the CHECKPOINT" in neither.output


def test_restore_options_without_a_savepoint_and_bad_savepoint_calls_are_refused(tmp_path):
    job = tmp_path / "job.py"
    job.write_text("def build(spark):\n    raise AssertionError('never built')\n")
    runner = CliRunner(env=COMMAND_ENV)
    lone = runner.invoke(main, ["run", str(job), "--checkpoint", str(tmp_path / "ck"),
                                "--parallelism", "3"])
    assert lone.exit_code == 2 and "add -s SAVEPOINT" in lone.output
    assert not (tmp_path / "ck").exists()
    incomplete = tmp_path / ".savepoint-3-abc.inprogress"
    incomplete.mkdir()
    refused = runner.invoke(main, ["run", str(job), "--checkpoint", str(tmp_path / "ck"),
                                   "-s", str(incomplete)])
    assert refused.exit_code == 3 and "incomplete savepoint" in refused.output
    assert not (tmp_path / "ck").exists()  # refused before anything started
    retained = tmp_path / "old-ck"
    (retained / "offsets").mkdir(parents=True)
    (retained / "metadata").write_text('{"id": "q"}\n')
    claimed = runner.invoke(main, ["run", str(job), "--checkpoint", str(tmp_path / "ck"),
                                   "-s", str(retained), "--restore-mode", "claim"])
    assert claimed.exit_code == 2 and "a restore only reads" in claimed.output
    assert not (tmp_path / "ck").exists()
    nothing = runner.invoke(main, ["savepoint"])
    assert nothing.exit_code == 2 and "give CHECKPOINT [TARGET]" in nothing.output
    other = runner.invoke(main, ["savepoint", "--dispose", str(tmp_path)])
    assert other.exit_code == 3 and "not a savepoint" in other.output and tmp_path.exists()


#: every command that takes a checkpoint, with what it needs besides
CHECKPOINT_COMMANDS = {
    "run": lambda ck, job: ["run", job, "--checkpoint", ck],
    "stop": lambda ck, job: ["stop", ck],
    "stop --savepoint": lambda ck, job: ["stop", "--savepoint", ck],
    "cancel": lambda ck, job: ["cancel", ck],
    "savepoint": lambda ck, job: ["savepoint", ck],
    "upgrade": lambda ck, job: ["upgrade", ck, job],
    "checkpoints": lambda ck, job: ["checkpoints", ck],
    "ui": lambda ck, job: ["ui", ck, "--port", "1"],
    "doctor": lambda ck, job: ["doctor", ck],
    "restore-offsets": lambda ck, job: ["restore-offsets", ck, "--epoch", "0"],
}


def _no_s3_settings(monkeypatch, tmp_path):
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.parametrize("command", sorted(CHECKPOINT_COMMANDS))
def test_a_checkpoint_uri_is_never_turned_into_a_local_directory(command, tmp_path,
                                                                  monkeypatch):
    """`--checkpoint s3a://...` once became a local directory named `s3a:`. Now every command
    takes an s3a:// checkpoint as one (without S3 settings: one line naming them), refuses
    another scheme in one line, and creates nothing in the working directory."""
    monkeypatch.chdir(tmp_path)
    _no_s3_settings(monkeypatch, tmp_path)
    job = tmp_path / "job.py"
    job.write_text("def build(spark):\n    raise AssertionError('must not run')\n")
    args = CHECKPOINT_COMMANDS[command]
    on_s3 = _run_cli(*args("s3a://lake/ck/orders", str(job)))
    assert on_s3.exit_code == 2, on_s3.output
    assert "checkpoint s3a://lake/ck/orders: no S3 credentials; set AWS_ACCESS_KEY_ID" in \
        on_s3.output
    elsewhere = _run_cli(*args("hdfs://namenode/ck/orders", str(job)))
    assert elsewhere.exit_code == 2, elsewhere.output
    assert "not on hdfs://" in elsewhere.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.py"]


def _doctor(directory: Path) -> tuple[int, list[dict]]:
    result = CliRunner(env=COMMAND_ENV).invoke(main, ["doctor", str(directory), "--json"])
    return result.exit_code, json.loads(result.stdout)["findings"]


def test_doctor_on_an_empty_directory_says_it_is_not_a_checkpoint_and_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    code, findings = _doctor(tmp_path / "empty")
    assert code == 1
    (error,) = [f for f in findings if f["severity"] == "error"]
    assert error["path"] == str(tmp_path / "empty")
    assert "not a checkpoint" in error["problem"] and "empty" in error["problem"]
    assert "--checkpoint DIR" in error["repair"]
    text = CliRunner(env=COMMAND_ENV).invoke(main, ["doctor", str(tmp_path / "empty")])
    assert text.exit_code == 1 and "clean" not in text.output


def test_doctor_on_an_input_directory_of_data_files_says_it_is_not_a_checkpoint(tmp_path):
    write(tmp_path / "in", [1, 2, 3])
    (tmp_path / "in" / "more.csv").write_text("id\n4\n")
    code, findings = _doctor(tmp_path / "in")
    assert code == 1
    (error,) = [f for f in findings if f["severity"] == "error"]
    assert error["path"] == str(tmp_path / "in")
    assert "not a checkpoint" in error["problem"] and "part.parquet" in error["problem"]


def test_doctor_on_a_checkpoint_whose_query_has_not_started_yet_reports_no_error(tmp_path):
    """``exactly run`` writes ``exactly-job/`` before Spark writes anything: a checkpoint in
    the making, not an error."""
    (tmp_path / "ck" / "exactly-job" / "history").mkdir(parents=True)
    code, findings = _doctor(tmp_path / "ck")
    assert code == 0
    assert not [f for f in findings if f["severity"] == "error"]
    assert any("no query has run on it yet" in f["problem"] for f in findings)


def test_checkpoint_of_a_checkpoint_without_a_running_job_says_so(tmp_path):
    result = _run_cli("checkpoint", str(tmp_path / "ck"))
    assert result.exit_code == 3
    assert "NoRunningJob: no running job on checkpoint" in result.output
