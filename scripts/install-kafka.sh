#!/usr/bin/env bash
# Apache Kafka for exactly's Kafka sink, source, tests, demo and benchmark. Idempotent, cached.
#   - broker jars (KRaft, org.apache.kafka:kafka_2.13) -> .cache/kafka/broker/
#   - Spark's Kafka connector + kafka-clients, commons-pool2, token provider
#                                                      -> .cache/kafka/connector/
#   - confluent-kafka (librdkafka) in .venv, the client library of exactly's sink
# Jars come from Maven Central through scripts/kafka/pom.xml; they are fetched again only
# when that pom changes. Tests and the demo start their own broker on 127.0.0.1.
# Called by scripts/setup.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[install-kafka] %s\n' "$*" >&2; }

POM=scripts/kafka/pom.xml
CACHE=.cache/kafka
want="$(sha256sum "$POM" | cut -d' ' -f1)"

if ! command -v mvn >/dev/null 2>&1; then
  if declare -F apt_install >/dev/null; then
    apt_install maven
  else
    log "Maven (mvn) is missing: install it (Debian: apt-get install maven) and run again"
    exit 1
  fi
fi

fetch() {  # fetch PROFILE DIR EXTRA_MVN_ARGS...
  local profile="$1" dir="$2"; shift 2
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; then
    return 0
  fi
  log "fetching $profile jars from Maven Central into $dir"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  if ! mvn -q -B -Dstyle.color=never -f "$POM" -P "$profile" dependency:copy-dependencies \
      -DoutputDirectory="$PWD/$dir.tmp" "$@" >"$dir.tmp.log" 2>&1; then
    cat "$dir.tmp.log" >&2
    log "mvn could not fetch the $profile jars (is Maven Central reachable?)"
    exit 1
  fi
  rm -f "$dir.tmp.log"
  echo "$want" > "$dir.tmp/.stamp"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
}

fetch broker "$CACHE/broker" -DincludeScope=runtime
fetch connector "$CACHE/connector" -DexcludeTransitive=true

if [ -x .venv/bin/python ] && ! .venv/bin/python -c 'import confluent_kafka' 2>/dev/null; then
  log "installing confluent-kafka into .venv"
  .venv/bin/pip install -q 'confluent-kafka>=2.3'
fi
log "ready: $(ls "$CACHE/broker" | wc -l) broker jars, $(ls "$CACHE/connector" | wc -l) connector jars"
