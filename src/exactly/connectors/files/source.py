"""Replayable directory source: JSON lines or Parquet files, taken in name order.

Options (``spark.readStream.format("exactly.files").schema(...)``):

``path``               the input directory (required)
``format``             ``parquet`` (default, as for the sink) or ``json`` (JSON lines)
``maxFilesPerTrigger`` cap on files per epoch (epoch sizing; default: all new files)
``deadLetterPath``     where malformed rows go; without it a malformed row fails the query

Admission control (:mod:`exactly.connectors.admission`): no epoch while paused or closed;
a ``max_rows`` budget takes the leading files whose rows (Parquet footer ``num_rows``, JSON
lines counted, cached per file) fit in it, on top of ``maxFilesPerTrigger``, and always at
least one file, so a file bigger than the budget still makes progress.

Files are taken in the lexicographic order of their names (hidden ``.``/``_`` names are
skipped), so producers must name files so that they sort in arrival order (e.g. a
timestamp or sequence prefix) and publish them atomically (write elsewhere, rename in).
The offset of an epoch is ``{"last": <last file name taken>, "count": <files taken>}``;
a replay reads exactly the files between two offsets. A file that appears with a name
sorting before one already taken, or a taken file that disappears, makes the query fail
with an error naming it: replaying would otherwise change an epoch's input.

Malformed rows: with no ``deadLetterPath`` the read fails with
:class:`~exactly.errors.MalformedRecordError` naming the file and line. With one, every
malformed row of ``<file>`` is written (atomically, all at once) to
``<deadLetterPath>/<file>.jsonl`` with its line number, reason and raw text, and the good
rows go on. The dead-letter file is a pure function of the input file, so a replay rewrites
the same content: each malformed row is recorded exactly once. Dead letters become visible
when the epoch is read, not when it commits.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from exactly import options as opt
from exactly.connectors.admission import current_admission
from exactly.errors import ConfigError, ExactlyError, MalformedRecordError
from exactly.fsutil import atomic_write_bytes

FORMATS = ("json", "parquet")


@dataclass(frozen=True)
class FilePartition(InputPartition):
    path: str


def list_input_files(directory: Path) -> list[str]:
    """Names of the data files in ``directory``, sorted; hidden and ``_`` names skipped."""
    if not directory.is_dir():
        raise ConfigError(f"exactly.files source: input directory {directory} does not exist")
    return sorted(p.name for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith((".", "_")))


class FilesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Stream reader over a directory of files; see the module docstring."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        opt.check_option_names("exactly.files", options, "source")
        path = options.get(opt.PATH)
        if not path:
            raise ConfigError("exactly.files source: set the input directory with "
                              ".option('path', DIR) or .load(DIR)")
        self.directory = Path(path.removeprefix("file://")).absolute()
        self.format = options.get(opt.FORMAT, opt.DEFAULT_FORMAT).lower()
        if self.format not in FORMATS:
            raise ConfigError(f"exactly.files source: format {self.format!r} is not one of "
                              "json | parquet")
        raw_max = options.get(opt.MAX_FILES_PER_TRIGGER)
        self.max_files = int(raw_max) if raw_max else None
        if self.max_files is not None and self.max_files < 1:
            raise ConfigError("exactly.files source: maxFilesPerTrigger must be >= 1")
        self.dead_letter = options.get(opt.DEAD_LETTER_PATH)
        self.schema = schema
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._target: dict[str, str] | None = None
        self._rows: dict[str, int] = {}  # rows per file name (admission's row budget)

    def initialOffset(self) -> dict:
        return {"last": "", "count": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def _check_taken(self, names: list[str], offset: dict) -> list[str]:
        """Verify the files up to ``offset`` are those taken; return the newer ones."""
        taken = [n for n in names if n <= offset["last"]] if offset["last"] else []
        if len(taken) != int(offset["count"]):
            raise ExactlyError(
                f"exactly.files source: {self.directory} held {offset['count']} files up to "
                f"{offset['last']!r} when they were taken, now it holds {len(taken)}. A file "
                "was added with a name that sorts before files already read, or a file already "
                "read was removed. Name new files so they sort after existing ones, and keep "
                "input files until the query has committed them."
            )
        return [n for n in names if n > offset["last"]]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        budget = current_admission().row_budget(bounded_run=self._target is not None)
        if budget == 0:  # paused or closed: no epoch now
            return start
        names = list_input_files(self.directory)
        if self._target is not None:  # availableNow: nothing newer than the target
            names = [n for n in names if n <= self._target["last"]]
        fresh = self._check_taken(names, start)
        if isinstance(limit, ReadMaxFiles):
            fresh = fresh[: limit.max_files]
        if budget is not None:
            fresh = self._within_rows(fresh, budget)
        if not fresh:
            return start
        return {"last": fresh[-1], "count": int(start["count"]) + len(fresh)}

    def _within_rows(self, names: list[str], budget: int) -> list[str]:
        """The leading files of ``names`` whose rows fit in ``budget``; never fewer than one
        file (a file bigger than the budget still makes progress, as an epoch of its own)."""
        taken, rows = 0, 0
        for name in names:
            rows += self.file_rows(name)
            if taken and rows > budget:
                break
            taken += 1
        return names[:taken]

    def file_rows(self, name: str) -> int:
        """Rows of input file ``name``: Parquet footer ``num_rows``, JSON lines' newlines.

        Cached per name (input files are published whole and never change). A file whose
        size cannot be read counts as one row; its read then reports what is wrong with it.
        """
        rows = self._rows.get(name)
        if rows is None:
            rows = self._rows[name] = _count_rows(self.directory / name, self.format)
        return rows

    def prepareForTriggerAvailableNow(self) -> None:
        names = list_input_files(self.directory)
        self._target = {"last": names[-1] if names else ""}

    def partitions(self, start: dict, end: dict) -> list[FilePartition]:
        names = list_input_files(self.directory)
        fresh = self._check_taken(names, start)
        chosen = [n for n in fresh if n <= end["last"]]
        if len(chosen) != int(end["count"]) - int(start["count"]):
            raise ExactlyError(
                f"exactly.files source: the files between {start['last']!r} and "
                f"{end['last']!r} in {self.directory} changed since the epoch was planned; "
                "input files must not be added out of order or removed"
            )
        return [FilePartition(str(self.directory / n)) for n in chosen]

    def read(self, partition: FilePartition):  # type: ignore[override]
        if self.format == "parquet":
            table = _read_parquet(partition.path, self.arrow_schema)
        else:
            table = self._read_json(partition.path)
        yield from table.to_batches()

    def _read_json(self, path: str) -> pa.Table:
        try:
            table = pajson.read_json(path, parse_options=pajson.ParseOptions(
                explicit_schema=_nullable(self.arrow_schema),
                unexpected_field_behavior="ignore"))
            if not any(table.column(f.name).null_count for f in self.arrow_schema
                       if not f.nullable):
                return table.cast(self.arrow_schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass  # find the bad lines one by one
        good, bad = parse_json_lines(path, self.arrow_schema)
        if bad:
            if not self.dead_letter:
                line, reason, _ = bad[0]
                more = f" (and {len(bad) - 1} more malformed rows)" if len(bad) > 1 else ""
                raise MalformedRecordError(
                    f"malformed row in {path} at line {line}: {reason}{more}. Fix the input, "
                    "or set the source option deadLetterPath to route malformed rows aside "
                    "and go on."
                )
            write_dead_letters(Path(self.dead_letter), path, bad)
        return good

    def commit(self, end: dict) -> None:
        pass


def _count_rows(path: Path, fmt: str) -> int:
    try:
        if fmt == "parquet":
            return int(pq.read_metadata(path).num_rows)
        lines, last = 0, b"\n"
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                lines += chunk.count(b"\n")
                last = chunk[-1:]
        return lines + (last != b"\n")  # a last line without a newline counts too
    except (OSError, pa.ArrowException):
        return 1


def _nullable(schema: pa.Schema) -> pa.Schema:
    """Parse with every field nullable, then report missing required fields by name."""
    return pa.schema([f.with_nullable(True) for f in schema])


def _read_parquet(path: str, schema: pa.Schema) -> pa.Table:
    try:
        table = pq.read_table(path)
        return table.select(schema.names).cast(schema)
    except (pa.ArrowException, KeyError, OSError) as exc:
        raise MalformedRecordError(
            f"cannot read {path} as Parquet with columns {schema.names}: {exc}"
        ) from exc


def parse_json_lines(path: str, schema: pa.Schema) -> tuple[pa.Table, list[tuple[int, str, str]]]:
    """Parse a JSON-lines file line by line with the same parser as the fast path.

    Returns the good rows and ``(line number, reason, raw text)`` of every malformed one.
    """
    options = pajson.ParseOptions(explicit_schema=_nullable(schema),
                                  unexpected_field_behavior="ignore")
    required = [f.name for f in schema if not f.nullable]
    good: list[pa.Table] = []
    bad: list[tuple[int, str, str]] = []
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            text = raw.strip()
            if not text:
                continue
            shown = text.decode("utf-8", errors="replace")
            if not text.startswith(b"{"):
                bad.append((line_no, "not a JSON object", shown))
                continue
            try:
                row = pajson.read_json(io.BytesIO(text), parse_options=options)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                bad.append((line_no, f"not valid JSON for the schema: {exc}", shown))
                continue
            missing = [name for name in required if row.column(name).null_count]
            if missing:
                bad.append((line_no, f"required field(s) missing: {', '.join(missing)}", shown))
                continue
            good.append(row)
    table = pa.concat_tables(good) if good else schema.empty_table()
    return table.cast(schema), bad


def write_dead_letters(directory: Path, source: str, bad: list[tuple[int, str, str]]) -> Path:
    """Write every malformed row of ``source`` to one dead-letter file, atomically."""
    target = directory / f"{Path(source).name}.jsonl"
    lines = [json.dumps({"file": source, "line": line, "reason": reason, "raw": raw},
                        ensure_ascii=False) for line, reason, raw in bad]
    atomic_write_bytes(target, ("\n".join(lines) + "\n").encode())
    return target


def infer_parquet_schema(path: str) -> StructType:
    """The Spark schema of the first Parquet file in ``path`` (for schema-less reads)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    directory = Path(path.removeprefix("file://"))
    names = list_input_files(directory)
    if not names:
        raise ConfigError(f"exactly.files source: no Parquet file in {directory} to take the "
                          "schema from; give it with .schema('id long, ...')")
    return from_arrow_schema(pq.read_schema(directory / names[0]))
