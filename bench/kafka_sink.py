"""What the ``exactly.kafka`` sink adds to a Spark job, beside Kafka's own produce time,
and its visibility latency against Spark's own Kafka sink.

Throughput
----------
``--records`` JSON records (``{"id", "key", "amount", "ts"}``, about 70 bytes) are produced
once into an input topic of 2 partitions on a single-node broker on 127.0.0.1 (started here
unless ``EXACTLY_KAFKA_BOOTSTRAP`` is set). In one SparkSession (``local[2]``), each variant
drains that input with Spark's Kafka source (``read_committed``,
``maxOffsetsPerTrigger = records / --epochs``, ``trigger(availableNow=True)``), passing
``key`` and ``value`` through, into a fresh output topic:

``exactly_once``    ``exactly.kafka`` exactly_once: tasks stage Arrow files, the commit
                    worker publishes each epoch in one transaction with its marker
``at_least_once``   ``exactly.kafka`` at_least_once: tasks produce directly
``spark_kafka``     Spark's built-in Kafka sink (Java producer in the tasks, at least once)
``python_noop``     the rows handed to Python workers as Arrow (``foreachBatch`` +
                    ``mapInArrow``, as exactly's sinks receive them), counted, not written:
                    the floor of every Python sink (:func:`harness.python_noop`)
``noop``            Spark's ``noop`` sink: reading and running the epochs, no sink work
``plain_producer``  no Spark: one confluent-kafka producer in this process producing the same
                    records (read from the input before the clock starts): Kafka's own time

Every producer gets the same client settings (:data:`CLIENT`: ``linger.ms``,
``batch.size``, ``acks``, idempotence, no compression); Spark's sink as ``kafka.*``
options. Reported: each sink's **added time** (seconds over ``noop`` in the same
repetition, per million records) and its ratio to ``plain_producer``'s time in that
repetition (median and range; goal for ``exactly_once``: <= 1.0), and ``exactly_once``'s
own work: its time over ``python_noop``, to ``plain_producer``'s. Every output topic is
read back ``read_committed`` and checked by id (each input id exactly once); ``python_noop``
by the number of records it received.

Latency
-------
The ``exactly_once`` job and the same job into Spark's Kafka sink run with a processing-time
trigger of ``--interval-ms`` (1 s) for ``--seconds`` (>= 100 epochs), while a producer writes
``--rate`` records/s into an input topic with ``message.timestamp.type=LogAppendTime``; the
job passes each record's broker timestamp through, and a ``read_committed`` consumer of the
output records when each record became visible. Reported: p50 / p99 of visible - appended
(one machine, one clock), per repetition, and the ratio exactly_once / spark_kafka per
repetition pair (goal: p99 <= 1.5). Measurement starts once two epochs with (warm-up) data
have committed. Each latency run is one run of bench/visibility.py's Kafka target (its input
producer, reader and checks by id). The rules (warm-up, alternating order, repetitions) are
:mod:`harness`'s.

Run from the repository root (after ``scripts/setup.sh``)::

    .venv/bin/python bench/kafka_sink.py [--records 1000000] [--epochs 4] [--repeat 3]
        [--interval-ms 1000] [--rate 500] [--seconds 120] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import harness as h

from exactly import options as opt
from exactly.testing.kafka_broker import broker_or_configured, consume_all, create_topic, quiet_conf

#: the client settings every producer of the comparison gets
CLIENT = h.KAFKA_CLIENT
VARIANTS = ("exactly_once", "at_least_once", "spark_kafka", "python_noop", "noop",
            "plain_producer")


def produce_input(bootstrap: str, topic: str, records: int) -> None:
    from confluent_kafka import Producer

    p = Producer({**quiet_conf(bootstrap), **CLIENT})
    for i in range(records):
        value = json.dumps({"id": i, "key": f"k{i % 100:02d}", "amount": i % 997 / 10,
                            "ts": 0.0})
        while True:
            try:
                p.produce(topic, value.encode(), f"k{i % 100:02d}".encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def plain_producer(bootstrap: str, rows: list, out: str) -> float:
    """One producer writing the input's records again (read before the clock starts)."""
    from confluent_kafka import Producer

    p = Producer({**quiet_conf(bootstrap), **CLIENT,
                  "queue.buffering.max.messages": 500_000})
    started = time.perf_counter()
    produce = p.produce
    for _, _, key, value in rows:
        try:
            produce(out, value, key)
        except BufferError:
            while True:
                p.poll(0.05)
                try:
                    produce(out, value, key)
                    break
                except BufferError:
                    continue
    remaining = p.flush(120)
    if remaining:
        raise RuntimeError(f"plain producer: {remaining} records not delivered")
    return time.perf_counter() - started


def run_sink(spark: Any, kind: str, bootstrap: str, source_topic: str, records: int,
             epochs: int, workdir: Path, out: str,
             received: list[tuple[int, int]] | None = None) -> float:
    from exactly.config import CheckpointConfig
    from exactly.connectors.kafka.source import read_kafka
    from exactly.ops.query import start_query

    checkpoint = workdir / f"ck-{out}"
    df = read_kafka(spark, bootstrap, topics=source_topic,
                    max_offsets_per_trigger=max(1, records // epochs)).select("key", "value")
    client = {f"kafka.{k}": v for k, v in CLIENT.items()}
    started = time.perf_counter()
    if kind in ("exactly_once", "at_least_once"):
        query = start_query(df, sink_format="exactly.kafka", available_now=True,
                            checkpoint=CheckpointConfig(mode=kind, storage=str(checkpoint)),
                            options={opt.KAFKA_BOOTSTRAP: bootstrap, opt.TOPIC: out,
                                     opt.TRANSACTIONAL_ID_PREFIX: f"bench-{out}",
                                     opt.CHECKPOINT_INTERVAL_MS: "1000", **client}).query
    elif kind == "python_noop":
        query = h.python_noop(df, str(checkpoint), received if received is not None else [])
    else:
        writer = df.writeStream.option("checkpointLocation", str(checkpoint))
        if kind == "spark_kafka":
            writer = (writer.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                      .option("topic", out).options(**client))
        else:
            writer = writer.format("noop")
        query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{kind}: {query.exception()}")
    return time.perf_counter() - started


def check_topic(bootstrap: str, topic: str, records: int, what: str) -> str | None:
    """Each input id exactly once in ``topic`` (read_committed)."""
    ids = [json.loads(v)["id"] for _, _, _, v in consume_all(bootstrap, topic)]
    return h.check_ids(ids, records, what)


def latency(spark: Any, bootstrap: str, workdir: Path, interval_ms: int, rate: int,
            seconds: float, kind: str) -> dict[str, Any]:
    """Input append -> read_committed visibility through sink ``kind`` (``exactly_once`` or
    ``spark_kafka``): per-record delays and the number of epochs measured. One run of
    bench/visibility.py's Kafka target (its input, reader and checks by id)."""
    import visibility as vis

    ctx = vis.Context(spark, bootstrap, None, workdir, interval_ms, poll_s=0.01)
    r = vis.run(vis.KafkaTarget(ctx), kind, rate, seconds)
    return {"records": r["sent"], "delays_ms": r["delays_ms"], "epochs": r["epochs"],
            "error": r["error"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=h.MIN_ROWS)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--warmup-records", type=int, default=h.MIN_WARMUP_ROWS)
    ap.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    ap.add_argument("--interval-ms", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=500, help="records/s for the latency run")
    ap.add_argument("--seconds", type=float, default=120.0, help="length of a latency run")
    ap.add_argument("--no-latency", dest="latency", action="store_false")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--partitions", type=int, default=2,
                    help="partitions of the input topic (= tasks per epoch; local[2] has 2 "
                         "cores)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of the throughput variants (the added-time "
                         "columns need noop and plain_producer)")
    args = ap.parse_args(argv)
    variants = tuple(v for v in args.variants.split(",") if v)
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {VARIANTS}")

    from exactly.connectors.kafka.source import spark_kafka_conf
    from exactly.logs import configure
    from exactly.spark.session import spark_session

    configure()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="exactly-bench-kafka-"))
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    note = h.sizes_note(args.records, args.warmup_records, args.repeat)
    print(h.machine())
    print(f"{args.records:,} records per run in {args.epochs} epochs, local[2]; "
          f"{args.partitions} input partitions; "
          f"{args.repeat} repetitions in alternating order after a "
          f"{args.warmup_records:,}-record warm-up of each variant; client settings {CLIENT}. "
          f"{note}", flush=True)
    runs: list[h.Run] = []
    lat_runs: list[h.Run] = []
    delays: dict[str, list[float]] = {}
    with broker_or_configured(workdir / "broker") as bootstrap:
        source = f"bench-in-{uuid.uuid4().hex[:6]}"
        warm = f"bench-warm-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, source, args.partitions)
        create_topic(bootstrap, warm, args.partitions)
        produce_input(bootstrap, source, args.records)
        produce_input(bootstrap, warm, args.warmup_records)
        input_rows = consume_all(bootstrap, source, isolation_level="read_uncommitted")
        warm_rows = consume_all(bootstrap, warm, isolation_level="read_uncommitted")
        spark = spark_session(app_name="exactly-bench-kafka", conf=spark_kafka_conf())
        try:
            for kind in variants:  # warm-up: JVM, Python workers, connector classes
                out = f"warm-{kind}-{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, out, 2)
                if kind == "plain_producer":
                    plain_producer(bootstrap, warm_rows, out)
                else:
                    run_sink(spark, kind, bootstrap, warm, args.warmup_records, 2, workdir,
                             out)
            for rep, kind in h.schedule(variants, args.repeat):
                out = f"bench-{kind}-{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, out, 2)
                if kind == "plain_producer":
                    seconds = plain_producer(bootstrap, input_rows, out)
                else:
                    received: list[tuple[int, int]] = []
                    seconds = run_sink(spark, kind, bootstrap, source, args.records,
                                       args.epochs, workdir, out, received)
                if kind == "noop":
                    problem = None
                elif kind == "python_noop":  # the ids are inside the values: count only
                    got = sum(n for n, _ in received)
                    problem = (None if got == args.records else
                               f"python_noop received {got} records, expected {args.records}")
                else:
                    problem = check_topic(bootstrap, out, args.records, kind)
                runs.append(h.Run(rep, kind, {"seconds": seconds}, [problem] if problem else []))
                print(f"rep {rep} {kind:15} {seconds:7.2f} s  {h.load()}"
                      + (f"  ERRORS {problem}" if problem else ""), flush=True)
            if args.latency:
                for rep, kind in h.schedule(("exactly_once", "spark_kafka"), args.repeat):
                    r = latency(spark, bootstrap, workdir, args.interval_ms, args.rate,
                                args.seconds, kind)
                    delays.setdefault(kind, []).extend(r["delays_ms"])
                    values = {"p50": h.p50(r["delays_ms"]) or float("nan"),
                              "p99": h.p99(r["delays_ms"]) or float("nan"),
                              "epochs": r["epochs"]}
                    lat_runs.append(h.Run(rep, kind, values, [r["error"]] if r["error"] else []))
                    print(f"rep {rep} latency {kind:13} p50 {values['p50']:.0f} ms  p99 "
                          f"{values['p99']:.0f} ms over {len(r['delays_ms'])} records, "
                          f"{r['epochs']} epochs  {h.load()}"
                          + (f"  ERRORS {r['error']}" if r["error"] else ""), flush=True)
        finally:
            spark.stop()

    per_m = 1_000_000 / args.records
    plain = h.per_rep(runs, "seconds", "plain_producer")
    rows = [["plain_producer (Kafka's own time)", h.spread([s * per_m for s in plain]),
             "1.00", h.spread([args.records / s / 1000 for s in plain], ".0f")]]
    headlines = []
    have = {"noop", "plain_producer"} <= set(variants)
    for kind in [k for k in ("exactly_once", "at_least_once", "spark_kafka", "python_noop")
                 if k in variants and have]:
        added, ratio = h.over(runs, kind, "noop", "plain_producer")
        total = h.per_rep(runs, "seconds", kind)
        rows.append([kind, h.spread([a * per_m for a in added]), h.spread(ratio),
                     h.spread([args.records / t / 1000 for t in total], ".0f")])
        if kind == "exactly_once":
            headlines.append(h.Headline("kafka_sink", "exactly_once added time / plain producer",
                                        h.spread(ratio), "<= 1.0", h.at_most(ratio, 1.0)))
    if have and {"exactly_once", "python_noop"} <= set(variants):
        own_row, own_headline = h.own_work(runs, "exactly_once", "plain_producer",
                                           "plain producer", "kafka_sink", per_m)
        rows.append(own_row)
        headlines.append(own_headline)
    if "noop" in variants:
        rows.append(h.noop_row(runs, args.records, per_m))
    print()
    print(h.table(["variant", "added s per 1M records", "added / plain producer",
                   "k records/s"], rows))
    # throughput of exactly_once over another sink's in the same repetition (> 1: faster)
    for other, goal in (("spark_kafka", 1.0), ("at_least_once", 0.9)):
        ratio = h.paired(runs, "seconds", other, "exactly_once")
        print(f"throughput exactly_once / {other} per repetition pair: {h.spread(ratio)} "
              f"(goal >= {goal})")
        headlines.append(h.Headline("kafka_sink", f"throughput exactly_once / {other}",
                                    h.spread(ratio), f">= {goal}",
                                    float(np.median(ratio)) >= goal if ratio else None))
    if lat_runs:
        print(f"\nvisibility latency (produce -> read_committed), trigger {args.interval_ms} "
              f"ms, {args.rate} records/s for {args.seconds:.0f} s per run:")
        lrows = []
        for kind in ("exactly_once", "spark_kafka"):
            lrows.append([kind, h.spread(h.per_rep(lat_runs, "p50", kind), ".0f"),
                          h.spread(h.per_rep(lat_runs, "p99", kind), ".0f"),
                          h.spread(h.per_rep(lat_runs, "epochs", kind), ".0f")])
        ratio = h.paired(lat_runs, "p99", "exactly_once", "spark_kafka")
        print(h.table(["sink", "p50 ms", "p99 ms", "epochs"], lrows))
        print(f"p99 exactly_once / spark_kafka per repetition pair: {h.spread(ratio)}")
        headlines.append(h.Headline("kafka_sink", "latency p99 exactly_once / spark_kafka",
                                    h.spread(ratio), "<= 1.5",
                                    float(np.median(ratio)) <= 1.5 if ratio else None))
    print(f"\n{h.machine()}")
    h.write_headlines(workdir, headlines, {"runs": [vars(r) for r in runs + lat_runs],
                                           "note": note})
    errors = [e for r in runs + lat_runs for e in r.errors]
    for problem in errors:
        print(f"CHECK FAILED: {problem}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
