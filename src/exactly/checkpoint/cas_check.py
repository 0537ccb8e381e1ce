"""Whether a checkpoint store honours create-if-absent and compare-and-swap, checked before
anything relies on them (the leader lease of ``exactly run --ha``).

A store fails this in two ways. It refuses the conditional writes (S3: ``501 NotImplemented``
to ``If-None-Match`` / ``If-Match``), or -- the dangerous one -- it ignores their headers and
overwrites (older MinIO, Ceph RGW and other S3-compatible stores): every create and every swap
then "succeeds", and two hosts can both hold a lease. Only a probe of the store itself tells.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import NoReturn

from exactly.checkpoint.store import LocalLogStore, LogStore
from exactly.errors import ConfigError
from exactly.logs import log_event

logger = logging.getLogger("exactly.store")

PROBE_FOLDER = "ha"
CREATE = "create-if-absent (S3: PUT with If-None-Match: *)"
SWAP = "compare-and-swap (S3: PUT with If-Match: <ETag>)"
DEFAULT_PURPOSE = "the leader lease of `exactly run --ha`"
#: S3Proxy is left out: its If-Match is a check then a write, not atomic (testing/s3_server.py)
FIX = ("put the checkpoint on a store that has conditional writes (AWS S3, a recent MinIO) or "
       "on a shared POSIX directory whose file system has working flock")


def check_compare_and_swap(store: LogStore, *, purpose: str = DEFAULT_PURPOSE) -> None:
    """Probe ``store`` with an object of its own (``ha/cas-probe-<uuid>.json``, deleted
    afterwards whatever happens) and return only if the store honoured every condition:

    1. a create of the new name succeeded;
    2. a second create of other bytes was refused, and the object kept the first bytes;
    3. a swap naming the current version succeeded, and the object holds its bytes;
    4. a swap naming the replaced version (a stale token), with other bytes, was refused,
       and the object kept the bytes of 3.

    This proves the store evaluates the conditions, not that it evaluates them atomically
    under racing writers (no single-process probe can). Every write of the probe carries
    bytes the object does not hold, so a store's read-back after a refusal (S3LogStore's
    ambiguous-commit resolution) cannot turn an overwrite into a pass.

    Raises ConfigError naming the store, each operation it did not honour, why ``purpose``
    needs it and the fix -- also when the store refuses conditional writes outright (its own
    ConfigError, a 501, is the cause). Other errors (unreachable store, no permission)
    propagate unchanged.
    """
    run = uuid.uuid4().hex
    name = f"{PROBE_FOLDER}/cas-probe-{run}.json"

    def version(step: str) -> bytes:
        return json.dumps({"probe": run, "write": step}).encode()

    not_honoured: list[str] = []
    try:
        first, second, third, fourth = map(version, ("create", "create-again", "swap",
                                                     "swap-stale"))
        if not _step(store, name, CREATE, purpose, lambda: store.create(name, first)):
            _refuse(store, purpose, [f"{CREATE}: it refused to create {name}, a name that "
                                     "did not exist"])
        if _step(store, name, CREATE, purpose, lambda: store.create(name, second)):
            not_honoured.append(f"{CREATE}: a second create of {name} succeeded over the "
                                "first")
        elif store.read(name) != first:
            not_honoured.append(f"{CREATE}: a second create of {name} was refused but "
                                "overwrote the first")
        current = store.read_versioned(name)
        if current is None:
            _refuse(store, purpose, [f"{CREATE}: {name} was gone right after its create"])
        _, stale = current
        if not _step(store, name, SWAP, purpose, lambda: store.swap(name, third, stale)):
            not_honoured.append(f"{SWAP}: a swap of {name} naming its current version was "
                                "refused")
        elif store.read(name) != third:
            not_honoured.append(f"{SWAP}: a swap of {name} reported success but the object "
                                "does not hold its bytes")
        elif _step(store, name, SWAP, purpose, lambda: store.swap(name, fourth, stale)):
            not_honoured.append(f"{SWAP}: a swap of {name} naming a version replaced since "
                                "succeeded")
        elif store.read(name) != third:
            not_honoured.append(f"{SWAP}: a swap of {name} naming a version replaced since "
                                "was refused but overwrote the object")
    finally:
        _remove(store, name)
    if not_honoured:
        _refuse(store, purpose, not_honoured)


def _step(store: LogStore, name: str, operation: str, purpose: str,
          write: Callable[[], bool]) -> bool:
    """``write()``'s answer; a store's refusal of conditional writes (its ConfigError, on S3
    a 501) becomes this check's ConfigError."""
    try:
        return write()
    except ConfigError as exc:
        raise ConfigError(
            f"{store.describe()}: the store refuses {operation}: writing {name}, it answered "
            f"that conditional writes are not implemented. {_why(purpose)}. Fix: {FIX}"
        ) from exc


def _why(purpose: str) -> str:
    return (f"They are needed by {purpose}, which is taken and renewed only by "
            "create-if-absent and compare-and-swap: without them two hosts can both hold it "
            "and run the job at once")


def _refuse(store: LogStore, purpose: str, not_honoured: list[str]) -> NoReturn:
    raise ConfigError(
        f"{store.describe()}: the store does not honour conditional writes -- "
        f"{'; '.join(not_honoured)}. {_why(purpose)}. Fix: {FIX}")


def _remove(store: LogStore, name: str) -> None:
    """Delete the probe (and the lock file a local store's swap leaves beside it); a probe
    that cannot be deleted is logged, never raised over the check's own outcome."""
    try:
        store.delete(name)
        if isinstance(store, LocalLogStore):
            store.lock_file(name).unlink(missing_ok=True)
    except Exception as exc:
        log_event(logger, "cas_probe_left", logging.WARNING, object=store.describe(name),
                  error=repr(exc), detail="delete it by hand; it is not used again")
