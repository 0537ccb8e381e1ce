"""The Spark version a savepoint was taken with against the one that restores it.

A savepoint from an older Spark of the same major version restores (Spark reads the
checkpoint files of its older minor versions: offsets, commits and state as written; offset
log conf keys the older version did not write are filled with their defaults by Spark at
start). A savepoint from a newer Spark, or from another major version, is refused before
anything is written: an older Spark cannot be trusted to read a newer one's files.
"""

from __future__ import annotations

import re

from exactly.errors import SavepointError

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")
#: offset log conf keys a Spark minor version records that the one before did not (measured:
#: the offsets of a 4.2.1 and a 4.3.0 checkpoint of the same job); Spark fills them in with
#: their defaults when it starts on an older checkpoint
CONF_KEYS_SINCE: dict[tuple[int, int], tuple[str, ...]] = {
    (4, 3): ("spark.sql.dropDuplicates.deterministicKeyOrder.enabled",
             "spark.sql.streaming.statefulOperator.alwaysNullableOutput.enabled"),
}


def parse_version(version: str) -> tuple[int, int, int]:
    """``"4.2.1"`` (also ``"4.3.0.dev1"``, ``"4.1.0-SNAPSHOT"``) as ``(4, 2, 1)``.

    Raises SavepointError when ``version`` holds no major.minor.patch."""
    found = _VERSION.match(version.strip())
    if found is None:
        raise SavepointError(
            f"cannot read the Spark version {version!r} (expected major.minor.patch): the "
            "savepoint's manifest (_metadata, spark_version) is damaged; take it again")
    major, minor, patch = (int(part) for part in found.groups())
    return major, minor, patch


def engine_change(saved: str, running: str) -> str | None:
    """What a restore of a savepoint taken with Spark ``saved`` by Spark ``running`` converts:
    None for the same version, a sentence for an upgrade within the major version.

    Raises SavepointError, naming both versions and the way out, for a newer or another
    major version."""
    old, new = parse_version(saved), parse_version(running)
    if old == new:
        return None
    if old[0] != new[0]:
        raise SavepointError(
            f"the savepoint was taken with Spark {saved} and this job runs Spark {running}: "
            "a restore across major versions is not supported. Restore it with Spark "
            f"{old[0]}.x, or start the job on Spark {running} from a fresh checkpoint")
    if old > new:
        raise SavepointError(
            f"the savepoint was taken with Spark {saved}, newer than this job's Spark "
            f"{running}: an older Spark cannot read a newer one's checkpoint files. Restore "
            f"it with Spark {saved} or newer (pip install 'pyspark=={saved}'), or take the "
            f"savepoint again from a job on Spark {running}")
    filled = [key for version, keys in sorted(CONF_KEYS_SINCE.items())
              if old[:2] < version <= new[:2] for key in keys]
    defaults = (f"offsets metadata conf {', '.join(filled)} filled with its default"
                if filled else "no offsets metadata conf key to fill")
    return (f"Spark {saved} -> {running}: offsets, commits and state files read as written; "
            f"{defaults}")
