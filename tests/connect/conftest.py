"""The Spark Connect tests' clients: ``in_client(module, function, **kwargs)`` runs
``module.function(spark, **kwargs)`` in a child process (client.py) whose ``spark`` is a
Connect session (through exactly's ``spark_session(remote=...)``) to the session's
``connect_server`` (a real Spark Connect server on ``local[2]``, from the plugin
:mod:`exactly.testing.pytest_plugin` registered in tests/conftest.py), and fails the test with
the child's traceback when it raised. A child process, because this pytest worker may hold a
classic session, beside which PySpark opens no Connect session. ``pg``, ``conn``,
``table_name``, ``broker`` and ``topic`` come from the same plugin.

A test that kills the server starts it again before it ends (``connect_server.start()``,
same URL); ``in_client`` checks the server runs before it starts a client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CLIENT = Path(__file__).parent / "client.py"


@pytest.fixture
def in_client(connect_server: Any) -> Callable[..., None]:
    def run(module: str, function: str, **kwargs: Any) -> None:
        connect_server.start()  # a no-op while it runs; again after a test that killed it
        proc = subprocess.run([sys.executable, str(CLIENT), connect_server.url, module,
                               function, json.dumps(kwargs)], capture_output=True, text=True,
                              timeout=600, check=False)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
            pytest.fail(f"{module}.{function} on Spark Connect failed "
                        f"(exit {proc.returncode}):\n{tail}", pytrace=False)

    return run
