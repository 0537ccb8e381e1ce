"""Where Kafka publishing caps out: one transactional producer (what the ``exactly.kafka``
sink uses to publish an epoch) against several running side by side, and which binds first,
the producer or the broker.

Each variant publishes the same ``--records`` records (about 70 bytes of JSON each, ids
0..n-1) into a fresh topic of ``--partitions`` partitions, in one Kafka transaction per
producer, as the sink publishes an epoch: ``p1`` is one producer process; ``pN`` splits the
records into N equal shares, one producer process each, all started together (the spread an
epoch's publish would get from N transactional producers). Producers are separate
processes, so each has its own Python interpreter and librdkafka; every producer gets the
same client settings (:data:`CLIENT`, the same as bench/kafka_sink.py). Records are built
before the clock starts; the clock runs from the start signal to the last commit.

Reported per variant: records/s (median and range over the repetitions) and, per
repetition pair, the ratio pN / p1 of records/s. A ratio near 1 means the broker (on this
machine's cores) binds before a single producer does, and spreading the publish would not
raise the cap here. Each topic is read back ``read_committed`` and checked by id. The
rules (>= 1 M records, a warm-up, alternating order, >= 3 repetitions) are :mod:`harness`'s.

    .venv/bin/python bench/kafka_publish_cap.py [--records 1000000] [--producers 2]
        [--partitions 4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import harness as h
from kafka_sink import CLIENT

from exactly.testing.kafka_broker import broker_or_configured, consume_all, create_topic, quiet_conf


def _publish(bootstrap: str, topic: str, ids: range, start, done) -> None:
    """One transactional producer: wait for ``start``, publish ``ids`` in one transaction."""
    from confluent_kafka import Producer

    values = [json.dumps({"id": i, "key": f"k{i % 100:02d}", "amount": i % 997 / 10,
                          "ts": 0.0}).encode() for i in ids]
    keys = [f"k{i % 100:02d}".encode() for i in ids]
    producer = Producer({**quiet_conf(bootstrap), **CLIENT,
                         "transactional.id": f"cap-{uuid.uuid4().hex}",
                         "queue.buffering.max.messages": 500_000})
    producer.init_transactions(30)
    start.wait()
    producer.begin_transaction()
    produce = producer.produce
    for key, value in zip(keys, values, strict=True):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    producer.commit_transaction(120)
    done.put(time.time())


def run_variant(bootstrap: str, records: int, producers: int, partitions: int) -> dict:
    topic = f"cap-{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, topic, partitions=partitions)
    share = records // producers
    start, done = mp.Event(), mp.Queue()
    procs = [mp.Process(target=_publish, args=(bootstrap, topic,
                                               range(i * share, records if i == producers - 1
                                                     else (i + 1) * share), start, done))
             for i in range(producers)]
    for p in procs:
        p.start()
    time.sleep(5 + records / 400_000)  # every producer has built its records and its id
    began = time.time()
    start.set()
    ended = max(done.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(60)
    seconds = ended - began
    ids = [json.loads(v)["id"] for _, _, _, v in
           consume_all(bootstrap, topic, isolation_level="read_committed")]
    return {"seconds": seconds, "rate": records / seconds,
            "error": h.check_ids(ids, records, f"{producers} producer(s)")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--warmup", type=int, default=h.MIN_WARMUP_ROWS)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=h.MIN_REPEAT)
    args = parser.parse_args(argv)
    print(h.machine())
    note = h.sizes_note(args.records, args.warmup, args.repeat)
    if note:
        print(note)
    variants = ["p1", f"p{args.producers}"]
    with broker_or_configured() as bootstrap:
        for variant in variants:  # warm-up: broker, page cache, JIT of the broker
            run_variant(bootstrap, args.warmup, int(variant[1:]), args.partitions)
        runs: list[h.Run] = []
        for rep, variant in h.schedule(variants, args.repeat):
            result = run_variant(bootstrap, args.records, int(variant[1:]), args.partitions)
            runs.append(h.Run(rep, variant, {"rate": result["rate"]},
                              [result["error"]] if result["error"] else []))
            print(f"rep {rep} {variant}: {result['rate']:,.0f} records/s "
                  f"({result['seconds']:.2f} s) {h.load()}"
                  + (f" ERROR {result['error']}" if result["error"] else ""), flush=True)
    rows = []
    for variant in variants:
        rates = [r.values["rate"] / 1000 for r in runs if r.variant == variant]
        rows.append((variant, h.spread(rates, ".0f")))
    print(h.table(["variant", "k records/s"], rows))
    ratios = h.paired(runs, "rate", variants[1], "p1")
    print(f"{variants[1]} / p1 records/s per repetition: {h.spread(ratios)}")
    errors = [e for r in runs for e in r.errors]
    for error in errors:
        print("ERROR", error)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
