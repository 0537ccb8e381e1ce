"""The nemesis: faults subtler than kill -9, for tests and soaks (docs/reliability.md).

``proxy``     a TCP proxy between the job and a server that delays, drops, cuts, partitions,
              and loses or delays the answer to one chosen request (the ambiguous commit)
``processes`` pause and resume processes (SIGSTOP/SIGCONT): a driver, an executor, a server
``disk``      a small disk that fills (tmpfs)
``clock``     a clock that jumps, for components that take an injected clock
``schedule``  faults at random times from a seed, run one after another
``faultlog``  every fault injected, one JSON line each: attach it to a failure, replay it
``actions``   what each kind of fault does to a running job (net.*, pause.*, disk.full, kill)
``table``     the soak's summary table (``scripts/soak --nemesis``)
``checker``   names the anomalies readers saw (lost write, duplicate, aborted read, ...)
``observers`` the readers that feed it: file sink, PostgreSQL, Kafka, Delta, Iceberg
"""
