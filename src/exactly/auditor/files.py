"""Files for the audit: a data file, or every data file below a directory, read by DuckDB.

JSON lines (``.jsonl``, ``.json``, ``.ndjson``), Parquet and CSV; names starting with ``_``
or ``.`` (staging areas, commit logs, Spark's metadata) are skipped, as every reader of the
file sink's output does. A file below an ``epoch-N`` directory (the file sink's layout)
belongs to epoch N. A JSON line that does not parse becomes a row of nulls, so it is counted
as a row without a key rather than stopping the audit.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from exactly.auditor.relation import EPOCH, Relation, first_line, ident, literal
from exactly.errors import AuditInputError

_READERS = {
    ".parquet": "read_parquet({files}, union_by_name=true, filename='__x_file')",
    ".jsonl": "read_json({files}, format='newline_delimited', union_by_name=true, "
              "ignore_errors=true, filename='__x_file')",
    ".csv": "read_csv({files}, union_by_name=true, filename='__x_file')",
}
#: file name suffix -> format
SUFFIXES = {".parquet": ".parquet", ".jsonl": ".jsonl", ".json": ".jsonl", ".ndjson": ".jsonl",
             ".csv": ".csv"}
#: the file sink's layout: a data file directly in its epoch's directory
EPOCH_DIR = re.compile(r"(^|[/\\])epoch-(\d+)[/\\][^/\\]*$")


def data_files(root: Path, suffixes: Iterable[str] = tuple(SUFFIXES)) -> list[Path]:
    """Files ending in one of ``suffixes`` below ``root`` (or ``root`` itself), hidden and
    ``_`` names skipped."""
    if root.is_file():
        return [root]
    suffixes = tuple(suffixes)
    found = []
    # os.walk skips directories that vanish while it lists (a sink cleaning its staging)
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not skipped(d)]
        found += [Path(directory, f) for f in files
                  if not skipped(f) and Path(f).suffix.lower() in suffixes]
    return sorted(found)


def epoch_of(path: str) -> int | None:
    """The epoch of a data file directly in an ``epoch-N`` directory, else None."""
    match = EPOCH_DIR.search(path)
    return int(match.group(2)) if match else None


def skipped(name: str) -> bool:
    """Whether a file or directory name is skipped (``_`` and ``.`` names: staging areas,
    commit logs, Spark's metadata)."""
    return name.startswith((".", "_"))


def attach_files(con, name: str, root: Path) -> Relation:
    """Create the view ``name`` over the data files below ``root``; ``empty`` when none."""
    files = data_files(root)
    relation = Relation(name, str(root))
    if not files:
        relation.empty = True
        return relation
    by_format: dict[str, list[str]] = {}
    for f in files:
        by_format.setdefault(SUFFIXES[f.suffix.lower()], []).append(str(f))
    parts = [_READERS[fmt].format(files="[" + ", ".join(literal(p) for p in paths) + "]")
             for fmt, paths in sorted(by_format.items())]
    scans = " UNION ALL BY NAME ".join(f"SELECT * FROM {p}" for p in parts)
    relation.epoch = any(epoch_of(str(f)) is not None for f in files)
    epoch = (r"TRY_CAST(regexp_extract(__x_file, '(^|[/\\])epoch-([0-9]+)[/\\][^/\\]*$', 2) "
             "AS BIGINT)"
             if relation.epoch else "NULL::BIGINT")
    if relation.epoch:
        relation.order = [EPOCH]
    try:
        con.execute(f"CREATE VIEW {ident(name)} AS SELECT * EXCLUDE (__x_file), "
                    f"{epoch} AS {EPOCH} FROM ({scans})")
    except Exception as exc:  # duckdb.Error: a file that is not what its suffix says
        raise AuditInputError(f"{root}: cannot read its data files: {first_line(exc)}") from None
    return relation

