# Sourced by scripts/install-*.sh that fetch jars from Maven Central.
# need_mvn: make sure Maven is on PATH (through setup.sh's apt_install when it is there).
need_mvn() {
  command -v mvn >/dev/null 2>&1 && return 0
  if declare -F apt_install >/dev/null; then
    apt_install maven
  else
    log "Maven (mvn) is missing: install it (Debian: apt-get install maven) and run again"
    exit 1
  fi
}
