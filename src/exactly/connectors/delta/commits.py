"""Which Delta commit added each file of a table version, and the epoch that commit holds.

The sink (sink.py) commits an epoch as one Delta commit carrying the application
transaction (``txn`` action) ``exactly-<query id>`` with version = the epoch; a query that
writes on after a restore from a savepoint has another query id, and its epochs continue
the numbers. In ``at_least_once`` mode each task's file is a commit of its own without a
``txn``; the sink records the epoch in that commit's info (``exactly.epoch``) instead.

``deltalake`` gives the files of a version but not the commit that added each, so
:func:`file_origins` reads the commit files (``_delta_log/<version>.json``: one JSON
action per line) newest first, several at a time, until every file's commit is found. A
commit by another writer (an ``OPTIMIZE``, a ``DELETE``, a plain append) has no epoch. A
file whose commit the log no longer holds (Delta removes commit files older than its log
retention, 30 days by default, once a checkpoint covers them) gets version -1, older than
every commit the log still holds, and no epoch.

A compaction commit (:mod:`exactly.connectors.delta.compaction`) adds files holding rows of
several epochs: they have no epoch, and their version is the version of the newest commit
whose rows went into them (the commit info records it per file), not the compaction's: the
order of the versions stays the order in which the rows were committed (``exactly verify
--latest-by-key`` and ``--monotonic`` order rows by it); rows of one compacted file share
one version.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import unquote

import pyarrow.fs as pafs


def app_id(query_id: str) -> str:
    """The Delta application id under which a query's epochs are recorded in the table."""
    return f"exactly-{query_id}"


#: the commit info key of a compaction commit (:mod:`exactly.connectors.delta.compaction`)
COMPACTION_KEY = "exactly.compaction"

#: the application ids under which exactly's queries record their epochs
EXACTLY_APP_PREFIX = app_id("")
#: the version of a file whose commit is no longer in the log
BEFORE_LOG = -1
LOG_DIR = "_delta_log"
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
#: commit files read at once (object stores answer each GET in tens of milliseconds)
_PARALLEL = 16


@dataclass(frozen=True)
class FileOrigin:
    """The commit that added a file: its table version and the epoch it recorded (None
    when the commit was not an exactly epoch)."""

    version: int
    epoch: int | None


@dataclass(frozen=True)
class Commit:
    """One commit file: its version, its epoch, and the paths it added (relative to the
    table, decoded); for a compaction commit, the version each added file's rows were
    first committed in (its origin; the compaction's own version for files not named)."""

    version: int
    epoch: int | None
    added: tuple[str, ...]
    origins: Mapping[str, int] = field(default_factory=dict)

    def origin(self, path: str) -> int:
        """The version ``path``'s rows were committed in: its origin, else this version."""
        return self.origins.get(path, self.version)


def commit_versions(fs: pafs.FileSystem, table: str, newest: int) -> list[int]:
    """The versions up to ``newest`` whose commit file the log holds, newest first."""
    selector = pafs.FileSelector(f"{table}/{LOG_DIR}", allow_not_found=True)
    versions = []
    for info in fs.get_file_info(selector):
        match = _COMMIT_FILE.match(info.base_name)
        if match and info.type == pafs.FileType.File and int(match.group(1)) <= newest:
            versions.append(int(match.group(1)))
    return sorted(versions, reverse=True)


def read_commit(fs: pafs.FileSystem, table: str, version: int) -> Commit:
    """Parse the commit file of ``version``: the files it added and its epoch -- the
    version of its ``exactly-*`` application transaction, else its commit info's
    ``exactly.epoch``; None when it has neither or they name several epochs."""
    with fs.open_input_stream(f"{table}/{LOG_DIR}/{version:020d}.json") as stream:
        text = stream.read().decode()
    added: list[str] = []
    epochs: set[int] = set()
    recorded: str | None = None
    origins: dict[str, int] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "add" in action:
            added.append(unquote(action["add"]["path"]))
        elif "txn" in action and str(action["txn"].get("appId", "")).startswith(
                EXACTLY_APP_PREFIX):
            epochs.add(int(action["txn"]["version"]))
        elif "commitInfo" in action:
            recorded = action["commitInfo"].get("exactly.epoch")
            origins = compacted_origins(action["commitInfo"].get(COMPACTION_KEY))
    if not epochs and recorded is not None and str(recorded).isdigit():
        epochs.add(int(recorded))
    return Commit(version, epochs.pop() if len(epochs) == 1 else None, tuple(added), origins)


def compacted_origins(recorded: object) -> dict[str, int]:
    """The origin version of each file of a compaction commit's record (commit info
    ``exactly.compaction``: JSON ``{file: [query, first epoch, last epoch, origin]}``);
    empty for a record that is not one."""
    try:
        files = json.loads(recorded) if isinstance(recorded, str) else recorded
        if not isinstance(files, dict):
            return {}
        return {str(path): int(entry[3]) for path, entry in files.items()}
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return {}


def file_origins(fs: pafs.FileSystem, table: str, files: Iterable[str],
                 newest: int) -> dict[str, FileOrigin]:
    """The origin of each of ``files`` (paths relative to the table, decoded: the files of
    version ``newest``), found in the commit files of versions up to ``newest``, newest
    first; files added by no commit the log holds get :data:`BEFORE_LOG`."""
    wanted = set(files)
    found: dict[str, FileOrigin] = {}
    versions = commit_versions(fs, table, newest)
    with ThreadPoolExecutor(_PARALLEL) as pool:
        for start in range(0, len(versions), _PARALLEL):
            if not wanted:
                break
            chunk = versions[start:start + _PARALLEL]
            for commit in pool.map(lambda v: read_commit(fs, table, v), chunk):
                for path in commit.added:  # newest first: a path added again keeps its newest
                    if path in wanted:
                        wanted.discard(path)
                        found[path] = FileOrigin(commit.origin(path), commit.epoch)
    for path in wanted:
        found[path] = FileOrigin(BEFORE_LOG, None)
    return found
