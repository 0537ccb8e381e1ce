#!/usr/bin/env bash
# PostgreSQL for exactly's PostgreSQL sinks, source, tests, demo and benchmarks. Idempotent.
#   - Debian `postgresql` (server binaries: initdb, pg_ctl, postgres); tests and the demo
#     start their own throw-away cluster, never the system one
#   - psycopg 3 in .venv (the sinks' client library; a dependency of exactly)
# Called by scripts/setup.sh (`postgres`, `tests`), which exports apt_install and log.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt_install postgresql
fi
# Debian starts a system cluster on install; the tests never use it and need no daemon.
if command -v pg_lsclusters >/dev/null 2>&1 && pg_lsclusters -h 2>/dev/null | grep -q online; then
  log "stopping the Debian system PostgreSQL cluster (exactly's tests start their own)"
  pg_lsclusters -h | awk '$4 == "online" {print $1, $2}' | while read -r ver name; do
    pg_ctlcluster "$ver" "$name" stop || true
  done
fi

if [ -x .venv/bin/python ] && ! .venv/bin/python -c 'import psycopg' 2>/dev/null; then
  log "installing psycopg 3 into .venv"
  .venv/bin/pip install -q 'psycopg[binary]>=3.1'
fi
