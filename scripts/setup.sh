#!/usr/bin/env bash
# Set up what a command needs on a fresh Debian machine, and nothing more. Idempotent and
# cached: a second run with nothing to do takes about a second.
#
#   scripts/setup.sh            the files demo: .venv with exactly, and a Java runtime for
#                               Spark (Debian's openjdk-17, only when no java is on PATH)
#   scripts/setup.sh PART...    that plus each PART:
#     postgres   PostgreSQL's server binaries (Debian) for throw-away servers, and the test kit
#     kafka      the Kafka broker's jars (Maven Central, ~/.cache/exactly/kafka), the test kit
#     s3         S3Proxy's jars and the Iceberg REST catalog server's (Maven Central,
#                ~/.cache/exactly/{s3proxy,iceberg-rest}), the test kit
#     browser    chromium and chromium-driver (the dashboard's browser tests)
#     dev        the test tools (pytest, ruff, mypy): what the fast lane needs
#     tests      everything the test suite needs: dev, postgres, kafka, s3 and browser, and
#                exactly's state writer jar
#     bench      tests, plus PostgreSQL's JDBC driver (Spark's JDBC writer in bench/)
#
# The tests and benchmarks (parts tests, bench) also build a class-data-sharing archive of the
# Spark driver's classes, once per PySpark and Java runtime (~/.cache/exactly/jvm;
# exactly.spark.class_archive): their hundred driver starts each load faster; the demo goes
# without it (its build takes ~70 s on a fresh machine). Steps that do not need each other run side
# by side (the Debian packages beside the Python install, the jar downloads beside the archive
# build): on a fresh machine most of the time is the network, unpacking, and building
# PySpark's wheel from its source distribution.
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

postgres=0 kafka=0 s3=0 browser=0 dev=0 tests=0 bench=0
for arg in "$@"; do
  case "$arg" in
    postgres) postgres=1 ;;
    kafka) kafka=1 ;;
    s3) s3=1 ;;
    browser) browser=1 ;;
    dev) dev=1 ;;
    tests) tests=1 ;;
    bench) bench=1; tests=1 ;;
    *) log "unknown part '$arg' (known: postgres kafka s3 browser dev tests bench)"; exit 2 ;;
  esac
done
[ $tests -eq 1 ] && postgres=1 kafka=1 s3=1 browser=1 dev=1

debs=()
command -v java >/dev/null 2>&1 || debs+=(openjdk-17-jre-headless)
if [ $postgres -eq 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  debs+=(postgresql)
fi
[ $bench -eq 1 ] && debs+=(libpostgresql-jdbc-java)
# Maven fetches the broker's, S3Proxy's and the Iceberg REST server's jars; only when one is
# missing (install-*.sh check)
if { [ $kafka -eq 1 ] || [ $s3 -eq 1 ]; } && ! command -v mvn >/dev/null 2>&1; then
  debs+=(maven)
fi
[ $browser -eq 1 ] && debs+=(chromium chromium-driver)

# the extras of exactly installed into .venv: the test kit for throw-away servers, the test
# tools for the suite
extras=""
{ [ $postgres -eq 1 ] || [ $kafka -eq 1 ] || [ $s3 -eq 1 ]; } && extras="testkit"
[ $dev -eq 1 ] && extras="test"
PYTHON="${PYTHON:-python3}"
rank() { case "$1" in test) echo 2 ;; testkit) echo 1 ;; *) echo 0 ;; esac; }
python_env() {
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    "$PYTHON" -m venv .venv
  fi
  # the stamp holds pyproject's digest and the extras installed with it (test includes
  # testkit): a venv set up for the tests serves the demos without a reinstall
  local stamp=".venv/.exactly-installed" digest have="" have_extras="" want="$EXTRAS"
  digest="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  [ -f "$stamp" ] && read -r have have_extras < "$stamp" || true
  if [ "$have" = "$digest" ]; then
    [ "$(rank "$have_extras")" -ge "$(rank "$want")" ] && return 0
  fi
  log "installing exactly${want:+[$want]} and its dependencies into .venv"
  # uv (from PyPI) downloads and unpacks in parallel: on a fresh machine it installs in less
  # than half pip's time; pip does it where uv cannot be had
  # (uv writes no bytecode unless asked: where PYTHONDONTWRITEBYTECODE is set, every process
  # would compile pandas, PySpark and the rest from source again, ~0.3-2 CPU-s an import)
  if .venv/bin/python -m pip install -q "uv>=0.5" >/dev/null 2>&1; then
    .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python \
      -e ".${want:+[$want]}"
  else
    log "uv is not available here; installing with pip"
    .venv/bin/pip install -q -e ".${want:+[$want]}"
  fi
  echo "$digest $want" > "$stamp"
}
export -f rank
export -f python_env
export PYTHON EXTRAS="$extras"

steps=("the Python environment (.venv)" python_env)
[ ${#debs[@]} -gt 0 ] && steps+=("Debian packages (${debs[*]})" "apt_install ${debs[*]}")
run_all "${steps[@]}"

# for the tests: the class archive (it needs .venv's PySpark and a Java runtime: after the
# step above) and exactly's state writer (savepoint restores that rescale or switch the state
# backend): a wheel carries it; a checkout compiles it against the installed PySpark once,
# cached in ~/.cache/exactly/jvm (a session compiles it on first use otherwise)
steps=()
if [ $tests -eq 1 ]; then
  steps+=("the class archive and the state writer" '.venv/bin/python -c "
from exactly.spark.state_writer_jar import ensure_jar
from exactly.spark.class_archive import archive_path, build
ensure_jar()
path = archive_path()
if path is not None and not path.is_file():
    import sys; print(\"[setup] building the Spark driver class archive (once)\", file=sys.stderr)
    build()
"')
fi
# the engine-upgrade test's older PySpark (tests/savepoints/test_engine_upgrade.py): a venv
# of its own with exactly's runtime dependencies (exactly itself from src/ on PYTHONPATH:
# its pin is the current PySpark); the stamp names the version, so a rerun skips it
OLD_PYSPARK=4.2.1
old_spark_env() {
  local venv=.venv-spark-old stamp=.venv-spark-old/.exactly-installed
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "pyspark==$OLD_PYSPARK" ] && return 0
  log "creating $venv with PySpark $OLD_PYSPARK (the engine-upgrade test)"
  rm -rf "$venv" && "$PYTHON" -m venv "$venv"
  local deps=("pyspark==$OLD_PYSPARK" "pyarrow>=15" "pandas>=2.2,<3" "numpy>=1.26"
    "click>=8.1" "rich>=13" "protobuf>=4.25" "grpcio>=1.60" "psutil>=5.9" "tenacity>=8.3"
    "boto3>=1.36" "duckdb>=1.1" "psycopg[binary]>=3.1" "starlette>=0.37" "uvicorn>=0.30"
    "prometheus-client>=0.20" "deltalake>=1.6" "confluent-kafka>=2.3")
  if [ -x .venv/bin/uv ]; then
    .venv/bin/uv pip install -q --compile-bytecode --python "$venv/bin/python" "${deps[@]}"
  else
    "$venv/bin/pip" install -q "${deps[@]}"
  fi
  echo "pyspark==$OLD_PYSPARK" > "$stamp"
}
export -f old_spark_env
export OLD_PYSPARK
[ $tests -eq 1 ] && steps+=("PySpark $OLD_PYSPARK (.venv-spark-old)" old_spark_env)
[ $postgres -eq 1 ] && steps+=("PostgreSQL" "bash scripts/install-postgres.sh")
[ $kafka -eq 1 ] && steps+=("the Kafka broker's jars" "bash scripts/install-kafka.sh")
[ $s3 -eq 1 ] && steps+=("S3Proxy's and the Iceberg REST server's jars" \
  "bash scripts/install-objectstore.sh")
if [ ${#steps[@]} -gt 0 ]; then run_all "${steps[@]}"; fi
# the bytecode of exactly and of every installed package, compiled here for the processes
# that cannot write it (Python writes none where PYTHONDONTWRITEBYTECODE is set, as on CI
# machines, and would compile PySpark, pandas, PyArrow and exactly anew in every driver,
# worker and command: 2.2 s of CPU for `import pandas` instead of 0.7 s); only what changed
# since the last run is compiled again (a run with nothing to compile takes ~0.3 s)
.venv/bin/python -m compileall -q src/exactly >/dev/null
site_packages="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
.venv/bin/python -m compileall -q "$site_packages" >/dev/null \
  || log "some installed files did not compile (ignored: Python compiles them when imported)"
