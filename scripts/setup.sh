#!/usr/bin/env bash
# Set up everything exactly needs on a fresh Debian machine. Idempotent and cached:
#   - the Debian packages: a Java runtime for Spark (openjdk-17, only when no java is on
#     PATH), PostgreSQL and its JDBC driver, Maven (for the jars below); with --browser also
#     chromium and chromium-driver (the dashboard's browser tests) -- one apt transaction
#   - .venv with exactly and its test dependencies (reinstalled only when pyproject changes)
#   - every extra installer in scripts/install-*.sh (PostgreSQL, Kafka and S3 jars, ...), the
#     state writer's jar, the driver's class archive (the dashboard's chart library is
#     committed: scripts/vendor-js.sh, for maintainers only, re-vendors it)
# Steps that do not need each other run side by side (the apt transaction beside the pip
# install; the jar downloads beside the class archive build): on a fresh machine most of the
# time is network and unpacking.
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

# run_all NAME CMD NAME CMD ...: run the commands side by side; fail (naming it) if one fails
run_all() {
  local names=() pids=() failed=()
  while [ $# -ge 2 ]; do
    names+=("$1"); bash -c "$2" & pids+=($!); shift 2
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${names[$i]}"); done
  if [ ${#failed[@]} -gt 0 ]; then
    log "failed: ${failed[*]} (its output is above)"
    exit 1
  fi
}

debs=(postgresql libpostgresql-jdbc-java maven)
command -v java >/dev/null 2>&1 || debs+=(openjdk-17-jre-headless)
for arg in "$@"; do
  case "$arg" in
    --browser) debs+=(chromium chromium-driver) ;;
    *) log "unknown argument $arg (known: --browser)"; exit 2 ;;
  esac
done
PYTHON="${PYTHON:-python3}"
python_env() {
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PYTHON" -m venv .venv
  fi
  local stamp=".venv/.exactly-installed" want
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing exactly and its dependencies into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[test]'
    echo "$want" > "$stamp"
  fi
}
export -f python_env
export PYTHON

run_all "Debian packages (${debs[*]})" "apt_install ${debs[*]}" \
        "the Python environment (.venv)" python_env

installers=""
for installer in scripts/install-*.sh; do
  [ -e "$installer" ] || continue
  installers+="bash $installer && "
done
# exactly's state writer (savepoint restores that rescale or switch the state backend): a
# wheel carries it; the checkout's editable install compiles it against the installed PySpark
# once, cached in ~/.cache/exactly/jvm. The driver's
# class archive (JDK class-data sharing): every driver start, restart and test loads Spark's
# classes from it (about half a driver's start-up CPU); built once per PySpark and Java runtime
jvm_files='.venv/bin/python -c "from exactly.spark.state_writer_jar import ensure_jar; ensure_jar()" && .venv/bin/python -c "
from exactly.spark.class_archive import archive_path, build
path = archive_path()
if path is not None and not path.is_file():
    import sys; print(\"[setup] building the Spark driver class archive (once)\", file=sys.stderr)
    build()
"'
run_all "the installers (scripts/install-*.sh)" "${installers}true" \
        "the state writer and the class archive" "$jvm_files"
