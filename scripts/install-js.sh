#!/usr/bin/env bash
# The dashboard's JavaScript (`exactly ui`): Chart.js from the npm registry, pinned by version
# and checked against the registry's sha512 integrity, copied into the package's static files.
# Idempotent; the tarball is cached in ~/.cache/exactly/npm. Fetched over HTTPS from the
# registry (Python's urllib; no npm needed), accepted only when its sha512 matches the pin.
set -euo pipefail
cd "$(dirname "$0")/.."

CHARTJS_VERSION="4.6.1"
CHARTJS_INTEGRITY="sha512-hJyniucsFmq//EvXYvJ6c6mahPoI3kaxdjVH8awTaJ/fDNWeSqqqArixMJWkWNN6fcYvPU3HneSANFNYtRi61g=="
dest="src/exactly/monitoring/static/vendor"
stamp="$dest/chart.js.version"

log() { printf '[install-js] %s\n' "$*" >&2; }

if [ -f "$dest/chart.umd.min.js" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$CHARTJS_VERSION" ]; then
  exit 0
fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}"
case "$cache" in /*) ;; *) cache="$HOME/.cache" ;; esac
cache="$cache/exactly/npm"
mkdir -p "$cache" "$dest"
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
tar -xzf "$tarball" -C "$unpacked" package/dist/chart.umd.min.js package/LICENSE.md
cp "$unpacked/package/dist/chart.umd.min.js" "$dest/chart.umd.min.js"
cp "$unpacked/package/LICENSE.md" "$dest/chart.js.LICENSE.md"
rm -rf "$unpacked"
echo "$CHARTJS_VERSION" > "$stamp"
log "chart.js $CHARTJS_VERSION ready in $dest"
