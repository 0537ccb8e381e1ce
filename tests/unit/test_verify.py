"""``exactly verify`` on files and SQLite: each kind of mismatch detected and named, correct
filtered, projected and aggregated outputs passing, bad input refused with exit 2."""

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from exactly.auditor import AuditSpec, FilesLocation, SqliteLocation, run_audit
from exactly.cli import main
from exactly.errors import AuditInputError

EVENTS = [{"id": i, "key": f"k{i % 3}", "amount": round((i % 7) - 2.5, 2)} for i in range(60)]


def write_input(root: Path, rows=EVENTS) -> Path:
    """The job's input as the file source reads it: JSON lines in two files."""
    root.mkdir(parents=True)
    half = len(rows) // 2
    for name, part in (("a.jsonl", rows[:half]), ("b.jsonl", rows[half:])):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    return root


def write_output(root: Path, epochs: list[list[dict]]) -> Path:
    """The file sink's layout: one directory per epoch, staging and log skipped."""
    for n, rows in enumerate(epochs, start=1):
        directory = root / f"epoch-{n:012d}"
        directory.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), directory / "part-00000.parquet")
    (root / "_staging" / "9").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(EVENTS), root / "_staging" / "9" / "part.parquet")
    return root


def positive() -> list[dict]:
    return [r for r in EVENTS if r["amount"] > 0]


def audit(tmp_path: Path, epochs: list[list[dict]], **spec) -> object:
    source = tmp_path / "in"
    if not source.exists():
        write_input(source)
    return run_audit(AuditSpec(input=FilesLocation(source),
                               output=FilesLocation(write_output(tmp_path / "out", epochs)),
                               **spec))


def test_a_filtered_output_passes_with_the_jobs_where(tmp_path):
    rows = positive()
    report = audit(tmp_path, [rows[:10], rows[10:]], where="amount > 0", compare=("*",))
    assert report.ok, report.rows()
    assert (report.expected_keys, report.found_rows) == (len(rows), len(rows))
    assert [(e.epoch, e.rows) for e in report.epochs] == [(1, 10), (2, len(rows) - 10)]


def test_without_the_filter_the_filtered_ids_are_missing(tmp_path):
    rows = positive()
    report = audit(tmp_path, [rows])
    assert not report.ok
    assert report.missing.count == len(EVENTS) - len(rows)
    assert report.missing.sample[0] == {"id": 0}


def test_a_duplicated_row_is_named_with_its_epochs(tmp_path):
    rows = positive()
    report = audit(tmp_path, [rows[:10], rows[9:]], where="amount > 0")
    assert not report.ok
    assert report.duplicated.count == 1 and report.duplicate_extra_rows == 1
    assert report.duplicated.sample == [{"id": rows[9]["id"], "rows": 2}]
    assert [e.duplicated_rows for e in report.epochs] == [1, 1]
    assert (report.missing.count, report.unexpected.count) == (0, 0)


def test_a_missing_row_is_named(tmp_path):
    rows = positive()
    report = audit(tmp_path, [rows[:5] + rows[6:]], where="amount > 0")
    assert not report.ok
    assert report.missing.count == 1 and report.missing.sample == [{"id": rows[5]["id"]}]


def test_an_extra_key_is_unexpected(tmp_path):
    rows = [*positive(), {"id": 999, "key": "k0", "amount": 1.0}]
    report = audit(tmp_path, [rows], where="amount > 0")
    assert not report.ok
    assert report.unexpected.sample == [{"id": 999, "rows": 1}]
    assert report.epochs[0].unexpected_rows == 1


def test_a_changed_value_is_named_and_floats_have_a_tolerance(tmp_path):
    rows = [dict(r) for r in positive()]
    rows[3]["amount"] += 1e-12  # float noise: equal within the tolerance
    rows[4]["key"] = "changed"
    report = audit(tmp_path, [rows], where="amount > 0", compare=("key", "amount"))
    assert not report.ok
    assert report.differing.count == 1
    assert report.differing.sample == [{"id": rows[4]["id"], "expected key": positive()[4]["key"],
                                        "found key": "changed",
                                        "expected amount": rows[4]["amount"],
                                        "found amount": rows[4]["amount"]}]
    strict = run_audit(AuditSpec(input=FilesLocation(tmp_path / "in"),
                                 output=FilesLocation(tmp_path / "out"), where="amount > 0",
                                 compare=("amount",), tolerance=0.0))
    assert strict.differing.count == 1 and strict.differing.sample[0]["id"] == rows[3]["id"]


def test_a_projection_passes_as_an_expect_query(tmp_path):
    rows = [{"id": r["id"], "key": r["key"].upper(), "amount": r["amount"] * 2} for r in positive()]
    report = audit(tmp_path, [rows], compare=("*",), expect=(
        "select id, upper(key) as key, amount * 2 as amount from input where amount > 0"))
    assert report.ok, report.rows()
    assert report.compared == ["key", "amount"]


def aggregate(rows: list[dict]) -> list[dict]:
    totals: dict[str, dict] = {}
    for r in rows:
        t = totals.setdefault(r["key"], {"key": r["key"], "n": 0, "total": 0.0})
        t["n"] += 1
        t["total"] += r["amount"]
    return list(totals.values())


AGGREGATE = "select key, count(*) as n, sum(amount) as total from input group by key"


def sqlite_table(path: Path, rows: list[dict]) -> SqliteLocation:
    with closing(sqlite3.connect(path)) as db:
        db.execute('CREATE TABLE "totals" (key TEXT PRIMARY KEY, n INTEGER, total REAL)')
        db.executemany('INSERT INTO "totals" VALUES (:key, :n, :total)', rows)
        db.commit()
    return SqliteLocation(path, "totals")


def test_an_aggregate_in_a_sqlite_table_passes_and_a_wrong_one_is_named(tmp_path):
    source = FilesLocation(write_input(tmp_path / "in"))
    spec = {"input": source, "keys": ("key",), "expect": AGGREGATE,
            "compare": ("n", "total")}
    right = run_audit(AuditSpec(output=sqlite_table(tmp_path / "ok.db", aggregate(EVENTS)),
                                **spec))
    assert right.ok, right.rows()
    wrong_rows = aggregate(EVENTS)
    wrong_rows[1]["n"] += 1  # one event counted twice
    del wrong_rows[2]
    wrong = run_audit(AuditSpec(output=sqlite_table(tmp_path / "bad.db", wrong_rows), **spec))
    assert not wrong.ok
    assert wrong.differing.sample[0]["key"] == wrong_rows[1]["key"]
    assert wrong.differing.sample[0]["found n"] == wrong.differing.sample[0]["expected n"] + 1
    assert wrong.missing.sample == [{"key": aggregate(EVENTS)[2]["key"]}]


def test_latest_by_key_across_epochs_and_values_that_moved_backwards(tmp_path):
    """Update mode into the file sink: each epoch writes the keys it changed; the newest
    epoch's value is the result. A running count that went down is named."""
    half = EVENTS[:30]
    epochs = [aggregate(half), aggregate(EVENTS)]
    spec = {"keys": ("key",), "expect": AGGREGATE, "compare": ("n", "total"),
            "latest_by_key": True, "monotonic": "n"}
    report = audit(tmp_path, epochs, **spec)
    assert report.ok, report.rows()
    assert report.backwards.count == 0
    regressed = [dict(r) for r in aggregate(EVENTS)]
    regressed[0]["n"] = 1  # epoch 3 replays an old count over the newest
    bad = audit(tmp_path / "again", [*epochs, regressed], **spec)
    assert not bad.ok
    assert bad.backwards.count == 1
    assert bad.backwards.sample[0]["key"] == regressed[0]["key"]
    assert bad.backwards.sample[0]["after"] == 1 and bad.backwards.sample[0]["__x_epoch"] == 3


def test_input_rows_without_a_readable_id_are_counted_not_fatal(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"id": 1}\n{"id": "x"}\nnot json\n{"id": 2}\n')
    report = audit(tmp_path, [[{"id": 1}, {"id": 2}]])
    assert report.ok, report.rows()
    assert report.input_rows_without_key == 2


def test_an_empty_output_misses_every_expected_row(tmp_path):
    write_input(tmp_path / "in")
    (tmp_path / "out").mkdir()
    report = run_audit(AuditSpec(input=FilesLocation(tmp_path / "in"),
                                 output=FilesLocation(tmp_path / "out"), compare=("*",)))
    assert report.missing.count == len(EVENTS) and report.found_rows == 0
    latest = run_audit(AuditSpec(input=FilesLocation(tmp_path / "in"),
                                 output=FilesLocation(tmp_path / "out"), keys=("key",),
                                 expect=AGGREGATE, latest_by_key=True, monotonic="n"))
    assert latest.missing.count == 3 and latest.backwards.count == 0 and not latest.ok


def test_csv_input_and_an_expect_without_input(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "ids.csv").write_text("id,key\n" + "".join(f"{i},k\n" for i in range(5)))
    write_output(tmp_path / "out", [[{"id": i} for i in range(5)]])
    from_csv = run_audit(AuditSpec(input=FilesLocation(tmp_path / "in"),
                                   output=FilesLocation(tmp_path / "out")))
    generated = run_audit(AuditSpec(expect="select range as id from range(6)",
                                    output=FilesLocation(tmp_path / "out")))
    assert from_csv.ok and not generated.ok and generated.missing.sample == [{"id": 5}]


@pytest.mark.parametrize("spec, message", [
    ({"expect": "selec id from input"}, "--expect: Parser Error"),
    ({"where": "amout > 0"}, '--where: Binder Error: Referenced column "amout"'),
    ({"keys": ("event_id",)}, "key column 'event_id' is not in the input"),
    ({"compare": ("price",)}, "--compare-columns price: not a column"),
    ({"where": "amount > 0", "expect": "select 1"}, "give --where or --expect, not both"),
    ({"monotonic": "n"}, "--monotonic n: no such column"),
])
def test_bad_input_is_one_clear_error(tmp_path, spec, message):
    with pytest.raises(AuditInputError, match=None) as caught:
        audit(tmp_path, [positive()], **spec)
    assert str(caught.value).startswith(message), str(caught.value)


def cli(*args: str):
    return CliRunner().invoke(main, ["verify", *args])


def test_cli_exit_status_and_json_report(tmp_path):
    write_input(tmp_path / "in")
    write_output(tmp_path / "out", [positive()])
    ok = cli("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
             "--where", "amount > 0", "--compare-columns", "*")
    assert ok.exit_code == 0 and "EXACTLY ONCE" in ok.output, ok.output
    assert "per epoch: 1 epochs, 0 with mismatches" in ok.output
    bad = cli("--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--json")
    assert bad.exit_code == 1
    report = json.loads(bad.stdout)
    assert report["ok"] is False and report["missing"]["count"] == len(EVENTS) - len(positive())
    assert report["epochs"] == [{"epoch": 1, "rows": len(positive()), "duplicated_rows": 0,
                                 "unexpected_rows": 0, "differing_rows": 0}]


@pytest.mark.parametrize("args, message", [
    (["--output", "nowhere"], "--output: nowhere does not exist"),
    (["--output", "sqlite:///{tmp}/x.db?table=t"], "SQLite database"),
    (["--output", "sqlite:///{tmp}/db.sqlite?table=absent"], "no such table: absent"),
    (["--output", "ftp://host/x"], "unknown scheme ftp://"),
    (["--output", "kafka://127.0.0.1:1"], "write kafka://host:port/topic"),
    (["--table", "t", "--dsn-env", "EXACTLY_TEST_NO_SUCH_VARIABLE"],
     "the environment variable EXACTLY_TEST_NO_SUCH_VARIABLE (--dsn-env) is not set"),
    (["--output", "{tmp}/out", "--expect", "select id frm input"], "--expect: Parser Error"),
    (["--output", "{tmp}/broken"], "broken: cannot read its data files"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, args, message):
    write_input(tmp_path / "in")
    write_output(tmp_path / "out", [positive()])
    with closing(sqlite3.connect(tmp_path / "db.sqlite")) as db:
        db.execute("CREATE TABLE present (id INTEGER)")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "part.parquet").write_bytes(b"not parquet at all")
    result = cli("--input", str(tmp_path / "in"), *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verify: bad input: ")
    assert message in lines[0], lines[0]
