"""The audit itself: the expected rows against the target's rows, in an embedded DuckDB.

The expected rows are the input after the job's stateless part (``where``), or any SQL
query over the table ``input`` (``expect``): a projection, or the batch truth of an
aggregation. Both sides are grouped by the key columns; a full outer join of the two
groupings classifies every key as matched, missing, duplicated or unexpected, and a matched
key's compared columns as equal or differing (floats within a tolerance). The database is a
file in a temporary directory and DuckDB spills to it beyond ``memory_limit``, so a target of
any size is audited in bounded memory.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactly.auditor.locations import (
    DeltaLocation,
    FilesLocation,
    IcebergLocation,
    KafkaLocation,
    Location,
    ObjectFilesLocation,
    PostgresLocation,
    SqliteLocation,
)
from exactly.auditor.relation import EPOCH, INTERNAL, Relation, first_line, ident
from exactly.auditor.report import EpochLine, Finding, VerifyReport
from exactly.errors import AuditInputError

_FLOATS = ("FLOAT", "DOUBLE", "REAL", "DECIMAL")
_INTEGERS = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
             "UINTEGER", "UBIGINT", "UHUGEINT")


@dataclass(frozen=True)
class AuditSpec:
    """What to compare. ``keys`` identify a row (an event id, or the group-by keys of an
    aggregation); ``compare`` names columns whose values must agree too (``("*",)``: every
    expected column the output has). ``latest_by_key`` keeps each key's newest row of the
    target (a topic of updates, upserts across epoch directories); ``monotonic`` names a
    column that must never decrease along a key's history."""

    output: Location
    input: Location | None = None
    keys: tuple[str, ...] = ("id",)
    where: str | None = None
    expect: str | None = None
    compare: tuple[str, ...] = ()
    tolerance: float = 1e-9
    latest_by_key: bool = False
    monotonic: str | None = None
    isolation: str = "read_committed"
    epoch_column: str = "exactly_epoch"
    memory_limit: str = "1GB"
    samples: int = 10
    spill_dir: Path | None = None


def run_audit(spec: AuditSpec) -> VerifyReport:
    """Audit ``spec``; raises :class:`AuditInputError` for anything it cannot read."""
    import duckdb

    if spec.where and spec.expect:
        raise AuditInputError("give --where or --expect, not both (--expect can hold the "
                              "WHERE clause)")
    if spec.input is None and not spec.expect:
        raise AuditInputError("give --input (the job's input), or --expect with a query "
                              "that generates the expected rows")
    if not spec.keys:
        raise AuditInputError("--key: name at least one column")
    with tempfile.TemporaryDirectory(prefix="exactly-verify-", dir=spec.spill_dir) as tmp:
        con = duckdb.connect(str(Path(tmp, "audit.duckdb")), config={
            "memory_limit": spec.memory_limit, "temp_directory": str(Path(tmp, "spill")),
            "preserve_insertion_order": False, "autoinstall_known_extensions": False})
        try:
            return _Audit(con, spec).run()
        finally:
            con.close()


def attach(con, name: str, location: Location, spec: AuditSpec,
           columns: list[str] | None = None) -> Relation:
    """Attach ``location`` to ``con`` as the relation ``name``; a table, or files on an
    object store, copy only ``columns`` (and the epoch column) when they have them all,
    else every column."""
    if isinstance(location, FilesLocation):
        from exactly.auditor.files import attach_files
        return attach_files(con, name, location.path)
    if isinstance(location, ObjectFilesLocation):
        from exactly.auditor.objectfiles import attach_object_files
        return attach_object_files(con, name, location, columns)
    if isinstance(location, DeltaLocation):
        from exactly.auditor.delta import attach_delta
        return attach_delta(con, name, location, columns)
    if isinstance(location, IcebergLocation):
        from exactly.auditor.iceberg import attach_iceberg
        return attach_iceberg(con, name, location, columns)
    if isinstance(location, PostgresLocation):
        from exactly.auditor.postgres import attach_postgres
        return attach_postgres(con, name, location, spec.epoch_column, columns)
    if isinstance(location, KafkaLocation):
        from exactly.auditor.kafka import attach_kafka
        return attach_kafka(con, name, location, isolation=spec.isolation)
    if isinstance(location, SqliteLocation):
        from exactly.auditor.sqlite import attach_sqlite
        return attach_sqlite(con, name, location, columns)
    raise TypeError(location)


class _Audit:
    def __init__(self, con, spec: AuditSpec) -> None:
        self.con = con
        self.spec = spec
        self.keys = list(spec.keys)

    def sql(self, text: str, what: str | None = None) -> Any:
        import duckdb

        try:
            return self.con.execute(text)
        except duckdb.Error as exc:
            if what is None:
                raise
            raise AuditInputError(f"{what}: {first_line(exc)}") from None

    def columns(self, relation: str) -> dict[str, str]:
        rows = self.sql(f"DESCRIBE SELECT * FROM {ident(relation)}").fetchall()
        return {r[0]: r[1] for r in rows if not r[0].startswith(INTERNAL)}

    def run(self) -> VerifyReport:
        spec = self.spec
        source = attach(self.con, "input", spec.input, spec) if spec.input else None
        needed = None
        if source is None or not source.empty:
            self.expected_view()
            needed = self.needed_columns()
        target = attach(self.con, "output", spec.output, spec, needed)
        if source is not None and source.empty:  # the expected rows take the output's columns
            self.empty_input(target)
            self.expected_view()
        if target.empty:  # no rows, no history: every expected key is missing
            self.sql(f"CREATE VIEW output AS SELECT *, NULL::BIGINT AS {EPOCH} "
                     "FROM expected LIMIT 0")
            target.epoch, target.order = False, []
        expected, found = self.columns("expected"), self.columns("output")
        self.check_columns(expected, found, source, target)
        compare = self.compared(expected, found)
        self.found_view(target)
        unkeyed = (self.group("e", "expected", compare, self.key_casts(expected, found)),
                   self.group("f", "found", compare, {}))
        self.join(compare, expected, found)
        report = self.summary(compare, source, target, *unkeyed)
        if target.epoch:
            report.epochs = self.epochs()
        if spec.monotonic:
            report.backwards = self.backwards(target)
        return report

    def needed_columns(self) -> list[str] | None:
        """The output columns the audit reads (a table target copies only these); None for
        all, when ``*`` compares whatever the output has."""
        if self.spec.compare == ("*",):
            return None
        expected = self.columns("expected")
        names = [*self.keys, *self.compared(expected)]
        if self.spec.monotonic:
            names.append(self.spec.monotonic)
        return list(dict.fromkeys(names))

    # -- the two sides --------------------------------------------------------------------
    def empty_input(self, target: Relation) -> None:
        if target.empty:
            keys = ", ".join(f"NULL::BIGINT AS {ident(k)}" for k in self.keys)
            self.sql(f"CREATE VIEW input AS SELECT {keys} LIMIT 0")
        else:
            self.sql("CREATE VIEW input AS SELECT * FROM output LIMIT 0")

    def expected_view(self) -> None:
        spec = self.spec
        what = "--expect" if spec.expect else "--where"
        if spec.expect:
            self.sql(f"CREATE VIEW expected AS {spec.expect}", what)
        else:
            where = f" WHERE {spec.where}" if spec.where else ""
            self.sql(f"CREATE VIEW expected AS SELECT * FROM input{where}", what)
        # binding errors (a misspelt column) surface when the query first runs
        self.sql("SELECT * FROM expected LIMIT 0", what)

    def check_columns(self, expected: dict[str, str], found: dict[str, str],
                      source: Relation | None, target: Relation) -> None:
        where = (f"the input {source.description}" if source and not self.spec.expect
                 else "the expected rows")
        for key in self.keys:
            if key not in expected:
                raise AuditInputError(f"key column {key!r} is not in {where} (columns: "
                                      f"{', '.join(expected) or 'none'}); name it with --key")
            if key not in found:
                raise AuditInputError(f"key column {key!r} is not in the output "
                                      f"{target.description} (columns: "
                                      f"{', '.join(found) or 'none'}); name it with --key")
        if self.spec.monotonic and self.spec.monotonic not in found:
            raise AuditInputError(f"--monotonic {self.spec.monotonic}: no such column in "
                                  f"{target.description}")

    def compared(self, expected: dict[str, str], found: dict[str, str] | None = None
                 ) -> list[str]:
        """The columns to compare: ``*`` is every expected column the output has too; a
        named column must be in both (``found`` None: the output is not read yet)."""
        names = list(self.spec.compare)
        if names == ["*"]:
            return [c for c in expected if c not in self.keys and (found is None or c in found)]
        for name in names:
            if name not in expected:
                raise AuditInputError(f"--compare-columns {name}: not a column of the expected "
                                      f"rows ({', '.join(expected)})")
            if found is not None and name not in found:
                raise AuditInputError(f"--compare-columns {name}: not in the output (columns: "
                                      f"{', '.join(found)})")
        return [c for c in names if c not in self.keys]

    def key_casts(self, expected: dict[str, str], found: dict[str, str]) -> dict[str, str]:
        """Expected keys of another type than the target's are cast to it; a value that
        does not convert (an input id ``"x"``) becomes a row without a key."""
        return {k: found[k] for k in self.keys if expected[k] != found[k]}

    def found_view(self, target: Relation) -> None:
        if not self.spec.latest_by_key or target.empty:
            self.sql("CREATE VIEW found AS SELECT * FROM output")
            return
        if not target.order:
            raise AuditInputError(f"--latest-by-key: {target.description} records no order "
                                  "of its rows (a topic, the file sink's epoch directories, a "
                                  "Delta table or a table with an epoch column do)")
        keys = ", ".join(ident(k) for k in self.keys)
        order = ", ".join(f"{ident(c)} DESC NULLS LAST" for c in target.order)
        self.sql(f"CREATE VIEW found AS SELECT * FROM output QUALIFY row_number() OVER "
                 f"(PARTITION BY {keys} ORDER BY {order}) = 1")

    def group(self, table: str, relation: str, compare: list[str], casts: dict[str, str]
              ) -> int:
        """Group ``relation`` by key into ``table`` (rows per key, compared values) in one
        scan; return how many of its rows had no key (they are not in ``table``)."""
        keys = [f"TRY_CAST({ident(k)} AS {casts[k]}) AS {ident(k)}" if k in casts else ident(k)
                for k in self.keys]
        no_key = " OR ".join(f"{ident(k)} IS NULL" for k in self.keys)
        values = "".join(f", any_value({ident(c)}) AS {ident(c)}" for c in compare)
        self.sql(f"CREATE TABLE {table} AS SELECT {', '.join(ident(k) for k in self.keys)}, "
                 f"count(*) AS __x_n{values} FROM (SELECT {', '.join(keys)}"
                 f"{''.join(', ' + ident(c) for c in compare)} FROM {relation}) GROUP BY ALL",
                 f"reading {relation}")
        unkeyed = int(self.sql(f"SELECT coalesce(sum(__x_n), 0) FROM {table} "
                               f"WHERE {no_key}").fetchone()[0])
        self.sql(f"DELETE FROM {table} WHERE {no_key}")
        return unkeyed

    def join(self, compare: list[str], expected: dict[str, str], found: dict[str, str]
             ) -> None:
        keys = ", ".join(f"coalesce(e.{ident(k)}, f.{ident(k)}) AS {ident(k)}" for k in self.keys)
        on = " AND ".join(f"e.{ident(k)} = f.{ident(k)}" for k in self.keys)
        diffs = [self.differs(c, expected[c], found[c]) for c in compare]
        differs = " OR ".join(f"coalesce({d}, false)" for d in diffs) or "false"
        self.sql(f"CREATE TABLE cmp AS SELECT {keys}, e.__x_n AS en, f.__x_n AS fn, "
                 f"CASE WHEN e.__x_n IS NOT NULL AND f.__x_n = 1 THEN ({differs}) ELSE false "
                 f"END AS differs FROM e FULL JOIN f ON {on}", "comparing the keys")

    def differs(self, column: str, expected_type: str, found_type: str) -> str:
        e, f = f"e.{ident(column)}", f"f.{ident(column)}"
        numeric = all(t.startswith(_FLOATS + _INTEGERS) for t in (expected_type, found_type))
        if numeric and any(t.startswith(_FLOATS) for t in (expected_type, found_type)):
            tol = repr(float(self.spec.tolerance))
            return (f"(({e} IS NULL) <> ({f} IS NULL) OR abs(CAST({e} AS DOUBLE) - CAST({f} "
                    f"AS DOUBLE)) > {tol} * greatest(1.0, abs(CAST({e} AS DOUBLE)), "
                    f"abs(CAST({f} AS DOUBLE))))")
        if numeric or expected_type == found_type:
            return f"({e} IS DISTINCT FROM {f})"
        return f"(CAST({e} AS VARCHAR) IS DISTINCT FROM CAST({f} AS VARCHAR))"

    # -- the verdict ----------------------------------------------------------------------
    def summary(self, compare: list[str], source: Relation | None, target: Relation,
                e_nokey: int, f_nokey: int) -> VerifyReport:
        row = self.sql("""
            SELECT count(*) FILTER (WHERE en IS NOT NULL),
                   count(*) FILTER (WHERE en IS NOT NULL AND fn IS NULL),
                   count(*) FILTER (WHERE fn > 1),
                   coalesce(sum(fn - 1) FILTER (WHERE fn > 1), 0),
                   count(*) FILTER (WHERE en IS NULL),
                   count(*) FILTER (WHERE differs),
                   coalesce(sum(en - 1) FILTER (WHERE en > 1), 0),
                   coalesce(sum(fn), 0)
            FROM cmp""").fetchone()
        (expected_keys, missing, duplicated, extra, unexpected, differing, input_dups,
         keyed_rows) = (int(v) for v in row)
        value_columns = ", ".join(f"e.{ident(c)} AS {ident('expected ' + c)}, "
                                  f"f.{ident(c)} AS {ident('found ' + c)}" for c in compare)
        on_e = " AND ".join(f"e.{ident(k)} = c.{ident(k)}" for k in self.keys)
        on_f = " AND ".join(f"f.{ident(k)} = c.{ident(k)}" for k in self.keys)
        differing_sample = self.sample(
            f"SELECT {', '.join('c.' + ident(k) for k in self.keys)}, {value_columns} "
            f"FROM cmp c JOIN e ON {on_e} JOIN f ON {on_f} WHERE c.differs") if differing else []
        return VerifyReport(
            input=source.description if source else f"--expect {self.spec.expect}",
            output=target.description, keys=self.keys, compared=compare,
            expected_keys=expected_keys, found_rows=keyed_rows + f_nokey,
            missing=Finding(missing, self.keys_where("en IS NOT NULL AND fn IS NULL", missing)),
            duplicated=Finding(duplicated, self.keys_where("fn > 1", duplicated, "fn AS rows")),
            duplicate_extra_rows=extra,
            unexpected=Finding(unexpected, self.keys_where("en IS NULL", unexpected,
                                                           "fn AS rows")),
            differing=Finding(differing, differing_sample),
            input_duplicates=input_dups, input_rows_without_key=e_nokey,
            output_rows_without_key=f_nokey, latest_by_key=self.spec.latest_by_key)

    def keys_where(self, condition: str, count: int, extra: str = "") -> list[dict[str, Any]]:
        if not count:
            return []
        columns = ", ".join([ident(k) for k in self.keys] + ([extra] if extra else []))
        return self.sample(f"SELECT {columns} FROM cmp WHERE {condition}")

    def sample(self, query: str) -> list[dict[str, Any]]:
        order = ", ".join(str(i + 1) for i in range(len(self.keys)))
        cursor = self.sql(f"{query} ORDER BY {order} LIMIT {int(self.spec.samples)}")
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, (_plain(v) for v in r), strict=True)) for r in cursor.fetchall()]

    def epochs(self) -> list[EpochLine]:
        on = " AND ".join(f"o.{ident(k)} = c.{ident(k)}" for k in self.keys)
        rows = self.sql(f"""
            SELECT o.{EPOCH}, count(*), count(*) FILTER (WHERE c.fn > 1),
                   count(*) FILTER (WHERE c.en IS NULL), count(*) FILTER (WHERE c.differs)
            FROM found o JOIN cmp c ON {on} GROUP BY 1 ORDER BY 1 NULLS LAST""").fetchall()
        return [EpochLine(None if r[0] is None else int(r[0]), *(int(v) for v in r[1:]))
                for r in rows]

    def backwards(self, target: Relation) -> Finding:
        if target.empty:
            return Finding()
        if not target.order:
            raise AuditInputError(f"--monotonic: {target.description} keeps no history of a "
                                  "key's values (a topic, the file sink's epoch directories or "
                                  "an append-only Delta table do; a table holds only the "
                                  "latest)")
        keys = ", ".join(ident(k) for k in self.keys)
        column = ident(str(self.spec.monotonic))
        order = ", ".join(ident(c) for c in target.order)
        self.sql(f"""CREATE TABLE back AS SELECT * FROM (
                SELECT {keys}, lag({column}) OVER (PARTITION BY {keys} ORDER BY {order})
                           AS before, {column} AS after{''.join(', ' + ident(c) for c in
                                                                 target.order)}
                FROM output) WHERE after < before""", "--monotonic")
        count = int(self.sql(f"SELECT count(DISTINCT ({keys})) FROM back").fetchone()[0])
        return Finding(count, self.sample("SELECT * FROM back") if count else [])


def _plain(value: Any) -> Any:
    """A sample value as JSON can hold it."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
