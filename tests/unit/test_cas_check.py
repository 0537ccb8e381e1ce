"""check_compare_and_swap on a local directory, and on stores of our LogStore interface that
break its contract the ways S3-compatible stores do: they ignore the condition and overwrite,
report a refusal yet overwrite, or refuse conditional writes outright (S3's 501)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exactly.checkpoint.cas_check import check_compare_and_swap
from exactly.checkpoint.store import LocalLogStore
from exactly.errors import ConfigError


class CreateIgnoresCondition(LocalLogStore):
    """Overwrites on create, like a store that drops ``If-None-Match: *``."""

    def create(self, name: str, data: bytes) -> bool:
        self.write(name, data)
        return True


class SwapIgnoresToken(LocalLogStore):
    """Overwrites on swap, like a store that drops ``If-Match``."""

    def swap(self, name: str, data: bytes, token: str | None) -> bool:
        self.write(name, data)
        return True


class CreateRefusesButOverwrites(LocalLogStore):
    """Answers "exists" to a second create but has written it anyway."""

    def create(self, name: str, data: bytes) -> bool:
        existed = self.exists(name)
        self.write(name, data)
        return not existed


class RefusesConditionalWrites(LocalLogStore):
    """Refuses conditional writes as S3LogStore does on a 501 NotImplemented."""

    def create(self, name: str, data: bytes) -> bool:
        raise ConfigError(f"{self.describe(name)}: this store refuses conditional writes")


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def test_a_local_directory_honours_create_if_absent_and_compare_and_swap_and_keeps_no_probe(
        tmp_path):
    check_compare_and_swap(LocalLogStore(tmp_path / "exactly-job"))
    assert files_under(tmp_path) == []  # the probe and the lock file of its swaps are gone


def test_a_store_whose_create_overwrites_is_refused_naming_create_if_absent(tmp_path):
    store = CreateIgnoresCondition(tmp_path / "exactly-job")
    with pytest.raises(ConfigError) as refused:
        check_compare_and_swap(store)
    message = str(refused.value)
    assert message.startswith(f"{store.describe()}: ")
    assert "create-if-absent (S3: PUT with If-None-Match: *): a second create" in message
    assert "If-Match: <ETag>" not in message  # its swaps are honoured: not named
    assert "`exactly run --ha`" in message and "Fix: " in message
    assert files_under(tmp_path) == []


def test_a_store_whose_swap_ignores_the_version_is_refused_naming_compare_and_swap(tmp_path):
    store = SwapIgnoresToken(tmp_path / "exactly-job")
    with pytest.raises(ConfigError) as refused:
        check_compare_and_swap(store, purpose="the test's lease")
    message = str(refused.value)
    assert "compare-and-swap (S3: PUT with If-Match: <ETag>): a swap of " in message
    assert "naming a version replaced since succeeded" in message
    assert "If-None-Match" not in message  # its creates are honoured: not named
    assert "the test's lease" in message
    assert files_under(tmp_path) == []


def test_a_store_that_reports_a_refused_create_but_overwrote_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"was refused but overwrote the first"):
        check_compare_and_swap(CreateRefusesButOverwrites(tmp_path / "exactly-job"))
    assert files_under(tmp_path) == []


def test_a_store_that_refuses_conditional_writes_is_refused_with_the_purpose_and_the_fix(
        tmp_path):
    store = RefusesConditionalWrites(tmp_path / "exactly-job")
    with pytest.raises(ConfigError) as refused:
        check_compare_and_swap(store)
    message = str(refused.value)
    assert message.startswith(f"{store.describe()}: the store refuses create-if-absent")
    assert "`exactly run --ha`" in message and "Fix: " in message
    assert isinstance(refused.value.__cause__, ConfigError)  # the store's own error
    assert files_under(tmp_path) == []
