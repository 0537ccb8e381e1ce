import pytest

from exactly.config import CheckpointConfig, Mode, StateBackend, parse_duration
from exactly.errors import ConfigError, NotSupportedYetError


def test_defaults_are_exactly_once_in_memory_with_hashmap_state():
    config = CheckpointConfig()
    assert config.mode is Mode.EXACTLY_ONCE
    assert config.is_memory_storage
    assert config.state_backend is StateBackend.HASHMAP
    assert config.interval_seconds == 1.0


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("1 min", 60.0),
                                               (3, 3.0), ("1.5", 1.5)])
def test_durations_accept_units(text, seconds):
    assert parse_duration(text, name="interval") == seconds


@pytest.mark.parametrize("text", ["fast", "-1s", "1 fortnight"])
def test_bad_durations_name_the_option(text):
    with pytest.raises(ConfigError, match="interval"):
        CheckpointConfig(interval=text)


def test_unknown_mode_lists_the_choices():
    with pytest.raises(ConfigError, match=r"exactly_once \| at_least_once"):
        CheckpointConfig(mode="maybe_once")


def test_unaligned_with_at_least_once_is_an_invalid_combination_not_a_missing_feature():
    with pytest.raises(ConfigError, match="need mode='exactly_once'") as info:
        CheckpointConfig(unaligned=True, mode="at_least_once")
    assert not isinstance(info.value, NotSupportedYetError)


def test_more_than_one_concurrent_checkpoint_is_refused():
    with pytest.raises(ConfigError, match="one epoch"):
        CheckpointConfig(max_concurrent_checkpoints=2)


def test_incremental_needs_rocksdb():
    with pytest.raises(ConfigError, match="rocksdb"):
        CheckpointConfig(incremental=True)
    conf = CheckpointConfig(incremental=True, state_backend="rocksdb").spark_conf()
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert "RocksDB" in conf["spark.sql.streaming.stateStore.providerClass"]


@pytest.mark.parametrize("option", [
    {"timeout": "10min"}, {"min_pause_between_checkpoints": "1s"},
    {"tolerable_failed_checkpoints": 2}, {"unaligned": True},
    {"checkpoints_after_tasks_finish": False}])
def test_declared_but_unimplemented_options_are_refused_not_ignored(option):
    with pytest.raises(NotSupportedYetError, match="not supported yet"):
        CheckpointConfig(**option)


def test_aligned_timeout_without_unaligned_is_invalid():
    with pytest.raises(ConfigError, match="unaligned=True"):
        CheckpointConfig(aligned_checkpoint_timeout="5s")
