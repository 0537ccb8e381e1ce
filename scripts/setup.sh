#!/usr/bin/env bash
# Set up everything exactly needs on a fresh Debian machine. Idempotent and cached:
#   - a Java runtime for Spark (Debian openjdk-17, only when no java is on PATH)
#   - .venv with exactly and its test dependencies (reinstalled only when pyproject changes)
#   - every extra installer in scripts/install-*.sh (PostgreSQL, Kafka jars, ...)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

apt_install() {
  # apt_install PKG... : install Debian packages that are missing (as root or with sudo)
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
  log "installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}
export -f apt_install log

command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.exactly-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  log "installing exactly and its dependencies into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  echo "$want" > "$stamp"
fi

for installer in scripts/install-*.sh; do
  [ -e "$installer" ] || continue
  bash "$installer"
done

# exactly's state writer (savepoint restores that rescale or switch the state backend):
# compiled against the installed PySpark once, cached in ~/.cache/exactly/jvm
.venv/bin/python -c "from exactly.savepoints.state_writer import ensure_jar; ensure_jar()"

# the Spark driver's class archive (JDK class-data sharing): every driver start, restart and
# test loads Spark's classes from it, ~2.5 s faster; built once per PySpark and Java runtime
.venv/bin/python -c "
from exactly.spark.class_archive import archive_path, build
path = archive_path()
if path is not None and not path.is_file():
    import sys; print('[setup] building the Spark driver class archive (once)', file=sys.stderr)
    build()
"
