"""The one retry policy of exactly, for idempotent calls to external systems.

Every retry of a transient failure in the package goes through :func:`retry_call`
(built on ``tenacity``), so the policy is stated once, here:

* **What is retried** - only errors the caller's ``transient`` predicate accepts, and only
  around steps that are safe to run again (the caller's promise: idempotent, or starting
  over from a state the external system settles). Transient means the system may answer
  differently in a moment: a lost connection or a server restart (PostgreSQL,
  :func:`exactly.connectors.sql.is_transient`), a Kafka error the client flags retriable or
  a group coordinator moving (:mod:`exactly.connectors.kafka.publisher`). Any other error is
  raised at once and unchanged - fencing (:class:`~exactly.errors.FencedError`), a fatal
  producer, a bad setting, lost data. Anything that is not an ``Exception``
  (``SimulatedCrash``, ``KeyboardInterrupt``) is never retried.
* **Backoff** - exponential with jitter: ``initial`` seconds (default 0.1) before the second
  attempt, doubling up to ``maximum`` (default 2 s), plus a random 0..``initial`` seconds so
  that clients failing together do not retry in step.
* **Deadline** - a call gives up when the next wait would end more than ``seconds`` after
  its first attempt started, or after ``attempts`` attempts, whichever comes first (give at
  least one). It then raises the last error as it was raised; callers turn it into an error
  naming the cause and the setting to raise (``retrySeconds``,
  ``exactly.kafka.publishTimeoutMs``).
* **Logging** - each retry is one structured event (:func:`exactly.logs.log_event`)
  ``{"event": "retry", "call": what, "attempt": n, "error": ..., "wait_s": ...,
  "elapsed_s": ..., **context}`` at WARNING, or at the ``level`` the caller gives (INFO for
  retries that are routine, such as a Kafka coordinator moving). Giving up is not logged
  here: the raised error says it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    stop_never,
    wait_exponential,
    wait_random,
)
from tenacity.stop import stop_base

from exactly.logs import log_event

T = TypeVar("T")

logger = logging.getLogger("exactly.retry")

DEFAULT_INITIAL_S = 0.1
DEFAULT_MAXIMUM_S = 2.0


def retry_call(fn: Callable[[], T], *, what: str,
               transient: Callable[[BaseException], bool],
               seconds: float | None = None, attempts: int | None = None,
               initial: float = DEFAULT_INITIAL_S, maximum: float = DEFAULT_MAXIMUM_S,
               level: int = logging.WARNING,
               before_retry: Callable[[], object] | None = None,
               describe: Callable[[BaseException], str] | None = None,
               log: logging.Logger | None = None, **context: Any) -> T:
    """Call ``fn()`` under the package's retry policy (module docstring) and return its value.

    ``what`` names the call in the retry events; ``transient`` decides which errors are
    retried; ``seconds`` / ``attempts`` bound the retries; ``before_retry`` runs after a
    failed attempt that will be retried, before the wait (e.g. to drop a client so the next
    attempt starts with a fresh one); ``describe`` renders the error for the event (default
    ``Type: message``; give one that hides secrets the message may carry); ``context`` goes
    into every retry event.
    """
    if seconds is None and attempts is None:
        raise ValueError("retry_call needs seconds=... or attempts=... (an end to retrying)")
    stop: stop_base = stop_never
    if seconds is not None:
        stop = stop | stop_before_delay(seconds)
    if attempts is not None:
        stop = stop | stop_after_attempt(attempts)

    def retriable(exc: BaseException) -> bool:
        return isinstance(exc, Exception) and transient(exc)

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        error = (describe(exc) if describe is not None and exc is not None
                 else f"{type(exc).__name__}: {exc}")
        log_event(log or logger, "retry", level, call=what, attempt=state.attempt_number,
                  error=error,
                  wait_s=round(state.upcoming_sleep, 3),
                  elapsed_s=round(state.seconds_since_start or 0.0, 3), **context)
        if before_retry is not None:
            before_retry()

    retrying = Retrying(stop=stop,
                        wait=wait_exponential(multiplier=initial, max=maximum)
                        + wait_random(0, initial),
                        retry=retry_if_exception(retriable), before_sleep=before_sleep,
                        reraise=True)
    return retrying(fn)


def is_disk_full(exc: BaseException) -> bool:
    """The disk (or the user's quota) is full: an error that goes away once space is freed."""
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
