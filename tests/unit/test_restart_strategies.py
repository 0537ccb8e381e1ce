"""Restart strategies as pure functions of the failure times (an injected clock: the times)."""

import random

import pytest

from exactly.errors import ConfigError
from exactly.ops.restart import (
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    NoRestart,
    gives_up_on_repeats,
    parse_option_pairs,
    restart_strategy,
    strategy_from_json,
    strategy_to_json,
)


def test_none_never_restarts():
    assert NoRestart().next_delay([10.0]) is None


def test_fixed_delay_with_two_attempts_gives_up_on_the_third_failure():
    strategy = restart_strategy("fixed-delay", {"attempts": "2", "delay": "3s"})
    assert strategy.next_delay([0.0]) == 3.0
    assert strategy.next_delay([0.0, 100.0]) == 3.0
    assert strategy.next_delay([0.0, 100.0, 10_000.0]) is None


def test_failure_rate_counts_only_failures_inside_its_interval():
    strategy = FailureRate(max_failures_per_interval=2, failure_rate_interval=60.0, delay=5.0)
    assert strategy.next_delay([0.0, 30.0]) == 5.0
    assert strategy.next_delay([0.0, 30.0, 50.0]) is None  # three within 60 s
    assert strategy.next_delay([0.0, 30.0, 95.0]) == 5.0  # 0.0 fell out of the interval


def test_exponential_delay_grows_to_the_cap_and_resets_after_the_threshold():
    strategy = ExponentialDelay(initial_backoff=1.0, max_backoff=10.0, backoff_multiplier=2.0,
                                reset_backoff_threshold=300.0, jitter_factor=0.0)
    times = [0.0]
    waits = []
    for _ in range(6):
        waits.append(strategy.next_delay(times))
        times.append(times[-1] + 1.0)
    assert waits == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert strategy.next_delay([*times, times[-1] + 301.0]) == 1.0  # quiet long enough


def test_exponential_delay_jitter_stays_within_its_factor():
    strategy = ExponentialDelay(initial_backoff=10.0, jitter_factor=0.1)
    rng = random.Random(3)
    waits = [strategy.next_delay([0.0], rng) for _ in range(200)]
    assert all(9.0 <= w <= 11.0 for w in waits)
    assert len(set(waits)) > 100  # jitter varies


def test_exponential_delay_attempts_before_reset_backoff_give_up():
    strategy = ExponentialDelay(jitter_factor=0.0, attempts_before_reset_backoff=2)
    assert strategy.next_delay([0.0, 1.0]) is not None
    assert strategy.next_delay([0.0, 1.0, 2.0]) is None


def test_flink_defaults():
    default = ExponentialDelay()
    assert (default.initial_backoff, default.max_backoff, default.backoff_multiplier,
            default.reset_backoff_threshold, default.jitter_factor) == (1.0, 60.0, 1.5,
                                                                         3600.0, 0.1)
    assert (FixedDelay().attempts, FixedDelay().delay) == (1, 1.0)
    rate = FailureRate()
    assert (rate.max_failures_per_interval, rate.failure_rate_interval, rate.delay) == (
        1, 60.0, 1.0)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("fixed-dealy", {}, "did you mean fixed-delay"),
    ("fixed-delay", {"atempts": "2"}, "did you mean attempts"),
    ("fixed-delay", {"delay": "-1s"}, "negative"),
    ("fixed-delay", {"delay": "soon"}, "cannot read 'soon'"),
    ("fixed-delay", {"attempts": "two"}, "whole number"),
    ("exponential-delay", {"jitter-factor": "2"}, "between 0 and 1"),
    ("exponential-delay", {"initial-backoff": "10s", "max-backoff": "1s"}, "max-backoff"),
    ("failure-rate", {"max-failures-per-interval": "0"}, "at least 1"),
])
def test_bad_strategy_settings_name_the_option(name, options, message):
    with pytest.raises(ConfigError, match=message):
        restart_strategy(name, options)


def test_flink_keys_with_their_prefix_and_aliases_are_accepted():
    strategy = restart_strategy("fixeddelay", {"restart-strategy.fixed-delay.attempts": 4})
    assert strategy == FixedDelay(attempts=4)
    assert restart_strategy("off") == NoRestart()


def test_a_strategy_survives_its_json_form():
    for strategy in (NoRestart(), FixedDelay(3, 2.5), FailureRate(2, 30.0, 1.0),
                     ExponentialDelay(2.0, 20.0, 3.0, 100.0, 0.2, 7)):
        assert strategy_from_json(strategy_to_json(strategy)) == strategy


def test_cli_option_pairs_need_an_equals_sign():
    assert parse_option_pairs(["attempts=3", "delay = 2s"]) == {"attempts": "3", "delay": "2s"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_option_pairs(["attempts"])


def test_max_repeated_cause_is_an_option_of_every_strategy_that_restarts():
    for name in ("fixed-delay", "failure-rate", "exponential-delay"):
        strategy = restart_strategy(name, {"max-repeated-cause": "3"})
        assert strategy.max_repeated_cause == 3  # type: ignore[attr-defined]
        assert "max-repeated-cause=3" in strategy.describe()
        assert strategy_from_json(strategy_to_json(strategy)) == strategy
        assert "max-repeated-cause" not in restart_strategy(name).describe()
    with pytest.raises(ConfigError, match="has no option 'max-repeated-cause'"):
        restart_strategy("none", {"max-repeated-cause": 3})


def test_max_repeated_cause_gives_up_from_its_count_on_and_unset_never():
    strategy = ExponentialDelay(max_repeated_cause=3)
    assert [gives_up_on_repeats(strategy, n) for n in (1, 2, 3, 4)] == [False, False, True,
                                                                         True]
    assert not gives_up_on_repeats(ExponentialDelay(), 1000)
    assert not gives_up_on_repeats(NoRestart(), 1000)


@pytest.mark.parametrize(("value", "message"), [
    ("0", "at least 1"), ("-2", "at least 1"), ("three", "whole number"),
    ("2.5", "whole number")])
def test_bad_max_repeated_cause_values_name_the_option(value, message):
    with pytest.raises(ConfigError, match=f"max-repeated-cause.*{message}"):
        restart_strategy("exponential-delay", {"max-repeated-cause": value})
    for bad in (0, 2.5, True):
        with pytest.raises(ConfigError, match=r"fixed-delay\.max-repeated-cause must be a whole"):
            FixedDelay(max_repeated_cause=bad)  # type: ignore[arg-type]
