#!/usr/bin/env bash
# The browser the dashboard tests drive: Debian's chromium and its matching chromedriver
# (Selenium, from PyPI, is pointed at them; nothing is downloaded at run time). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for pkg in chromium chromium-driver; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
printf '[browser] installing Debian packages: %s\n' "${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
