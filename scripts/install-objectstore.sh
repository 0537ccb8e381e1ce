#!/usr/bin/env bash
# Object storage for exactly's tests. Idempotent, cached:
#   - S3Proxy (org.gaul:s3proxy), the S3-compatible server of the tests  -> $CACHE/s3proxy/jars/
#   - Apache Iceberg's REST catalog server (iceberg-open-api's test fixtures, Iceberg 1.10,
#     exactly.testing.iceberg_rest)                                       -> $CACHE/iceberg-rest/jars/
# CACHE is the per-user cache ${XDG_CACHE_HOME:-~/.cache}/exactly, where
# exactly.testing.s3_server and exactly.testing.iceberg_rest look (EXACTLY_S3PROXY_JARS and
# EXACTLY_ICEBERG_REST_JARS name other directories instead); it
# does not depend on where exactly is installed from. Spark's S3A file system is not fetched
# here: spark_session(s3a=True) asks Spark for it (spark.jars.packages), and
# `exactly packages --s3a --download DIR` fills an offline directory (EXACTLY_S3A_JARS). Jars come from Maven Central through scripts/<kind>/pom.xml and are fetched
# again only when that pom changes. Called by scripts/setup.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[install-objectstore] %s\n' "$*" >&2; }

case "${XDG_CACHE_HOME:-}" in
  /*) cache_home="$XDG_CACHE_HOME" ;;
  *) cache_home="$HOME/.cache" ;;  # unset, empty or relative (the XDG spec ignores those)
esac

# shellcheck source=lib/maven.sh
. scripts/lib/maven.sh

fetch() {  # fetch KIND: the runtime jars of scripts/KIND/pom.xml into $cache_home/exactly/KIND/jars
  local kind="$1" pom="scripts/$1/pom.xml"
  local dir="$cache_home/exactly/$kind/jars" tmp="$cache_home/exactly/$kind/.jars.tmp.$$"
  local want; want="$(sha256sum "$pom" | cut -d' ' -f1)"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ]; then
    log "$kind: $(ls "$dir" | wc -l) jars in $dir"
    return 0
  fi
  need_mvn
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "fetching the $kind jars from Maven Central into $dir"
  if ! mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies \
      -DoutputDirectory="$tmp" -DincludeScope=runtime >"$tmp.log" 2>&1; then
    cat "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    log "mvn could not fetch the $kind jars (is Maven Central reachable?)"
    exit 1
  fi
  rm -f "$tmp.log"
  echo "$want" > "$tmp/.stamp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
  log "$kind: $(ls "$dir" | wc -l) jars in $dir"
}

fetch s3proxy
fetch iceberg-rest
