"""``exactly verify`` against a real PostgreSQL server: tables as output and input, the
password never printed, the per-epoch breakdown from ``exactly_epoch``, a wrong aggregate
named, a table that does not exist refused with exit 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from psycopg import sql

from exactly.cli import main


def create(conn, table: str, rows: list[tuple]) -> None:
    conn.execute(sql.SQL("CREATE TABLE {} (id bigint, key text, amount numeric(10, 2), "
                         "exactly_epoch bigint)").format(sql.Identifier(table)))
    with conn.cursor() as cur, cur.copy(sql.SQL("COPY {} FROM STDIN").format(
            sql.Identifier(table))) as copy:
        for row in rows:
            copy.write_row(row)


def events(n: int) -> list[tuple]:
    """Rows (id, key, amount, epoch): 100 rows per epoch."""
    return [(i, f"k{i % 5}", f"{(i % 9) - 3}.25", i // 100) for i in range(n)]


def verify(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, ["verify", *args], env=env)


def url(pg, table: str) -> str:
    return f"{pg.dsn}?table={table}"


def test_a_table_passes_and_the_password_is_never_printed(pg, conn, table_name, tmp_path):
    rows = events(1000)
    create(conn, table_name, [r for r in rows if float(r[2]) > 0])
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i, "key": k, "amount": float(a)}) + "\n"
                              for i, k, a, _ in rows))
    result = verify("--input", str(source), "--output", url(pg, table_name),
                    "--where", "amount > 0", "--compare-columns", "key,amount")
    assert result.exit_code == 0, result.output
    assert "EXACTLY ONCE" in result.output
    assert pg.password not in result.output and "***" in result.output
    assert "per epoch: 10 epochs, 0 with mismatches" in result.output


def test_a_duplicated_row_is_named_with_its_epoch_via_dsn_env(pg, conn, table_name):
    rows = events(500)
    create(conn, table_name, [*rows, (123, "k3", "1.25", 4)])  # id 123 again, in epoch 4
    result = verify("--expect", "select range as id from range(500)", "--dsn-env", "PG_DSN",
                    "--table", table_name, "--json", env={"PG_DSN": pg.dsn})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["duplicated"] == {"count": 1, "sample": [{"id": 123, "rows": 2}]}
    assert [(e["epoch"], e["duplicated_rows"]) for e in report["epochs"]] == [
        (0, 0), (1, 1), (2, 0), (3, 0), (4, 1)]
    assert pg.password not in result.output


def test_an_aggregate_table_against_an_input_table(pg, conn, table_name):
    """The batch truth of a per-key count and sum, computed from an input table, against the
    job's final table; one key's sum off by a cent is named, with both values."""
    rows = events(700)
    create(conn, f"{table_name}_in", rows)
    totals: dict[str, list] = {}
    for _, key, amount, _ in rows:
        t = totals.setdefault(key, [0, 0.0])
        t[0] += 1
        t[1] += float(amount)
    conn.execute(sql.SQL("CREATE TABLE {} (key text PRIMARY KEY, n bigint, total double "
                         "precision)").format(sql.Identifier(table_name)))
    for key, (n, total) in totals.items():
        off = 0.01 if key == "k2" else 0.0
        conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(
            sql.Identifier(table_name)), (key, n, total + off))
    args = ["--input-table", f"{table_name}_in", "--table", table_name, "--dsn-env", "PG_DSN",
            "--key", "key", "--compare-columns", "n,total", "--json", "--expect",
            "select key, count(*) as n, sum(amount) as total from input group by key"]
    result = verify(*args, env={"PG_DSN": pg.dsn})
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["differing"]["count"] == 1
    (sample,) = report["differing"]["sample"]
    assert sample["key"] == "k2"
    assert sample["found total"] == pytest.approx(sample["expected total"] + 0.01)
    looser = verify(*args, "--tolerance", "1e-3", env={"PG_DSN": pg.dsn})
    assert looser.exit_code == 0, looser.output


def test_a_table_that_does_not_exist_is_exit_2(pg):
    result = verify("--expect", "select 1 as id", "--output", url(pg, "no_such_table"))
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "verify: bad input: table no_such_table does not exist in "
        + pg.dsn.replace(pg.password, "***")]


def test_an_empty_table_misses_every_expected_row(pg, conn, table_name):
    create(conn, table_name, [])
    result = verify("--expect", "select range as id from range(5)", "--output",
                    url(pg, table_name), "--json")
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    assert report["found_rows"] == 0 and report["missing"]["count"] == 5
