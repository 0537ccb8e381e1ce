"""The demos start their short-lived drivers with the C1-only JIT unless the user chose JVM
options of their own."""

from exactly.demos.console import SHORT_LIVED_DRIVER_OPTIONS, demo_env


def test_a_demos_attempts_get_the_short_lived_driver_options_and_keep_their_own_env(monkeypatch):
    monkeypatch.delenv("EXACTLY_DRIVER_JAVA_OPTIONS", raising=False)
    env = demo_env({"EXACTLY_PG_DSN": "postgresql://x"})
    assert env == {"EXACTLY_PG_DSN": "postgresql://x",
                   "EXACTLY_DRIVER_JAVA_OPTIONS": SHORT_LIVED_DRIVER_OPTIONS}


def test_the_users_own_driver_options_win_over_the_demos(monkeypatch):
    monkeypatch.setenv("EXACTLY_DRIVER_JAVA_OPTIONS", "-Xmx2g")
    assert "EXACTLY_DRIVER_JAVA_OPTIONS" not in demo_env()
