"""``exactly pipeline`` into an output the job cannot write ends stderr with the OS error.

Real runs of the command line (a driver process with Spark local[2]) against a read-only
bind mount (EROFS) and a full 1 MiB tmpfs (ENOSPC). Both need root and ``mount``; the
tests skip, saying so, where mounting is not allowed.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exactly.demos.files import write_events
from exactly.testing.chaos import python_command


def mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} is not allowed here: {done.stderr.strip()}")


@pytest.fixture
def read_only_dir(tmp_path) -> Iterator[Path]:
    source, target = tmp_path / "rw", tmp_path / "ro"
    source.mkdir()
    target.mkdir()
    mount("--bind", str(source), str(target))
    try:
        mount("-o", "remount,bind,ro", str(target))
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


@pytest.fixture
def full_dir(tmp_path) -> Iterator[Path]:
    target = tmp_path / "tiny"
    target.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target))
    try:
        (target / "filler").write_bytes(b"\0" * 1000 * 1024)  # leaves a few KiB
        yield target
    finally:
        subprocess.run(["umount", str(target)], check=True)


def pipeline(tmp_path: Path, output: Path, *global_options: str) -> subprocess.CompletedProcess:
    events = tmp_path / "events"
    write_events(events, 300, 3, seed=1)
    command = python_command(*global_options, "pipeline", "--input", str(events),
                             "--output", str(output), "--checkpoint", str(tmp_path / "ck"))
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.slow  # CI budget: a write error's root cause as the last line is the ENOSPC test below
def test_pipeline_into_a_read_only_mount_ends_stderr_with_the_erofs_error(
        tmp_path, read_only_dir):
    out = read_only_dir / "out"
    done = pipeline(tmp_path, out)
    assert done.returncode == 3
    assert last_line(done.stderr) == (
        f"pipeline failed: OSError: [Errno 30] Read-only file system: '{out}'")
    assert "Traceback (most recent call last)" not in done.stderr


def test_pipeline_into_a_full_file_system_ends_stderr_with_the_enospc_error_and_verbose_shows_the_traceback(  # noqa: E501
        tmp_path, full_dir):
    done = pipeline(tmp_path, full_dir / "out", "--verbose")
    assert done.returncode == 3
    assert last_line(done.stderr).startswith(
        f"pipeline failed: OSError: [Errno 28] No space left on device: '{full_dir}/out/")
    assert "Traceback (most recent call last)" in done.stderr
