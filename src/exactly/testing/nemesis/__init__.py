"""The nemesis: faults subtler than kill -9, for tests and soaks (docs/reliability.md).

``proxy``     a TCP proxy between the job and a server that delays, drops, cuts, partitions,
              and loses or delays the answer to one chosen request (the ambiguous commit)
``processes`` pause and resume processes (SIGSTOP/SIGCONT): a driver, an executor, a server
``disk``      a small disk that fills (tmpfs)
``clock``     a clock that jumps, for components that take an injected clock
``schedule``  faults at random times from a seed, written to a log that replays them
``checker``   names the anomalies readers saw (lost write, duplicate, aborted read, ...)
"""
