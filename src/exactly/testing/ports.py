"""Free TCP ports on 127.0.0.1 for the throw-away servers of tests and demos."""

from __future__ import annotations

from exactly.errors import ConfigError


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the OS's ephemeral range.

    A port the OS picks (``bind(("127.0.0.1", 0))``) comes from the ephemeral range, the
    same range every outgoing connection takes its source port from: between the pick and
    the server's own bind, a client anywhere on the machine could take it ("Address already
    in use": measured once in a full test run, the Kafka broker failing to start).
    ``port-for`` picks a random unused port outside that range instead.
    """
    try:
        import port_for
    except ModuleNotFoundError as exc:
        raise ConfigError("exactly's throw-away servers (the test kit, `exactly demo --sink "
                          "postgres|kafka`) need the testkit extra: pip install "
                          "'exactly[testkit]'") from exc
    return int(port_for.select_random())
