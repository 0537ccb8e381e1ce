"""The sink's own commit log: the coordinator log of two-phase commit (presumed abort).

Layout under the log directory::

    query.json                  the streaming query that owns the sink
    intents/<epoch>.json        "epoch n commits exactly these handles" (step 2b)
    complete/<epoch>.json       "epoch n is visible" with its statistics (step 2d)
    lease.json, lease.lock      fencing (see exactly.protocol.lease)

Intents and completions carry the epoch's ``input``: the source positions Spark wrote to
``offsets/<epoch>`` for it (parsed, a digest, and the raw entry so it can be restored). An
epoch is its number *and* its input: a later commit call for the same number is a replay
only when its input is the same (DESIGN section 3, "Epoch identity").

Every file is written atomically (temp file, fsync, rename, fsync of the directory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.errors import CorruptFileError, OwnershipError
from exactly.fsutil import atomic_write_json, read_json, require_fields
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
    """Durable record of commit intents and completed epochs of one query's sink."""

    def __init__(self, directory: str | Path, payload_type: type[Payload] = Payload) -> None:
        self.directory = Path(directory)
        self.payload_type = payload_type
        self.intents = self.directory / "intents"
        self.complete = self.directory / "complete"

    def claim_owner(self, query_id: str) -> None:
        """Bind the sink to ``query_id`` on first use; refuse any other query afterwards."""
        path = self.directory / "query.json"
        owner = read_json(path, repair=query_repair(self.directory))
        if owner is not None:
            require_fields(owner, path, ("query_id",), query_repair(self.directory))
        if owner is None:
            atomic_write_json(path, {"query_id": query_id, "created_at": time.time()})
        elif owner["query_id"] != query_id:
            raise OwnershipError(
                f"{self.directory.parent} already holds the output of streaming query "
                f"{owner['query_id']}; this query is {query_id}. A new checkpoint location "
                "starts a new query: give it a new, empty output path, or restart the old "
                "query from its own checkpoint."
            )

    def read_intent(self, epoch: int) -> Intent | None:
        path = self.intent_path(epoch)
        repair = intent_repair(self.directory, epoch)
        data = read_json(path, repair=repair)
        if data is None:
            return None
        require_fields(data, path, ("epoch", "run_id", "handles"), repair)
        try:
            handles = tuple(Handle.from_json(h, self.payload_type) for h in data["handles"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(str(path), f"has a malformed handle ({exc!r})",
                                   repair) from None
        return Intent(int(data["epoch"]), data["run_id"], handles, data.get("input"))

    def write_intent(self, epoch: int, run_id: str, handles: list[Handle],
                     input: dict[str, Any] | None = None) -> Intent:
        atomic_write_json(self.intents / _name(epoch), {
            "epoch": epoch, "run_id": run_id, "written_at": time.time(),
            "handles": [h.to_json() for h in handles], "input": input})
        return Intent(epoch, run_id, tuple(handles), input)

    def intent_path(self, epoch: int) -> Path:
        return self.intents / _name(epoch)

    def completion_path(self, epoch: int) -> Path:
        return self.complete / _name(epoch)

    def is_complete(self, epoch: int) -> bool:
        return (self.complete / _name(epoch)).exists()

    def mark_complete(self, epoch: int, stats: dict[str, Any]) -> None:
        atomic_write_json(self.complete / _name(epoch), {"epoch": epoch, **stats})

    def completion(self, epoch: int) -> dict[str, Any] | None:
        return read_json(self.completion_path(epoch),
                         repair=completion_repair(self.directory, epoch))

    def _epochs(self, folder: Path) -> list[int]:
        if not folder.is_dir():
            return []
        return sorted(int(p.name[:-5]) for p in folder.glob("*.json") if p.name[:-5].isdigit())

    def completed_epochs(self) -> list[int]:
        return self._epochs(self.complete)

    def incomplete_intents(self) -> list[Intent]:
        done = set(self.completed_epochs())
        intents = []
        for epoch in self._epochs(self.intents):
            if epoch not in done:
                intent = self.read_intent(epoch)
                if intent is not None:
                    intents.append(intent)
        return intents

    def prune(self, keep: int) -> None:
        """Forget all but the newest ``keep`` completed epochs (their intents too)."""
        done = self.completed_epochs()
        for epoch in done[:-keep] if keep > 0 else done:
            (self.intents / _name(epoch)).unlink(missing_ok=True)
            (self.complete / _name(epoch)).unlink(missing_ok=True)
