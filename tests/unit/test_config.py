import pytest

from exactly.config import CheckpointConfig, Mode, StateBackend, parse_duration
from exactly.errors import ConfigError, NotSupportedYetError


def test_defaults_are_exactly_once_in_memory_with_the_backend_left_to_the_checkpoint():
    config = CheckpointConfig()
    assert config.mode is Mode.EXACTLY_ONCE
    assert config.is_memory_storage
    assert config.state_backend is None and config.incremental is None
    assert config.interval_seconds == 1.0
    # a new checkpoint gets RocksDB with changelog checkpointing
    assert (config.backend, config.changelog) == (StateBackend.ROCKSDB, True)
    conf = config.spark_conf()
    assert "RocksDB" in conf["spark.sql.streaming.stateStore.providerClass"]
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"


@pytest.mark.parametrize(("given", "pinned", "backend", "changelog"), [
    ({}, None, StateBackend.ROCKSDB, True),
    ({}, StateBackend.HASHMAP, StateBackend.HASHMAP, False),
    ({}, StateBackend.ROCKSDB, StateBackend.ROCKSDB, True),
    ({"incremental": False}, StateBackend.ROCKSDB, StateBackend.ROCKSDB, False),
    ({"state_backend": "hashmap"}, None, StateBackend.HASHMAP, False),
    ({"state_backend": "hashmap"}, StateBackend.HASHMAP, StateBackend.HASHMAP, False),
    ({"state_backend": "rocksdb", "incremental": False}, None, StateBackend.ROCKSDB, False),
    ({"state_backend": "auto"}, StateBackend.HASHMAP, StateBackend.HASHMAP, False),
])
def test_the_backend_follows_the_checkpoint_unless_given(given, pinned, backend, changelog):
    resolved = CheckpointConfig(**given).for_checkpoint(pinned, "/ck")
    assert (resolved.state_backend, resolved.incremental) == (backend, changelog)
    assert (resolved.backend, resolved.changelog) == (backend, changelog)


def test_a_given_backend_other_than_the_checkpoints_is_refused_naming_the_ways_out():
    with pytest.raises(ConfigError, match=r"state_backend='hashmap'.*savepoint"):
        CheckpointConfig(state_backend="rocksdb").for_checkpoint(StateBackend.HASHMAP, "/ck")
    with pytest.raises(ConfigError, match="incremental=True needs RocksDB"):
        CheckpointConfig(incremental=True).for_checkpoint(StateBackend.HASHMAP, "/ck")
    with pytest.raises(ConfigError, match="incremental: give True, False or None"):
        CheckpointConfig(incremental="yes")


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("1 min", 60.0),
                                               (3, 3.0), ("1.5", 1.5)])
def test_durations_accept_units(text, seconds):
    assert parse_duration(text, name="interval") == seconds


@pytest.mark.parametrize(("text", "seconds"), [
    ("2S", 2.0), ("500 ms", 0.5), ("500 MS", 0.5), ("1d", 86400.0), ("2 days", 172800.0),
    ("1h", 3600.0), ("3 hours", 10800.0), ("10min", 600.0), ("10m", 600.0),
    ("2 minutes", 120.0), ("1 second", 1.0), ("30 seconds", 30.0), ("30secs", 30.0),
    ("250 milliseconds", 0.25), ("250millis", 0.25), ("1500000us", 1.5),
    ("2000000000 ns", 2.0)])
def test_durations_accept_flinks_forms(text, seconds):
    """Flink's TimeUtils forms: units in any case, with or without a space, long names."""
    assert parse_duration(text, name="timeout") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["fast", "-1s", "1 fortnight", "1 s s", "2.s", "ms"])
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
        CheckpointConfig(incremental=True, state_backend="hashmap")
    conf = CheckpointConfig(incremental=True, state_backend="rocksdb").spark_conf()
    assert conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] == "true"
    assert "RocksDB" in conf["spark.sql.streaming.stateStore.providerClass"]


def test_operational_policies_are_parsed_into_seconds():
    config = CheckpointConfig(storage="/tmp/ck", timeout="10min",
                              min_pause_between_checkpoints="500ms",
                              tolerable_failed_checkpoints=2)
    assert config.timeout_seconds == 600.0
    assert config.min_pause_seconds == 0.5
    assert config.needs_admission and not config.sizes_epochs


@pytest.mark.parametrize(("options", "target"), [
    ({"unaligned": True, "aligned_checkpoint_timeout": "3s"}, 3.0),
    ({"target_epoch_duration": "2s"}, 2.0),
    ({"unaligned": True, "interval": "4s"}, 4.0),
])
def test_unaligned_checkpoints_become_epoch_sizing_with_a_target(options, target):
    config = CheckpointConfig(**options)
    assert config.epoch_target_seconds == target
    assert config.sizes_epochs and config.needs_admission


@pytest.mark.parametrize(("options", "message"), [
    ({"timeout": "200ms"}, "timeout: .* below the floor"),
    ({"timeout": "-5s"}, "timeout: a duration cannot be negative"),
    ({"min_pause_between_checkpoints": "soon"}, "min_pause_between_checkpoints: cannot read"),
    ({"tolerable_failed_checkpoints": -1}, "tolerable_failed_checkpoints: give a whole number"),
    ({"tolerable_failed_checkpoints": "2"}, "tolerable_failed_checkpoints: give a whole number"),
    ({"target_epoch_duration": "2s", "mode": "at_least_once"}, "needs mode='exactly_once'"),
    ({"unaligned": True, "max_concurrent_checkpoints": 2}, "max_concurrent_checkpoints"),
    ({"target_epoch_duration": "100ms"}, "at least 1s"),
    ({"target_epoch_duration": "2s", "unaligned": True, "aligned_checkpoint_timeout": "2s"},
     "name the same setting"),
])
def test_bad_policies_name_the_option_and_the_fix(options, message):
    with pytest.raises(ConfigError, match=message):
        CheckpointConfig(**options)


def test_the_one_option_spark_cannot_honour_is_refused_with_the_reason():
    with pytest.raises(NotSupportedYetError, match="Spark always commits the final epoch"):
        CheckpointConfig(checkpoints_after_tasks_finish=False)


def test_aligned_timeout_without_unaligned_is_invalid():
    with pytest.raises(ConfigError, match="unaligned=True"):
        CheckpointConfig(aligned_checkpoint_timeout="5s")


def test_replace_keeps_every_other_setting_and_checks_the_result():
    config = CheckpointConfig(interval="2s", timeout="1min", state_backend="rocksdb",
                              incremental=True, tolerable_failed_checkpoints=3)
    moved = config.replace(storage="/data/ck")
    assert moved.storage == "/data/ck"
    assert (moved.interval_seconds, moved.timeout_seconds, moved.state_backend,
            moved.incremental, moved.tolerable_failed_checkpoints) == (
        2.0, 60.0, StateBackend.ROCKSDB, True, 3)
    with pytest.raises(ConfigError, match="incremental"):
        config.replace(state_backend="hashmap")
    with pytest.raises(ConfigError, match="no setting colour"):
        config.replace(colour="blue")
