"""Small records the table-format sinks (Delta, Iceberg) keep beside a table's data files.

Both sinks write a task's data files straight into the table's directory, so an attempt that
dies leaves files no snapshot names. Before its first data file a task writes a *pending
marker* (``_exactly/pending/<query>/<epoch>/<attempt>.json``) naming its files; recovery
lists the markers of a query and aborts (deletes) what they name. Restored queries record
their lineage as one small JSON object each under ``_exactly/lineage/<query>.json``. Both
work the same on a local disk (a temp file, fsync, rename) and on an object store (a PUT is
atomic by itself).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from exactly.errors import CorruptFileError, ExactlyError
from exactly.fsutil import atomic_write_bytes
from exactly.protocol.contract import Edge
from exactly.protocol.target_state import LineageRecordError

PENDING = "_exactly/pending"
LINEAGE = "_exactly/lineage"
MARKER_FIELDS = ("query_id", "run_id", "epoch", "partition", "attempt")
_REPAIR = ("delete it and the data files it names, if any, once no driver of this query "
           "runs: it marks an uncommitted task attempt")


def marker_name(query_id: str, epoch: int, attempt_key: str) -> str:
    """The pending marker of one task attempt, relative to the table."""
    return f"{PENDING}/{query_id}/{epoch:012d}/{attempt_key}.json"


def put_object(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a small object whole: a local file atomically (temp file, fsync, rename); an
    object-store PUT is atomic by itself."""
    if isinstance(fs, pafs.LocalFileSystem):
        atomic_write_bytes(path, data)
        return
    with fs.open_output_stream(path) as out:
        out.write(data)


def delete_object(fs: pafs.FileSystem, path: str) -> None:
    """Delete ``path``; gone already is fine. ExactlyError when it stays."""
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            raise ExactlyError(f"cannot delete {path}: {exc}") from exc


def delete_marker(fs: pafs.FileSystem, path: str, *, local: bool) -> None:
    """Delete a pending marker and, on a local disk, its epoch's and query's directories
    once empty (object stores have no directories to leave behind)."""
    delete_object(fs, path)
    if local:
        epoch_dir = Path(path).parent
        for directory in (epoch_dir, epoch_dir.parent):
            with contextlib.suppress(OSError):  # not empty: other attempts remain
                directory.rmdir()


def in_background(function: Callable[..., Any], *args: Any, name: str = "exactly-marker") -> Future:
    """``function(*args)`` in a thread of its own; its result or error in the future."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to whoever waits for it
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def read_marker(fs: pafs.FileSystem, path: str, shown: str,
                fields: Iterable[str]) -> dict[str, Any] | None:
    """A pending marker's record (None when it was removed since the listing: a concurrent
    abort). CorruptFileError naming the repair for a record that is not one or lacks any
    of :data:`MARKER_FIELDS` and ``fields``."""
    try:
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        record = json.loads(data)
        missing = [k for k in (*MARKER_FIELDS, *fields) if k not in record]
    except (ValueError, TypeError) as exc:
        raise CorruptFileError(shown, f"is not a pending-attempt record ({exc!r})",
                               _REPAIR) from None
    if missing:
        raise CorruptFileError(shown, f"lacks the field(s) {', '.join(missing)}", _REPAIR)
    return record


def marker_records(fs: pafs.FileSystem, base: str, query_id: str, shown: Callable[[str], str],
                   fields: Iterable[str]) -> list[dict[str, Any]]:
    """Every pending marker's record of ``query_id`` under the table at ``base``."""
    selector = pafs.FileSelector(f"{base}/{PENDING}/{query_id}", recursive=True,
                                 allow_not_found=True)
    wanted = tuple(fields)
    found = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        record = read_marker(fs, info.path, shown(info.path[len(base) + 1:]), wanted)
        if record is not None:
            found.append(record)
    return found


def read_edges(fs: pafs.FileSystem, base: str, shown: Callable[[str], str]) -> list[Edge]:
    """The lineage records under the table at ``base``. LineageRecordError naming the
    repair for one that is not a record."""
    selector = pafs.FileSelector(f"{base}/{LINEAGE}", allow_not_found=True)
    edges = []
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as f:
                edges.append(Edge.from_json(json.loads(f.read())))
        except FileNotFoundError:
            continue
        except (TypeError, ValueError, KeyError) as exc:
            raise LineageRecordError(
                f"{shown(info.path[len(base) + 1:])} is not a lineage record ({exc!r}); it "
                "records which query a restored query continues. Delete it: that query then "
                "counts as never restored") from None
    return edges


def write_edge(fs: pafs.FileSystem, base: str, edge: Edge, *, local: bool) -> None:
    """Record ``edge`` as ``_exactly/lineage/<query>.json`` (one atomic write)."""
    if local:
        Path(f"{base}/{LINEAGE}").mkdir(parents=True, exist_ok=True)
    put_object(fs, f"{base}/{LINEAGE}/{edge.query_id}.json",
               json.dumps(edge.to_json()).encode())
