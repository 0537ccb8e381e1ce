"""The safe repair of every file of an exactly sink's commit log, as text for errors.

The readers (:mod:`exactly.protocol.commitlog`, :mod:`exactly.protocol.recovery`,
:mod:`exactly.protocol.staging`, :mod:`exactly.protocol.lease`) and ``exactly doctor`` give the same
advice. A repair is safe when doing it cannot lose or duplicate a record; where that depends
on the state of the log (an intent with or without its completion), the text says which.
"""

from __future__ import annotations

from pathlib import Path


def log_file_name(epoch: int) -> str:
    """The file name of epoch ``epoch`` in ``intents/`` and ``complete/``."""
    return f"{epoch:020d}.json"


def query_repair(log_directory: str | Path) -> str:
    """``query.json``: which streaming query owns the sink."""
    return ('with the query stopped, replace it with {"query_id": "<id>"}, where <id> is the '
            '"id" in the metadata file of this sink\'s checkpoint (`exactly doctor CHECKPOINT '
            f"--sink-log {log_directory}` prints it); deleting it is safe too when no other "
            "query writes to this sink: the next commit records the query again")


def intent_repair(log_directory: str | Path, epoch: int) -> str:
    """``intents/N.json``: the handles epoch N commits (step 2b)."""
    log = Path(log_directory)
    completion = log / "complete" / log_file_name(epoch)
    if completion.exists():
        return (f"delete it: epoch {epoch} is complete ({completion}), so its intent is no "
                "longer needed")
    return (f"its handles are lost, so recovery cannot finish epoch {epoch} from it. If nothing "
            f"of epoch {epoch} is visible in the target yet (file sink: neither "
            f"epoch-{epoch:012d}/ nor _staging/{epoch:012d}/_publish/ exists in the output; "
            "other sinks: no committed data of the epoch), delete it with the query stopped: "
            f"Spark replays epoch {epoch} and it commits once (presumed abort). Otherwise "
            "restore it from a backup: deleting it would let the replay add again what the "
            "intent already committed")


def completion_repair(log_directory: str | Path, epoch: int) -> str:
    """``complete/N.json``: epoch N is visible (step 2d)."""
    intent = Path(log_directory) / "intents" / log_file_name(epoch)
    if intent.exists():
        return (f"delete it with the query stopped: recovery then finishes epoch {epoch} again "
                f"from {intent} (committing is idempotent) and records it complete anew")
    return (f'with the query stopped, replace its content with {{"epoch": {epoch}}}: the file\'s '
            f"existence is what marks epoch {epoch} committed (its statistics and recorded "
            "input are informational). Do not delete it: without it and without its intent, "
            f"a replay of epoch {epoch} would commit it a second time")


def marker_repair(log_directory: str | Path) -> str:
    """``recovered-by.json``: which driver ran start-up recovery last."""
    return ("delete it: the next driver start runs recovery again, and recovery is idempotent")


def task_repair(attempt_directory: str | Path) -> str:
    """``_staging/<epoch>/<attempt>/task.json``: which task attempt staged the directory."""
    return (f"with the query stopped: if an intent of the sink's commit log names "
            f"{Path(attempt_directory).name} (grep its intents/*.json), rewrite task.json from "
            "that handle's query_id, run_id, epoch, partition and attempt; otherwise delete "
            f"{attempt_directory}: it is a pre-commit no intent names, which recovery aborts "
            "anyway")
