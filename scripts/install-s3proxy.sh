#!/usr/bin/env bash
# S3Proxy, the S3-compatible server of exactly's object-store tests. Idempotent, cached.
#   - S3Proxy and its runtime dependencies (org.gaul:s3proxy)     -> $CACHE/jars/
# CACHE is the per-user cache ${XDG_CACHE_HOME:-~/.cache}/exactly/s3proxy, the directory
# exactly.testing.s3_server looks in (EXACTLY_S3PROXY_JARS names another directory instead);
# it does not depend on where exactly is installed from. Jars come from Maven Central
# through scripts/s3proxy/pom.xml and are fetched again only when that pom changes. Tests
# start their own server on 127.0.0.1 (exactly.testing.s3_server.S3Server).
# Called by scripts/setup.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[install-s3proxy] %s\n' "$*" >&2; }

POM=scripts/s3proxy/pom.xml
case "${XDG_CACHE_HOME:-}" in
  /*) cache_home="$XDG_CACHE_HOME" ;;
  *) cache_home="$HOME/.cache" ;;  # unset, empty or relative (the XDG spec ignores those)
esac
CACHE="$cache_home/exactly/s3proxy"
want="$(sha256sum "$POM" | cut -d' ' -f1)"

fresh() {  # fresh DIR: DIR holds the jars of this pom
  [ -f "$1/.stamp" ] && [ "$(cat "$1/.stamp")" = "$want" ]
}

need_mvn() {
  command -v mvn >/dev/null 2>&1 && return 0
  if declare -F apt_install >/dev/null; then
    apt_install maven
  else
    log "Maven (mvn) is missing: install it (Debian: apt-get install maven) and run again"
    exit 1
  fi
}

fetch() {  # fetch KIND EXTRA_MVN_ARGS...
  local kind="$1"; shift
  local dir="$CACHE/$kind" tmp="$CACHE/.$kind.tmp.$$"
  fresh "$dir" && return 0
  need_mvn
  rm -rf "$tmp"
  mkdir -p "$tmp"
  log "fetching the S3Proxy jars from Maven Central into $dir"
  if ! mvn -q -B -Dstyle.color=never -f "$POM" dependency:copy-dependencies \
      -DoutputDirectory="$tmp" "$@" >"$tmp.log" 2>&1; then
    cat "$tmp.log" >&2
    rm -rf "$tmp" "$tmp.log"
    log "mvn could not fetch the S3Proxy jars (is Maven Central reachable?)"
    exit 1
  fi
  rm -f "$tmp.log"
  echo "$want" > "$tmp/.stamp"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

fetch jars -DincludeScope=runtime

log "ready in $CACHE: $(ls "$CACHE/jars" | wc -l) jars"
