"""The environment variables exactly reads are the ones docs/configuration.md lists (the page
the README points to), and none is a test switch: a fault is never armed, and the commit path
never chosen, by the environment; the internal plumbing variables cannot make a fault kill
anything beyond the job's own tree."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from source_tree import tree

from exactly.ops.driver import admission_named, job_admission_file
from exactly.procs import JOB_TOKEN_ENV, new_job_token
from exactly.protocol.faults import FaultSpec, action_for, fault_from, kill_process

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "exactly"
README = ROOT / "README.md"
CONFIGURATION = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"^_?EXACTLY_[A-Z][A-Z0-9_]*$")
MENTION = re.compile(r"(?<![\w.])_?EXACTLY_[A-Z][A-Z0-9_]*\b")
#: the test switches this repository once read from the environment
TEST_SWITCHES = {"EXACTLY_FAULT", "EXACTLY_FAULT_MARKER", "EXACTLY_FAULT_ACTION",
                 "EXACTLY_COMMIT_PATH", "EXACTLY_RUN_ID"}


def _strings(path: Path) -> list[str]:
    return [node.value for node in ast.walk(tree(path))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def variables_in_source() -> tuple[set[str], set[str], set[str]]:
    """(names the product uses, names only the test kit uses, names mentioned in the
    product's strings and docstrings). A name is a string constant that is a variable name
    (what ``os.environ.get`` and the ``*_ENV`` constants hold)."""
    product: set[str] = set()
    kit: set[str] = set()
    mentioned: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        in_kit = "testing" in path.relative_to(PACKAGE).parts
        for text in _strings(path):
            if NAME.match(text):
                (kit if in_kit else product).add(text)
            elif not in_kit:
                mentioned.update(MENTION.findall(text))
    return product, kit - product, mentioned


def documented_tables() -> list[set[str]]:
    """The variable names of each table in docs/configuration.md's section "Environment
    variables"."""
    text = CONFIGURATION.read_text()
    start = text.index("\n## Environment variables\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end != -1 else len(text)]
    tables: list[set[str]] = []
    in_table = False
    for line in section.splitlines():
        row = re.match(r"^\| `(_?EXACTLY_[A-Z0-9_]+)` \|", line)
        if line.startswith("|") and not in_table:
            tables.append(set())
        in_table = line.startswith("|")
        if row:
            tables[-1].add(row.group(1))
    return tables


def test_the_configuration_page_lists_exactly_the_variables_the_source_reads():
    product, kit, mentioned = variables_in_source()
    documented, kit_documented = documented_tables()
    assert "docs/configuration.md" in README.read_text(), "the README must link to the tables"
    assert product == documented, (
        f"read but not in docs/configuration.md's table: {sorted(product - documented)}; in "
        f"the table but read nowhere: {sorted(documented - product)}")
    assert kit == kit_documented, (
        f"read by the test kit but not in its table: {sorted(kit - kit_documented)}; in its "
        f"table but read nowhere: {sorted(kit_documented - kit)}")
    assert mentioned <= product, (
        f"named in the product's text but read nowhere: {sorted(mentioned - product)}")
    assert not (product | kit) & TEST_SWITCHES


def test_the_environment_arms_no_fault(monkeypatch, tmp_path):
    monkeypatch.setenv("EXACTLY_FAULT", "after_intent")
    monkeypatch.setenv("EXACTLY_FAULT_MARKER", str(tmp_path / "fired"))
    monkeypatch.setenv("EXACTLY_FAULT_ACTION", f"pause:{tmp_path / 'hold'}")
    assert fault_from({}) is None
    armed = fault_from({"exactly.fault": "after_intent@2"})
    assert armed == FaultSpec("after_intent", 2)
    assert armed.marker is None and action_for(armed.action) is kill_process


def test_a_job_token_that_exactly_did_not_set_makes_a_fault_kill_nothing_beyond_the_job(
        tmp_path):
    """A fault kills the processes carrying the job's token: with a token set by hand
    (a stray variable, shared with processes outside the job) it must not reach them; with
    a token its launcher made (this test process, an ancestor of the job) it does."""
    probe = textwrap.dedent("""
        from exactly.procs import local_job_pids
        print(local_job_pids())
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    sleepers = []
    try:
        for token in ("stray", new_job_token()):
            sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                       env={**env, JOB_TOKEN_ENV: token})
            sleepers.append(sleeper)
            found = subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                   text=True, env={**env, JOB_TOKEN_ENV: token}, timeout=60)
            assert found.returncode == 0, found.stderr
            killed = sleeper.pid in ast.literal_eval(found.stdout.strip())
            assert killed == (token != "stray"), (token, found.stdout)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()


def test_a_stray_admission_file_variable_names_no_file_exactly_writes(monkeypatch, tmp_path):
    """The pacer writes (and deletes) only the job's own admission file; a variable naming
    another file is not exactly's, so it does not count as the sources' admission file."""
    own = job_admission_file(tmp_path / "ck" / "exactly-job")
    assert own == tmp_path / "ck" / "exactly-job" / "admission.json"
    from exactly.connectors.admission import ADMISSION_FILE_ENV

    monkeypatch.setenv(ADMISSION_FILE_ENV, str(tmp_path / "precious.txt"))
    assert not admission_named(own)
    monkeypatch.setenv(ADMISSION_FILE_ENV, str(own))
    assert admission_named(own)


@pytest.mark.parametrize("flags", [
    ["--fault", "after_intent@1"],
    ["--fault", "restore.state@0", "--fault-marker", "/tmp/m.json"],
    ["--fault", "in_write@2", "--fault-marker", "/tmp/m.json", "--fault-action", "pause:/tmp/h"],
])
def test_fault_flags_and_options_carry_the_same_fault(flags):
    values = dict(zip(flags[::2], flags[1::2], strict=True))
    spec = FaultSpec.from_flags(values["--fault"], values.get("--fault-marker"),
                                values.get("--fault-action"))
    assert spec is not None and spec.flags() == flags
    assert fault_from(spec.options()) == spec


def test_exactly_run_passes_its_fault_to_the_driver_and_into_the_jobs_exactly_sink():
    from exactly.ops.driver import DriverSpec
    from exactly.ops.job import Job

    fault = FaultSpec("after_intent", 1, "/tmp/fired.json")
    spec = DriverSpec("job.py", run_id="r1", fault=fault)
    assert DriverSpec.from_json(spec.to_json()) == spec
    job = Job(None, sink_format="exactly.files", path="/out",  # type: ignore[arg-type]
              options={"format": "json", "Exactly.Fault": "in_write@0",
                       "exactly.faultaction": "pause:/tmp/h"})  # names in any case
    assert job.with_fault(fault).options == {"format": "json", **fault.options()}
    assert job.with_fault(None) is job
    other = Job(None, sink_format="parquet", options={"x": "1"})  # type: ignore[arg-type]
    assert other.with_fault(fault).options == {"x": "1"}  # not exactly's: no protocol points
