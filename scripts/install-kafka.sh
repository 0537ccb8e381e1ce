#!/usr/bin/env bash
# Apache Kafka for exactly's Kafka sink, source, tests, demo and benchmark. Idempotent, cached.
#   - broker jars (KRaft, org.apache.kafka:kafka_2.13)            -> $CACHE/broker/
#   - Spark's Kafka connector + kafka-clients, commons-pool2, token provider
#                                                                 -> $CACHE/connector/
#   - confluent-kafka (librdkafka) in .venv, the client library of exactly's sink
# CACHE is the per-user cache ${XDG_CACHE_HOME:-~/.cache}/exactly/kafka, the directory
# exactly.connectors.kafka.jars looks in (EXACTLY_KAFKA_CONNECTOR_JARS / EXACTLY_KAFKA_JARS
# name other directories instead); it does not depend on where exactly is installed from.
# Jars come from Maven Central through scripts/kafka/pom.xml and are fetched again only when
# that pom changes; a checkout's older .cache/kafka/<kind> with the same pom is copied
# instead of downloading again. Tests and the demo start their own broker on 127.0.0.1.
# Called by scripts/setup.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[install-kafka] %s\n' "$*" >&2; }

POM=scripts/kafka/pom.xml
case "${XDG_CACHE_HOME:-}" in
  /*) cache_home="$XDG_CACHE_HOME" ;;
  *) cache_home="$HOME/.cache" ;;  # unset, empty or relative (the XDG spec ignores those)
esac
CACHE="$cache_home/exactly/kafka"
LEGACY=.cache/kafka  # where earlier versions of this script put the jars, in the checkout
want="$(sha256sum "$POM" | cut -d' ' -f1)"

fresh() {  # fresh DIR: DIR holds the jars of this pom
  [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$want" ]
}

# shellcheck source=lib/maven.sh
. scripts/lib/maven.sh

fetch() {  # fetch PROFILE EXTRA_MVN_ARGS...
  local profile="$1"; shift
  local dir="$CACHE/$profile" tmp="$CACHE/.$profile.tmp.$$"
  fresh "$dir" && return 0
  rm -rf "$tmp"
  mkdir -p "$CACHE"
  if fresh "$LEGACY/$profile"; then
    log "copying the $profile jars from $LEGACY/$profile into $dir"
    cp -R "$LEGACY/$profile" "$tmp"
  else
    need_mvn
    log "fetching $profile jars from Maven Central into $dir"
    mkdir -p "$tmp"
    if ! mvn -q -B -Dstyle.color=never -f "$POM" -P "$profile" dependency:copy-dependencies \
        -DoutputDirectory="$tmp" "$@" >"$tmp.log" 2>&1; then
      cat "$tmp.log" >&2
      rm -rf "$tmp" "$tmp.log"
      log "mvn could not fetch the $profile jars (is Maven Central reachable?)"
      exit 1
    fi
    rm -f "$tmp.log"
    echo "$want" > "$tmp/.stamp"
  fi
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

fetch broker -DincludeScope=runtime

if [ -x .venv/bin/python ] && ! .venv/bin/python -c 'import confluent_kafka' 2>/dev/null; then
  log "installing confluent-kafka into .venv"
  .venv/bin/pip install -q 'confluent-kafka>=2.3'
fi
log "ready in $CACHE: $(ls "$CACHE/broker" | wc -l) broker jars"
