"""What the leader lease of ``exactly run --ha`` costs per renewal, local disk against S3.

The HA defaults (lease 15 s, a renewal every 3 s, the leader's renew deadline 10 s, a standby
look every 3 s) rest on two numbers measured here: how long one renewal takes (a read and a
compare-and-swap of ``exactly-job/ha/leader.json``, :meth:`LeaderLease.renew`) and one
standby look (:meth:`LeaderLease.try_acquire` against a held lease: a read, a HEAD). The
renew deadline must hold several renewals even at their p99, and the interval sets the
store's request rate (printed per hour, per job).

Variants: ``local`` (a directory on the local disk: ``flock`` + rename) and ``s3``
(S3Proxy on 127.0.0.1, started here: conditional PUTs), in alternating order, ``--reps``
repetitions of ``--renewals`` renewals and standby looks each. A renewal's outcome is
checked (the term written is the one renewed: ``generation`` and ``renewed_at`` read back).

    .venv/bin/python bench/leader_lease.py [--renewals 300] [--reps 3] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h

from exactly.checkpoint.leader import (
    DEFAULT_LEASE_S,
    DEFAULT_RENEW_DEADLINE_S,
    DEFAULT_RENEW_S,
    DEFAULT_STANDBY_POLL_S,
    LeaderLease,
)
from exactly.checkpoint.location import open_store
from exactly.procs import ProcessId, current_process


def measure(location: str, renewals: int) -> dict[str, list[float]]:
    """Milliseconds of each renewal and each standby look against one store."""
    store = open_store(location)
    lease = LeaderLease(store, DEFAULT_LEASE_S)
    took = lease.try_acquire("bench-leader", current_process(), "bench-run", "bench.py")
    assert took is not None, f"{location}: the lease was not free"
    term = took.term
    other = ProcessId("bench-standby", 1, 1)
    renew_ms: list[float] = []
    look_ms: list[float] = []
    for _ in range(renewals):
        started = time.perf_counter()
        renewed = lease.renew(term)
        renew_ms.append((time.perf_counter() - started) * 1000)
        assert renewed is not None and renewed.generation == term.generation
        assert renewed.renewed_at >= term.renewed_at
        term = renewed
        started = time.perf_counter()
        assert lease.try_acquire("bench-standby", other, "standby-run") is None
        look_ms.append((time.perf_counter() - started) * 1000)
    current = lease.current()
    assert current is not None and current.renewed_at == term.renewed_at, "renewal lost"
    lease.end(term, "stopped")
    return {"renew": renew_ms, "look": look_ms}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--renewals", type=int, default=300)
    parser.add_argument("--reps", type=int, default=h.MIN_REPEAT)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-leader-"))
    work.mkdir(parents=True, exist_ok=True)
    from exactly.testing.s3_server import S3Server

    print(h.machine())
    server = S3Server(work / "s3").start()
    try:
        os.environ.update(server.env())
        server.create_bucket("bench")
        variants = ["local", "s3"]
        where = {"local": lambda rep: str(work / f"local-{rep}" / "exactly-job"),
                 "s3": lambda rep: f"s3a://bench/s3-{rep}/exactly-job"}
        measure(where["local"]("warm"), 20)  # warm-up: boto3's client, the JIT of S3Proxy
        measure(where["s3"]("warm"), 20)
        results: dict[str, dict[str, list[float]]] = {v: {"renew": [], "look": []}
                                                      for v in variants}
        per_rep: list[dict[str, Any]] = []
        rows: dict[int, dict[str, Any]] = {}
        for rep, variant in h.schedule(variants, args.reps):
            got = measure(where[variant](rep), args.renewals)
            for key, values in got.items():
                results[variant][key].extend(values)
            row = rows.setdefault(rep, {"rep": rep, "order": []})
            row[variant] = statistics.median(got["renew"])
            row["order"].append(variant)
            if len(row["order"]) == len(variants):
                per_rep.append(row)
                print(f"rep {rep} ({' then '.join(row['order'])}): renewal median "
                      f"local {row['local']:.2f} ms, s3 {row['s3']:.2f} ms; {h.load()}",
                      flush=True)
    finally:
        server.stop()
    print()
    print(f"{'store':6} {'what':6} {'n':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for variant in variants:
        for key in ("renew", "look"):
            values = results[variant][key]
            print(f"{variant:6} {key:6} {len(values):5d} {statistics.median(values):8.2f} "
                  f"{h.p99(values) or float('nan'):8.2f} {max(values):8.2f}")
    ratios = [row["s3"] / row["local"] for row in per_rep]
    print(f"\nrenewal s3/local per repetition: median {statistics.median(ratios):.1f}x, "
          f"range {min(ratios):.1f}-{max(ratios):.1f}x")
    s3_p99 = h.p99(results["s3"]["renew"]) or max(results["s3"]["renew"])
    print(f"defaults: lease {DEFAULT_LEASE_S:g}s, renewal every {DEFAULT_RENEW_S:g}s, renew "
          f"deadline {DEFAULT_RENEW_DEADLINE_S:g}s, standby look every "
          f"{DEFAULT_STANDBY_POLL_S:g}s")
    print(f"the renew deadline holds {DEFAULT_RENEW_DEADLINE_S / DEFAULT_RENEW_S:.1f} renewal "
          f"intervals, {DEFAULT_RENEW_DEADLINE_S * 1000 / s3_p99:.0f}x an S3 renewal's p99")
    # a renewal is a GET + a conditional PUT (+ the member record's PUT); a look a GET + HEAD
    print(f"store requests per hour and job: leader {3 * 3600 / DEFAULT_RENEW_S:.0f} "
          f"(a GET, a conditional PUT, a member PUT per renewal), each standby "
          f"{2 * 3600 / DEFAULT_STANDBY_POLL_S + 3600 / DEFAULT_RENEW_S:.0f}")
    print(h.load())
    return 0


if __name__ == "__main__":
    sys.exit(main())
