"""The PostgreSQL tests' server: ``pg`` (a throw-away server, 127.0.0.1, own port and temp
dir, started once per session), ``conn`` and ``table_name`` come from the plugin
:mod:`exactly.testing.pytest_plugin`, registered in tests/conftest.py.

Missing server binaries are a failure, not a skip: the suite must not pass without having
run. ``scripts/setup.sh`` installs them (Debian's ``postgresql`` package).
"""
