"""The sink's own commit log: the coordinator log of two-phase commit (presumed abort).

Layout under the log directory::

    query.json                  the streaming query that owns the sink
    intents/<epoch>.json        "epoch n commits exactly these handles" (step 2b)
    complete/<epoch>.json       "epoch n is visible" with its statistics (step 2d)
    lease.json, lease.lock      fencing (see exactly.protocol.lease)

Intents and completions carry the epoch's ``input``: the source positions Spark wrote to
``offsets/<epoch>`` for it (parsed, a digest, and the raw entry so it can be restored). An
epoch is its number *and* its input: a later commit call for the same number is a replay
only when its input is the same (docs/design.md section 3, "Epoch identity").

The log lives in a local (or shared POSIX) directory or under an ``s3://`` prefix
(:mod:`exactly.checkpoint.store`). Every file is written whole (a directory: temp file,
fsync, rename, fsync of the directory; S3: one PUT); ``query.json`` and each intent are
created only if absent (a hard link of the temp file; ``If-None-Match: *``), so the first
intent of an epoch decides it, even against a driver that resumes after a takeover.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.checkpoint.store import is_remote, open_log_store
from exactly.errors import CorruptFileError, FencedError, OwnershipError
from exactly.fsutil import parse_json, require_fields
from exactly.protocol.contract import Handle, Payload
from exactly.protocol.repairs import completion_repair, intent_repair, query_repair


def _name(epoch: int) -> str:
    return f"{epoch:020d}.json"


@dataclass(frozen=True)
class Intent:
    epoch: int
    run_id: str
    handles: tuple[Handle, ...]
    #: the epoch's recorded input (``{"digest", "sources", "offsets_log"}``), if known
    input: dict[str, Any] | None = None

    @property
    def keys(self) -> set[str]:
        return {h.key for h in self.handles}


class CommitLog:
    """Durable record of commit intents and completed epochs of one query's sink.

    ``directory`` is a local (or shared POSIX) directory or an ``s3://`` prefix (see
    :mod:`exactly.checkpoint.store` for what each offers)."""

    def __init__(self, directory: str | Path, payload_type: type[Payload] = Payload) -> None:
        self.store = open_log_store(directory)
        #: the log's location: a Path for a directory, the URI for a store
        self.directory: Path | str = directory if is_remote(directory) else Path(directory)
        self.payload_type = payload_type
        self.intents = self._local("intents")
        self.complete = self._local("complete")

    def _local(self, folder: str) -> Path | str:
        where = self.store.describe(folder)
        return where if is_remote(where) else Path(where)

    def _read_json(self, name: str, repair: str) -> Any | None:
        data = self.store.read(name)
        return None if data is None else parse_json(data, self.store.describe(name), repair)

    @staticmethod
    def _encode(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, indent=1).encode()

    def claim_owner(self, query_id: str) -> None:
        """Bind the sink to ``query_id`` on first use; refuse any other query afterwards."""
        repair = query_repair(self.directory)
        owner = self._read_json("query.json", repair)
        if owner is not None:
            require_fields(owner, self.store.describe("query.json"), ("query_id",), repair)
        if owner is None:
            record = {"query_id": query_id, "created_at": time.time()}
            if self.store.create("query.json", self._encode(record)):
                return
            owner = self._read_json("query.json", repair) or {}  # another driver was first
        if owner.get("query_id") != query_id:
            where = (self.directory.parent if isinstance(self.directory, Path)
                     else self.store.describe())
            raise OwnershipError(
                f"{where} already holds the output of streaming query "
                f"{owner.get('query_id')}; this query is {query_id}. A new checkpoint location "
                "starts a new query: give it a new, empty output path, or restart the old "
                "query from its own checkpoint."
            )

    def read_intent(self, epoch: int) -> Intent | None:
        name = f"intents/{_name(epoch)}"
        path = self.store.describe(name)
        repair = intent_repair(self.directory, epoch)
        data = self._read_json(name, repair)
        if data is None:
            return None
        require_fields(data, path, ("epoch", "run_id", "handles"), repair)
        try:
            handles = tuple(Handle.from_json(h, self.payload_type) for h in data["handles"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(str(path), f"has a malformed handle ({exc!r})",
                                   repair) from None
        return Intent(int(data["epoch"]), data["run_id"], handles, data.get("input"))

    @staticmethod
    def intent_record(epoch: int, run_id: str, handles: list[Handle],
                      input: dict[str, Any] | None = None) -> dict[str, Any]:
        """The intent file's content: what :meth:`write_intent` writes (and
        :meth:`exactly.protocol.lease.Lease.verify` records in the lease)."""
        return {"epoch": epoch, "run_id": run_id, "written_at": time.time(),
                "handles": [h.to_json() for h in handles], "input": input}

    def write_intent(self, epoch: int, run_id: str, handles: list[Handle],
                     input: dict[str, Any] | None = None,
                     record: dict[str, Any] | None = None) -> Intent:
        """Record that ``epoch`` commits exactly ``handles`` -- only if no intent for it
        exists: the first intent of an epoch decides it. ``record`` is the content when it
        was made already (:meth:`intent_record`, the one the lease admitted).

        Raises FencedError when another run wrote the epoch's intent first (a driver that
        took over while this one was paused or partitioned away)."""
        if record is None:
            record = self.intent_record(epoch, run_id, handles, input)
        if not self.store.create(f"intents/{_name(epoch)}", self._encode(record)):
            other = self.read_intent(epoch)
            if other is None or other.run_id != run_id:
                raise FencedError(
                    f"this instance (run {run_id}) is fenced off: the intent of epoch {epoch} "
                    f"was written by run {other.run_id if other else '?'} first "
                    f"({self.intent_path(epoch)}). Another instance of the same query took "
                    "over; this instance committed nothing of the epoch.")
            return other
        return Intent(epoch, run_id, tuple(handles), input)

    def adopt_intent(self, record: dict[str, Any], query_id: str) -> bool:
        """Write the intent ``record`` a previous holder of the lease was admitted to write
        (:meth:`exactly.protocol.lease.Lease.pending_intent`) when its file is missing and
        it can still be undecided: its handles belong to ``query_id`` and its epoch is later
        than every completed epoch. True when this call wrote it.

        A holder that passed its lease check and was then paused (or lost the lease to a
        clock that ran ahead) may write that intent file at any later time: writing it now,
        before recovery aborts orphans, makes recovery finish the epoch the holder decided
        instead of aborting its pre-commits under it."""
        try:
            epoch = int(record["epoch"])
            queries = {h["query_id"] for h in record["handles"]}
        except (KeyError, TypeError, ValueError):
            return False  # not an intent record: nothing was admitted
        if queries != {query_id}:
            return False
        done = self.completed_epochs()
        if (done and epoch <= done[-1]) or self.store.exists(f"intents/{_name(epoch)}"):
            return False
        return self.store.create(f"intents/{_name(epoch)}", self._encode(record))

    def intent_path(self, epoch: int) -> Path | str:
        return self._local(f"intents/{_name(epoch)}")

    def completion_path(self, epoch: int) -> Path | str:
        return self._local(f"complete/{_name(epoch)}")

    def is_complete(self, epoch: int) -> bool:
        return self.store.exists(f"complete/{_name(epoch)}")

    def mark_complete(self, epoch: int, stats: dict[str, Any]) -> None:
        self.store.write(f"complete/{_name(epoch)}", self._encode({"epoch": epoch, **stats}))

    def completion(self, epoch: int) -> dict[str, Any] | None:
        return self._read_json(f"complete/{_name(epoch)}",
                               completion_repair(self.directory, epoch))

    def _epochs(self, folder: str) -> list[int]:
        return sorted(int(n[:-5]) for n in self.store.list(folder)
                      if n.endswith(".json") and n[:-5].isdigit())

    def completed_epochs(self) -> list[int]:
        return self._epochs("complete")

    def incomplete_intents(self) -> list[Intent]:
        done = set(self.completed_epochs())
        intents = []
        for epoch in self._epochs("intents"):
            if epoch not in done:
                intent = self.read_intent(epoch)
                if intent is not None:
                    intents.append(intent)
        return intents

    def prune(self, keep: int) -> None:
        """Forget all but the newest ``keep`` completed epochs (their intents too)."""
        done = self.completed_epochs()
        self.forget(done[:-keep] if keep > 0 else done)

    def forget(self, epochs: list[int]) -> None:
        """Delete the intents and completions of ``epochs`` (completed ones: pruning)."""
        for epoch in epochs:
            self.store.delete(f"intents/{_name(epoch)}")
            self.store.delete(f"complete/{_name(epoch)}")
