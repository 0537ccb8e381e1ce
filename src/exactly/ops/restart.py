"""Restart strategies with Flink's names, options and defaults.

A strategy decides, from the failures of the current ``exactly run`` so far, whether the job
restarts and after how long. It is a pure function of the failure times (plus a random
source for jitter), so the driver process (query restarts) and the ``exactly run`` launcher
(process restarts) reach the same decision from the same failure history.

=====================  ======================================================================
``none``               never restart: the first failure fails the job
``fixed-delay``        ``attempts`` restarts in total (default 1), ``delay`` apart (1s)
``failure-rate``       restart after ``delay`` (1s) while at most ``max-failures-per-interval``
                       (1) failures fall into the last ``failure-rate-interval`` (1min)
``exponential-delay``  restart forever (or ``attempts-before-reset-backoff`` times); the wait
                       starts at ``initial-backoff`` (1s), grows by ``backoff-multiplier``
                       (1.5) up to ``max-backoff`` (1min), varies by ``jitter-factor`` (0.1)
                       and starts over after ``reset-backoff-threshold`` (1h) without failure
all but ``none``       ``max-repeated-cause`` (unset): give up when that many failures in a row
                       have the same root cause (numbers masked), however the strategy counts
=====================  ======================================================================

``exponential-delay`` is the default, as in Flink when checkpointing is on. Flink never gives
up on a failure that repeats identically (a read-only output, a bug in a UDF): by default
neither does exactly, but the restart history counts the repeats of each failure's cause
(:meth:`exactly.checkpoint.restarts.RestartHistory.repeats`) and ``max-repeated-cause`` (exactly's
own option, not Flink's) fails the job at the Nth failure in a row of one cause
(:func:`gives_up_on_repeats`).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from exactly.config import parse_duration
from exactly.errors import ConfigError


class RestartStrategy(Protocol):
    """Decides whether and when a failed job restarts."""

    @property
    def name(self) -> str:
        """Flink's name of the strategy (``fixed-delay``, ...)."""
        ...

    def next_delay(self, failures: Sequence[float], rng: random.Random | None = None,
                   ) -> float | None:
        """Seconds to wait before restarting after the last of ``failures`` (the times of
        every failure of this run, oldest first, the one just happened last); ``None`` when
        the strategy gives up and the job fails."""
        ...

    def describe(self) -> str:
        """One line with the strategy's name and settings, for logs and errors."""
        ...


@dataclass(frozen=True)
class NoRestart:
    """``none``: the first failure fails the job."""

    name: str = field(default="none", init=False)

    def next_delay(self, failures: Sequence[float], rng: random.Random | None = None,
                   ) -> float | None:
        return None

    def describe(self) -> str:
        return "none"


@dataclass(frozen=True)
class FixedDelay:
    """``fixed-delay``: at most ``attempts`` restarts in the run, ``delay`` seconds apart."""

    attempts: int = 1
    delay: float = 1.0
    max_repeated_cause: int | None = None
    name: str = field(default="fixed-delay", init=False)

    def __post_init__(self) -> None:
        _at_least("fixed-delay.attempts", self.attempts, 0)
        _at_least("fixed-delay.delay", self.delay, 0)
        _check_max_repeated_cause(self.name, self.max_repeated_cause)

    def next_delay(self, failures: Sequence[float], rng: random.Random | None = None,
                   ) -> float | None:
        return self.delay if len(failures) <= self.attempts else None

    def describe(self) -> str:
        return (f"fixed-delay (attempts={self.attempts}, delay={self.delay:g}s"
                f"{_repeats_text(self.max_repeated_cause)})")


@dataclass(frozen=True)
class FailureRate:
    """``failure-rate``: give up when more than ``max_failures_per_interval`` failures fall
    into the last ``failure_rate_interval`` seconds; otherwise restart after ``delay``."""

    max_failures_per_interval: int = 1
    failure_rate_interval: float = 60.0
    delay: float = 1.0
    max_repeated_cause: int | None = None
    name: str = field(default="failure-rate", init=False)

    def __post_init__(self) -> None:
        _at_least("failure-rate.max-failures-per-interval", self.max_failures_per_interval, 1)
        _at_least("failure-rate.failure-rate-interval", self.failure_rate_interval, 0.001)
        _at_least("failure-rate.delay", self.delay, 0)
        _check_max_repeated_cause(self.name, self.max_repeated_cause)

    def next_delay(self, failures: Sequence[float], rng: random.Random | None = None,
                   ) -> float | None:
        if not failures:
            return self.delay
        now = failures[-1]
        recent = sum(1 for t in failures if now - t <= self.failure_rate_interval)
        return self.delay if recent <= self.max_failures_per_interval else None

    def describe(self) -> str:
        return (f"failure-rate (max-failures-per-interval={self.max_failures_per_interval}, "
                f"failure-rate-interval={self.failure_rate_interval:g}s, "
                f"delay={self.delay:g}s{_repeats_text(self.max_repeated_cause)})")


@dataclass(frozen=True)
class ExponentialDelay:
    """``exponential-delay``: waits grow from ``initial_backoff`` by ``backoff_multiplier``
    up to ``max_backoff``, each varied by +-``jitter_factor``; a failure more than
    ``reset_backoff_threshold`` seconds after the previous one starts over from
    ``initial_backoff``. With ``attempts_before_reset_backoff`` the job fails after that
    many restarts without a reset."""

    initial_backoff: float = 1.0
    max_backoff: float = 60.0
    backoff_multiplier: float = 1.5
    reset_backoff_threshold: float = 3600.0
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int | None = None
    max_repeated_cause: int | None = None
    name: str = field(default="exponential-delay", init=False)

    def __post_init__(self) -> None:
        _at_least("exponential-delay.initial-backoff", self.initial_backoff, 0.001)
        _at_least("exponential-delay.max-backoff", self.max_backoff, self.initial_backoff,
                  "initial-backoff")
        _at_least("exponential-delay.backoff-multiplier", self.backoff_multiplier, 1.0)
        _at_least("exponential-delay.reset-backoff-threshold", self.reset_backoff_threshold,
                  0.001)
        if not 0 <= self.jitter_factor <= 1:
            raise ConfigError("restart strategy exponential-delay.jitter-factor must be "
                              f"between 0 and 1, got {self.jitter_factor!r}")
        if self.attempts_before_reset_backoff is not None:
            _at_least("exponential-delay.attempts-before-reset-backoff",
                      self.attempts_before_reset_backoff, 1)
        _check_max_repeated_cause(self.name, self.max_repeated_cause)

    def backoff(self, failures: Sequence[float]) -> float | None:
        """The wait without jitter after the last failure; None once attempts run out."""
        if not failures:
            return self.initial_backoff
        streak = 1  # failures since the last reset, this one included
        for previous, current in itertools.pairwise(failures):
            streak = 1 if current - previous > self.reset_backoff_threshold else streak + 1
        if (self.attempts_before_reset_backoff is not None
                and streak > self.attempts_before_reset_backoff):
            return None
        return min(self.max_backoff,
                   self.initial_backoff * self.backoff_multiplier ** (streak - 1))

    def next_delay(self, failures: Sequence[float], rng: random.Random | None = None,
                   ) -> float | None:
        wait = self.backoff(failures)
        if wait is None or self.jitter_factor == 0:
            return wait
        spread = wait * self.jitter_factor
        return max(0.0, wait + (rng or random.Random()).uniform(-spread, spread))

    def describe(self) -> str:
        attempts = (f", attempts-before-reset-backoff={self.attempts_before_reset_backoff}"
                    if self.attempts_before_reset_backoff is not None else "")
        return (f"exponential-delay (initial-backoff={self.initial_backoff:g}s, "
                f"max-backoff={self.max_backoff:g}s, "
                f"backoff-multiplier={self.backoff_multiplier:g}, "
                f"reset-backoff-threshold={self.reset_backoff_threshold:g}s, "
                f"jitter-factor={self.jitter_factor:g}{attempts}"
                f"{_repeats_text(self.max_repeated_cause)})")


def gives_up_on_repeats(strategy: RestartStrategy, repeats: int) -> bool:
    """Whether ``strategy`` gives up on a failure whose cause is the ``repeats``-th in a row
    (:meth:`exactly.checkpoint.restarts.RestartHistory.repeats`): true from ``max-repeated-cause``
    repeats on; never for a strategy without that option set."""
    limit = getattr(strategy, "max_repeated_cause", None)
    return limit is not None and repeats >= limit


def restart_delay(strategy: RestartStrategy, failures: Sequence[float], repeats: int,
                  rng: random.Random | None = None) -> tuple[float | None, str | None]:
    """The wait before restarting after the last of ``failures`` (:meth:`next_delay`), or
    None when the strategy gives up, with the reason when it gives up because the cause is
    the ``repeats``-th in a row (:func:`gives_up_on_repeats`): ``(delay, reason)``."""
    delay = strategy.next_delay(failures, rng)
    if delay is not None and gives_up_on_repeats(strategy, repeats):
        return None, f"the same cause repeated {repeats} times in a row"
    return delay, None


def _check_max_repeated_cause(strategy: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ConfigError(f"restart strategy {strategy}.max-repeated-cause must be a whole "
                          f"number of at least 1 (the failures in a row of one cause that "
                          f"fail the job), got {value!r}; leave it unset to restart whatever "
                          "the cause")


def _repeats_text(limit: int | None) -> str:
    return f", max-repeated-cause={limit}" if limit is not None else ""


def _at_least(option: str, value: float, minimum: float, what: str | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        bound = what or f"{minimum:g}"
        raise ConfigError(f"restart strategy {option} must be at least {bound}, got {value!r}")


#: the strategy names, Flink's aliases included
STRATEGY_NAMES = {"none": "none", "off": "none", "disable": "none",
                  "fixed-delay": "fixed-delay", "fixeddelay": "fixed-delay",
                  "failure-rate": "failure-rate", "failurerate": "failure-rate",
                  "exponential-delay": "exponential-delay",
                  "exponentialdelay": "exponential-delay"}

#: exactly's own option of every strategy that restarts (see :func:`gives_up_on_repeats`)
MAX_REPEATED_CAUSE = {"max-repeated-cause": ("max_repeated_cause", "int")}

#: per strategy: option name (Flink's key after ``restart-strategy.<name>.``) -> (field, kind)
STRATEGY_OPTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "none": {},
    "fixed-delay": {"attempts": ("attempts", "int"), "delay": ("delay", "duration"),
                    **MAX_REPEATED_CAUSE},
    "failure-rate": {
        "max-failures-per-interval": ("max_failures_per_interval", "int"),
        "failure-rate-interval": ("failure_rate_interval", "duration"),
        "delay": ("delay", "duration"), **MAX_REPEATED_CAUSE},
    "exponential-delay": {
        "initial-backoff": ("initial_backoff", "duration"),
        "max-backoff": ("max_backoff", "duration"),
        "backoff-multiplier": ("backoff_multiplier", "float"),
        "reset-backoff-threshold": ("reset_backoff_threshold", "duration"),
        "jitter-factor": ("jitter_factor", "float"),
        "attempts-before-reset-backoff": ("attempts_before_reset_backoff", "int"),
        **MAX_REPEATED_CAUSE},
}

_CLASSES: dict[str, type] = {"none": NoRestart, "fixed-delay": FixedDelay,
                             "failure-rate": FailureRate,
                             "exponential-delay": ExponentialDelay}


def restart_strategy(name: str = "exponential-delay",
                     options: Mapping[str, str | float | int] | None = None) -> RestartStrategy:
    """The strategy ``name`` with Flink-named ``options`` (``{"attempts": 3, "delay":
    "10s"}``; the ``restart-strategy.<name>.`` prefix may be included).

    Raises ConfigError naming the option and the fix for an unknown strategy or option and
    for an unparsable, negative or out-of-range value.
    """
    import difflib

    canonical = STRATEGY_NAMES.get(str(name).strip().lower())
    if canonical is None:
        guess = difflib.get_close_matches(str(name).lower(), list(_CLASSES), n=1)
        hint = f" (did you mean {guess[0]}?)" if guess else ""
        raise ConfigError(f"restart strategy {name!r} is unknown{hint}; choose one of "
                          f"{' | '.join(_CLASSES)}")
    known = STRATEGY_OPTIONS[canonical]
    kwargs: dict[str, object] = {}
    for raw_key, value in (options or {}).items():
        key = str(raw_key).strip().lower().removeprefix("restart-strategy.")
        key = key.removeprefix(f"{canonical}.")
        if key not in known:
            guess = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {guess[0]}?)" if guess else ""
            allowed = ", ".join(known) or "none"
            raise ConfigError(f"restart strategy {canonical} has no option {raw_key!r}{hint}; "
                              f"its options: {allowed}")
        field_name, kind = known[key]
        kwargs[field_name] = _convert(f"{canonical}.{key}", value, kind)
    return _CLASSES[canonical](**kwargs)


def _convert(option: str, value: str | float | int, kind: str) -> float | int:
    if kind == "duration":
        return parse_duration(value, name=f"restart strategy {option}")
    try:
        number = int(value) if kind == "int" else float(value)
    except (TypeError, ValueError):
        what = "a whole number" if kind == "int" else "a number"
        raise ConfigError(f"restart strategy {option}: expected {what}, got {value!r}"
                          ) from None
    return number


def parse_option_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["attempts=3", "delay=10s"]`` (the CLI's ``--restart-option``) as a dict."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--restart-option {pair!r}: write it as KEY=VALUE, e.g. "
                              "attempts=3 or delay=10s")
        options[key.strip()] = value.strip()
    return options


def strategy_to_json(strategy: RestartStrategy) -> dict[str, object]:
    """``{"name": ..., "options": {...}}``: enough to rebuild the strategy elsewhere."""
    from dataclasses import asdict, is_dataclass

    fields: dict[str, object] = (
        asdict(strategy) if is_dataclass(strategy) and not isinstance(strategy, type) else {})
    fields.pop("name", None)
    by_field = {f: key for key, (f, _) in STRATEGY_OPTIONS.get(strategy.name, {}).items()}
    return {"name": strategy.name,
            "options": {by_field[f]: v for f, v in fields.items() if v is not None}}


def strategy_from_json(data: Mapping[str, object]) -> RestartStrategy:
    """The strategy :func:`strategy_to_json` described."""
    options = data.get("options") or {}
    return restart_strategy(str(data["name"]), options if isinstance(options, Mapping) else {})
