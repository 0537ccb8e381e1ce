"""Exactly-once verification: compare the ids of a source with the ids a sink made visible.

A run is exactly-once when every input id appears exactly once in the output: no id
missing, no id duplicated, no id the input never had. Files and directories whose names
start with ``_`` or ``.`` (staging, commit logs) are not output, as for any reader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from exactly.errors import ConfigError

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


@dataclass
class AuditReport:
    """What ``verify`` found. ``ok`` is True only for a perfect one-to-one match."""

    expected: int
    found_rows: int
    missing: np.ndarray
    duplicated: np.ndarray
    unexpected: np.ndarray
    duplicate_extra_rows: int
    malformed_input_rows: int = 0
    input_duplicates: int = 0

    @property
    def ok(self) -> bool:
        return not (len(self.missing) or len(self.duplicated) or len(self.unexpected))

    def rows(self) -> list[tuple[str, str]]:
        def sample(values: np.ndarray) -> str:
            shown = ", ".join(str(v) for v in values[:10])
            return f"{len(values)}" + (f"  (e.g. {shown})" if len(values) else "")

        extra = f"  [{self.duplicate_extra_rows} extra rows]" if self.duplicate_extra_rows else ""
        return [
            ("expected ids", str(self.expected)),
            ("output rows", str(self.found_rows)),
            ("missing ids", sample(self.missing)),
            ("duplicated ids", sample(self.duplicated) + extra),
            ("unexpected ids", sample(self.unexpected)),
            ("malformed input rows", str(self.malformed_input_rows)),
            ("verdict", "EXACTLY ONCE" if self.ok else "MISMATCH"),
        ]

    def to_json(self) -> dict:
        return {"expected": self.expected, "found_rows": self.found_rows,
                "missing": len(self.missing), "duplicated": len(self.duplicated),
                "duplicate_extra_rows": self.duplicate_extra_rows,
                "unexpected": len(self.unexpected),
                "malformed_input_rows": self.malformed_input_rows, "ok": self.ok}


def data_files(root: Path) -> list[Path]:
    """Data files below ``root``, skipping hidden and ``_``-prefixed files and directories."""
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(f"{root} does not exist")
    found = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if any(p.startswith((".", "_")) for p in parts):
            continue
        if path.is_file() and path.suffix in DATA_SUFFIXES:
            found.append(path)
    return found


def read_ids(path: Path, column: str) -> tuple[np.ndarray, int]:
    """The ``column`` values of one file, and how many of its rows had no readable id."""
    if path.suffix == ".parquet":
        table = pq.read_table(path, columns=[column])
        values = table.column(column)
        return values.drop_null().to_numpy(), values.null_count
    try:
        table = pajson.read_json(path, parse_options=pajson.ParseOptions(
            explicit_schema=pa.schema([(column, pa.int64())]),
            unexpected_field_behavior="ignore"))
        values = table.column(column)
        return values.drop_null().to_numpy(), values.null_count
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        ids, bad = [], 0
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)[column]
                    ids.append(int(value))
                except (ValueError, KeyError, TypeError):
                    bad += 1
        return np.array(ids, dtype=np.int64), bad


def _collect(root: Path, column: str) -> tuple[np.ndarray, int]:
    parts, bad = [], 0
    for path in data_files(root):
        ids, unreadable = read_ids(path, column)
        parts.append(ids.astype(np.int64, copy=False))
        bad += unreadable
    return (np.concatenate(parts) if parts else np.array([], dtype=np.int64)), bad


def verify(input_path: str | Path, output_path: str | Path, id_column: str = "id") -> AuditReport:
    """Compare ids in ``input_path`` (files or a directory) with ids in ``output_path``."""
    source, malformed = _collect(Path(input_path), id_column)
    sink, _ = _collect(Path(output_path), id_column)
    expected_ids = np.unique(source)
    found_ids, counts = np.unique(sink, return_counts=True)
    duplicated = found_ids[counts > 1]
    return AuditReport(
        expected=len(expected_ids),
        found_rows=len(sink),
        missing=np.setdiff1d(expected_ids, found_ids, assume_unique=True),
        duplicated=duplicated,
        unexpected=np.setdiff1d(found_ids, expected_ids, assume_unique=True),
        duplicate_extra_rows=int((counts[counts > 1] - 1).sum()),
        malformed_input_rows=malformed,
        input_duplicates=len(source) - len(expected_ids),
    )
