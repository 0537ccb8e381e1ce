"""Free TCP ports on 127.0.0.1 for the throw-away servers of tests and demos."""

from __future__ import annotations

import random

from exactly.errors import ConfigError, ExactlyError


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, outside the OS's ephemeral range.

    A port the OS picks (``bind(("127.0.0.1", 0))``) comes from the ephemeral range, the
    same range every outgoing connection takes its source port from: between the pick and
    the server's own bind, a client anywhere on the machine could take it ("Address already
    in use": measured once in a full test run, the Kafka broker failing to start).
    ``port-for`` names the unused ports outside that range instead; one is drawn at random
    by a generator of its own: ``port_for.select_random`` draws from the ``random`` module,
    which a test runner may seed with one seed for every test and every worker
    (pytest-randomly), and two workers drawing the same ports at once would collide.
    """
    try:
        import port_for
    except ModuleNotFoundError as exc:
        raise ConfigError("exactly's throw-away servers (the test kit, `exactly demo --sink "
                          "postgres|kafka`) need the testkit extra: pip install "
                          "'exactly[testkit]'") from exc
    candidates = sorted(port_for.available_good_ports())
    for port in _RANDOM.sample(candidates, min(len(candidates), 100)):
        if not port_for.port_is_used(port):
            return port
    raise ExactlyError("no free TCP port on 127.0.0.1 outside the ephemeral range")


#: draws ports whatever seed the ``random`` module was given
_RANDOM = random.SystemRandom()
