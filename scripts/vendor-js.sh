#!/usr/bin/env bash
# Maintainers only (not run by scripts/setup.sh): re-vendor the dashboard's JavaScript, which
# is committed in src/exactly/monitoring/static/vendor/ and ships in the wheel. Fetches
# Chart.js from the npm registry (Python's urllib; no npm needed), accepts the tarball only
# when its sha512 matches the registry's published integrity pinned below, copies
# chart.umd.min.js and its LICENSE, and records version + sha256 of each file in
# vendor/chart.js.pin (tests/unit/test_vendored_js.py checks the files against it).
#   scripts/vendor-js.sh           re-vendor (to upgrade: change the two pins below first)
#   scripts/vendor-js.sh --check   verify the committed files are the pinned release's, byte
#                                  for byte (exit 1 naming the file otherwise)
# The tarball is cached in ~/.cache/exactly/npm.
set -euo pipefail
cd "$(dirname "$0")/.."

CHARTJS_VERSION="4.6.1"
CHARTJS_INTEGRITY="sha512-hJyniucsFmq//EvXYvJ6c6mahPoI3kaxdjVH8awTaJ/fDNWeSqqqArixMJWkWNN6fcYvPU3HneSANFNYtRi61g=="
dest="src/exactly/monitoring/static/vendor"

log() { printf '[vendor-js] %s\n' "$*" >&2; }

check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) log "unknown argument $1 (known: --check)"; exit 2 ;;
esac

cache="${XDG_CACHE_HOME:-$HOME/.cache}"
case "$cache" in /*) ;; *) cache="$HOME/.cache" ;; esac
cache="$cache/exactly/npm"
mkdir -p "$cache"
tarball="$cache/chart.js-$CHARTJS_VERSION.tgz"
if [ ! -f "$tarball" ]; then
  log "fetching chart.js@$CHARTJS_VERSION from the npm registry"
  part="$tarball.part.$$"
  url="https://registry.npmjs.org/chart.js/-/chart.js-$CHARTJS_VERSION.tgz"
  if ! python3 -c 'import shutil, sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=60) as r, open(sys.argv[2], "wb") as f:
    shutil.copyfileobj(r, f)' "$url" "$part"; then
    rm -f "$part"
    log "could not fetch $url (is the npm registry reachable?)"; exit 1
  fi
  mv "$part" "$tarball"
fi
actual="sha512-$(openssl dgst -sha512 -binary "$tarball" | base64 -w0)"
if [ "$actual" != "$CHARTJS_INTEGRITY" ]; then
  rm -f "$tarball"
  log "chart.js-$CHARTJS_VERSION.tgz does not match the pinned integrity; removed it, run again"
  exit 1
fi
unpacked="$(mktemp -d)"
trap 'rm -rf "$unpacked"' EXIT
tar -xzf "$tarball" -C "$unpacked" package/dist/chart.umd.min.js package/LICENSE.md
files=("$unpacked/package/dist/chart.umd.min.js:chart.umd.min.js"
       "$unpacked/package/LICENSE.md:chart.js.LICENSE.md")

if [ "$check" -eq 1 ]; then
  status=0
  for pair in "${files[@]}"; do
    if ! cmp -s "${pair%%:*}" "$dest/${pair##*:}"; then
      log "$dest/${pair##*:} is not chart.js $CHARTJS_VERSION's file: run scripts/vendor-js.sh"
      status=1
    fi
  done
  [ "$status" -eq 0 ] && log "$dest holds chart.js $CHARTJS_VERSION's files"
  exit "$status"
fi

mkdir -p "$dest"
for pair in "${files[@]}"; do cp "${pair%%:*}" "$dest/${pair##*:}"; done
python3 - "$dest" "$CHARTJS_VERSION" "$CHARTJS_INTEGRITY" <<'PY'
import hashlib, json, sys
from pathlib import Path
dest, version, integrity = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
files = {name: hashlib.sha256((dest / name).read_bytes()).hexdigest()
         for name in ("chart.umd.min.js", "chart.js.LICENSE.md")}
pin = {"package": "chart.js", "version": version, "npm_integrity": integrity,
       "sha256": files}
(dest / "chart.js.pin").write_text(json.dumps(pin, indent=2) + "\n")
PY
log "chart.js $CHARTJS_VERSION vendored in $dest (pins in $dest/chart.js.pin)"
