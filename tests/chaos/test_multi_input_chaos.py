"""Barrier alignment under kill -9: a pipeline with two replayable inputs and one 2PC sink.

docs/design.md section 1 claims alignment holds by construction: an epoch is one bulk-synchronous
step, and every input of a union or join is cut at epoch n's positions in Spark's offset log
before any record of n is processed. These tests put that claim under crashes.

Inputs: *orders*, JSON-lines files read by the ``exactly.files`` source (one file an epoch),
and *payments*, a PostgreSQL table read by the ``exactly.postgres`` source by its increasing
key (60 rows an epoch, so the two inputs are cut at different places). Payment ids are order
ids' range offset by 1,000,000, and payments are inserted in the reverse order of their
orders, so a join must match rows that arrive epochs apart. The job
(``tests/chaos/multi_input_job.py``) is its own driver process; it is killed with SIGKILL at
a protocol point, more orders and payments are added to BOTH inputs while it is down, and it
is restarted until both inputs are drained. Then:

- every order id and every payment id is in the output exactly once;
- no pre-commit, intent or half-published epoch is left;
- the output equals a crash-free Spark batch run of the same transformation over the same
  input (all rows, added ones included);
- for the union, each committed epoch's output is exactly the rows of both inputs between
  that epoch's positions and the previous epoch's positions in Spark's offset log, so the
  replayed epoch saw neither more nor less of either input than before the crash.
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from multi_input_job import DSN_ENV, ORDER_SCHEMA, PAYMENTS_DDL, TRANSFORMS

from exactly.audit import audit_ids, data_files
from exactly.connectors.datagen import generate
from exactly.protocol.faults import FaultPoint, FaultSpec
from exactly.testing.chaos import Attempt, run_with_crashes
from exactly.testing.file_output import assert_no_dangling_pre_commits

pytestmark = pytest.mark.chaos
JOB = Path(__file__).with_name("multi_input_job.py")
FILES, ORDERS_PER_FILE = 4, 50  # 4 files of 50 orders, one file an epoch -> epochs 0..3
ROWS_PER_EPOCH = 60  # 200 payments, 60 an epoch: cut at other places than the orders
ADDED = 30  # orders (one new file) and payments added while the job is down after a crash
TABLE_ID_OFFSET = 1_000_000
#: the default lane kills the join twice, before and after the intent (an epoch replayed
#: from its logged positions, and one finished from its intent); the slow proofs kill the
#: union and the join at every point (CI budget). The file sink's own every-point run is
#: tests/chaos/test_file_sink_chaos.py
JOIN_POINTS = (FaultPoint.AFTER_INTENT, FaultPoint.AFTER_COMPLETE)
EVERY_POINT = tuple(FaultPoint)


class Inputs:
    """The two inputs of the job, and what was put into each."""

    def __init__(self, pg, directory: Path) -> None:
        self.pg = pg
        self.directory = directory
        self.table = f"payments_{uuid.uuid4().hex[:8]}"
        self.files: dict[str, list[int]] = {}  # file name -> its order ids
        self.payments: list[int] = []  # payment ids, in key (= insertion) order
        directory.mkdir(parents=True)
        with pg.connect() as conn:
            conn.execute(f'CREATE TABLE "{self.table}" {PAYMENTS_DDL}')

    def add(self, files: int, per_file: int) -> None:
        """``files`` new files of ``per_file`` orders, then one payment for each of those
        orders, inserted in the reverse order of the orders (the table key grows while the
        order id falls), so an order and its payment are mostly taken by different epochs."""
        start = len(self.order_ids)
        rows = generate(start, start + files * per_file, keys=20, seed=7).to_pylist()
        for i in range(files):
            chunk = rows[i * per_file:(i + 1) * per_file]
            name = f"orders-{len(self.files):05d}.jsonl"
            tmp = self.directory / f".{name}.tmp"
            tmp.write_text("".join(json.dumps({**r, "event_time": r["event_time"].isoformat()})
                                   + "\n" for r in chunk))
            tmp.rename(self.directory / name)  # published atomically, sorting after the others
            self.files[name] = [r["id"] for r in chunk]
        first = TABLE_ID_OFFSET + len(self.payments)
        payments = [(first + i, r["id"], r["key"], r["amount"] + 0.5,
                     r["event_time"] + timedelta(seconds=1)) for i, r in enumerate(reversed(rows))]
        with self.pg.connect() as conn, conn.cursor() as cur, \
                cur.copy(f'COPY "{self.table}" FROM STDIN') as copy:
            for row in payments:
                copy.write_row(row)
        self.payments.extend(p[0] for p in payments)

    @property
    def order_ids(self) -> list[int]:
        return [i for ids in self.files.values() for i in ids]

    def batch_frames(self, spark):
        """The same input, as batch DataFrames: the crash-free reference reads these."""
        schema = pa.schema([("id", pa.int64()), ("key", pa.string()), ("amount", pa.float64()),
                            ("event_time", pa.timestamp("us", tz="UTC"))])
        orders = pa.concat_tables(
            pajson.read_json(self.directory / name,
                             parse_options=pajson.ParseOptions(explicit_schema=schema))
            for name in self.files)
        with self.pg.connect() as conn:
            payments = conn.execute(f'SELECT id, order_id, key, amount, event_time '
                                    f'FROM "{self.table}"').fetchall()
        return (spark.createDataFrame(orders.to_pylist(), schema=ORDER_SCHEMA),
                spark.createDataFrame(payments, schema="id long, order_id long, key string, "
                                                       "amount double, event_time timestamp"))


def job(variant: str, inputs: Inputs, tmp: Path) -> list[str]:
    return [sys.executable, str(JOB), "--variant", variant, "--input", str(inputs.directory),
            "--table", inputs.table, "--output", str(tmp / "out"), "--checkpoint",
            str(tmp / "ck"), "--files-per-epoch", "1", "--rows-per-epoch", str(ROWS_PER_EPOCH)]


def run_until_drained(variant: str, inputs: Inputs, tmp: Path,
                      schedule: list[FaultSpec]) -> list[Attempt]:
    """Run the job with one fault armed per attempt; after every crash, add rows to both
    inputs before the restart. Every armed fault must fire, at the epoch it was armed for."""

    def grow_inputs_while_down(attempt: Attempt) -> None:
        if attempt.crashed:
            inputs.add(1, ADDED)

    attempts = run_with_crashes(job(variant, inputs, tmp), schedule,
                                env={DSN_ENV: inputs.pg.dsn}, on_end=grow_inputs_while_down,
                                timeout=300)
    fired = [(a.fired["point"], a.fired["epoch"]) for a in attempts if a.crashed]
    assert fired == [(s.point, s.min_epoch) for s in schedule]
    assert attempts[-1].returncode == 0
    return attempts


def output_table(out: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(f) for f in data_files(out))


def ids_of(table: pa.Table, column: str = "id") -> np.ndarray:
    return table.column(column).to_numpy()


def rows_of(table: pa.Table) -> list[tuple]:
    columns = [table.column(name).to_pylist() for name in table.column_names]
    return sorted(zip(*columns, strict=True))


def assert_equals_crash_free_batch_run(variant: str, inputs: Inputs, out: pa.Table,
                                       spark) -> None:
    orders, payments = inputs.batch_frames(spark)
    reference = TRANSFORMS[variant](orders, payments)
    assert reference.columns == out.column_names
    expected = sorted(tuple(r) for r in reference.collect())
    got = rows_of(out)
    assert len(got) == len(expected)
    assert got == expected


def logged_positions(ck: Path, batch: int) -> tuple[dict, dict]:
    """(files source offset, table source offset) that Spark logged for ``batch``."""
    lines = (ck / "offsets" / str(batch)).read_text().splitlines()
    offsets = [json.loads(line) for line in lines[2:] if line.strip() not in ("", "-")]
    files = [o for o in offsets if isinstance(o, dict) and "last" in o]
    table = [o for o in offsets if isinstance(o, dict) and "key" in o]
    assert len(files) == len(table) == 1, lines
    return files[0], table[0]


def batch_that_took_each_row(inputs: Inputs, ck: Path) -> dict[int, int]:
    """Input id -> the committed batch whose logged positions enclose it (files: by name,
    table: by key), each batch starting where the previous one's positions ended."""
    batches = sorted(int(p.name) for p in (ck / "commits").iterdir() if p.name.isdigit())
    assert batches == list(range(len(batches)))
    taken: dict[int, int] = {}
    last_file, last_key = "", None
    for batch in batches:
        files_end, table_end = logged_positions(ck, batch)
        for name, ids in inputs.files.items():
            if last_file < name <= files_end["last"]:
                taken.update(dict.fromkeys(ids, batch))
        if table_end["key"] is not None:
            taken.update({p: batch for p in inputs.payments
                          if (last_key is None or p > last_key) and p <= table_end["key"]})
        last_file, last_key = files_end["last"], table_end["key"]
    assert sorted(taken) == sorted(inputs.order_ids + inputs.payments), \
        "the committed batches' positions do not cover the inputs"
    return taken


def output_by_epoch(out: Path) -> dict[int, pa.Table]:
    epochs = {}
    for f in data_files(out):
        assert f.parent.name.startswith("epoch-"), f
        epochs.setdefault(int(f.parent.name.removeprefix("epoch-")), []).append(pq.read_table(f))
    return {e: pa.concat_tables(tables) for e, tables in epochs.items()}


def assert_each_epoch_is_cut_at_its_logged_positions(variant: str, inputs: Inputs, ck: Path,
                                                     out: Path) -> None:
    """Every output row is in the epoch that first had all of its input rows: a union row in
    the batch that took its row, a join pair in the later of its two rows' batches. So each
    epoch, replayed or not, saw exactly both inputs' rows between its logged positions."""
    taken = batch_that_took_each_row(inputs, ck)
    misplaced = []
    for epoch, table in output_by_epoch(out).items():
        orders = ids_of(table).tolist()
        if variant == "union":
            expected = [taken[i] for i in orders]
        else:
            expected = [max(taken[o], taken[p])
                        for o, p in zip(orders, ids_of(table, "payment_id").tolist(), strict=True)]
        misplaced += [(epoch, e, i) for i, e in zip(orders, expected, strict=True) if e != epoch]
    assert misplaced == [], f"(output epoch, epoch of its input, id): {misplaced[:10]}"


def assert_both_inputs_exactly_once(variant: str, inputs: Inputs, out: pa.Table) -> None:
    if variant == "union":  # one id column holds both inputs
        report = audit_ids(ids_of(out), np.array(inputs.order_ids + inputs.payments))
        assert report.ok, report.to_json()
        return
    orders = audit_ids(ids_of(out), np.array(inputs.order_ids))
    assert orders.ok, orders.to_json()
    payments = audit_ids(ids_of(out, "payment_id"), np.array(inputs.payments))
    assert payments.ok, payments.to_json()


def assert_audits_clean(variant: str, inputs: Inputs, tmp: Path, spark) -> None:
    out = output_table(tmp / "out")
    assert_both_inputs_exactly_once(variant, inputs, out)
    assert_no_dangling_pre_commits(tmp / "out")
    assert_each_epoch_is_cut_at_its_logged_positions(variant, inputs, tmp / "ck", tmp / "out")
    assert_equals_crash_free_batch_run(variant, inputs, out, spark)


def fresh_inputs(pg, tmp: Path) -> Inputs:
    inputs = Inputs(pg, tmp / "orders")
    inputs.add(FILES, ORDERS_PER_FILE)
    return inputs


@pytest.mark.slow  # CI budget (issue 28): the join run below kills a two-input query (a file
# source and a PostgreSQL source) at protocol points in the default lane
def test_union_killed_at_protocol_points_in_turn_commits_both_inputs_exactly_once(
        pg, spark, tmp_path):
    """One run killed at every protocol point in turn (the i-th at epoch i + 1), rows added
    to both inputs while it is down after each crash."""
    inputs = fresh_inputs(pg, tmp_path)
    schedule = [FaultSpec(point, i + 1) for i, point in enumerate(EVERY_POINT)]
    run_until_drained("union", inputs, tmp_path, schedule)
    assert len(inputs.files) == FILES + len(schedule)
    assert_audits_clean("union", inputs, tmp_path, spark)


@pytest.mark.slow
@pytest.mark.parametrize("point", list(FaultPoint), ids=lambda p: p.value)
def test_union_killed_at_a_protocol_point_commits_both_inputs_exactly_once(point, pg, spark,
                                                                           tmp_path):
    """Killed once at ``point`` in epoch 1 (each point in a run of its own); rows added to
    both inputs while it is down."""
    inputs = fresh_inputs(pg, tmp_path)
    run_until_drained("union", inputs, tmp_path, [FaultSpec(point, 1)])
    assert len(inputs.files) == FILES + 1
    assert len(inputs.payments) == FILES * ORDERS_PER_FILE + ADDED
    assert_audits_clean("union", inputs, tmp_path, spark)


def test_join_killed_at_protocol_points_in_turn_joins_both_inputs_exactly_once(
        pg, spark, tmp_path):
    """Stream-stream inner join with watermarks on both sides; payments arrive in the reverse
    order of their orders, so most pairs meet across epochs through the join state. One run,
    killed at two protocol points in turn (the i-th at epoch i + 1), rows added to both
    inputs after every crash: each order is joined with its payment exactly once, in the
    epoch that took the later of the two, as in a batch join."""
    join_killed_in_turn(pg, spark, tmp_path, JOIN_POINTS)


@pytest.mark.slow
def test_join_killed_at_every_protocol_point_in_turn_joins_both_inputs_exactly_once(
        pg, spark, tmp_path):
    """The join run above, killed at every protocol point in turn."""
    join_killed_in_turn(pg, spark, tmp_path, EVERY_POINT)


def join_killed_in_turn(pg, spark, tmp_path: Path, points: tuple[FaultPoint, ...]) -> None:
    inputs = fresh_inputs(pg, tmp_path)
    schedule = [FaultSpec(point, i + 1) for i, point in enumerate(points)]
    run_until_drained("join", inputs, tmp_path, schedule)
    assert len(inputs.files) == FILES + len(schedule)
    assert_audits_clean("join", inputs, tmp_path, spark)
    taken = batch_that_took_each_row(inputs, tmp_path / "ck")
    out = output_table(tmp_path / "out")
    pairs = zip(ids_of(out).tolist(), ids_of(out, "payment_id").tolist(), strict=True)
    across = sum(taken[order] != taken[payment] for order, payment in pairs)
    assert across > out.num_rows // 2, "the join state was hardly used: the test is too easy"


@pytest.mark.slow
def test_the_union_and_join_runs_together_kill_at_every_protocol_point():
    assert sorted(set(EVERY_POINT)) == sorted(FaultPoint)
