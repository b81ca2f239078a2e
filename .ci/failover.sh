#!/usr/bin/env bash
# What the failover tests (outbox TestFailover*, internal/pgcluster) need:
# PostgreSQL's server binaries (initdb, postgres, pg_basebackup) under
# /usr/lib/postgresql/<version>/bin, and, when CI runs as root, the
# "postgres" OS user to run throwaway clusters as (initdb refuses root).
# Debian's postgresql package provides both. .ci/run then exports
# TXHOOK_REQUIRE_FAILOVER=1 so those tests fail instead of skipping.
set -euo pipefail

have_bins() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && [ -x "$d/postgres" ] && [ -x "$d/pg_basebackup" ] && return 0
  done
  return 1
}

if ! have_bins; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
fi
have_bins || { echo "failover: no initdb/postgres/pg_basebackup under /usr/lib/postgresql/*/bin" >&2; exit 1; }
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  echo "failover: running as root needs a postgres OS user (Debian's postgresql package creates it)" >&2
  exit 1
fi
ls -d /usr/lib/postgresql/*/bin
