#!/usr/bin/env bash
# What the broker-mode tests (internal/natscluster and the packages that
# use it) need: a nats-server binary of the version go.mod requires, for
# clusters of separate server processes. Builds it once into the user
# cache directory (where internal/natscluster looks too, so local test
# runs share it) and prints its path; .ci/run exports it as
# TXHOOK_NATS_SERVER. Debian's nats-server package is too old and runs on
# 127.0.0.1:4222; it is not used.
set -euo pipefail
cd "$(dirname "$0")/.."

module=github.com/nats-io/nats-server/v2
version=$(go list -m -f '{{.Version}}' "$module")
# os.UserCacheDir on Linux: $XDG_CACHE_HOME, else $HOME/.cache.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/txhook
bin=$cache/nats-server-$version
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp "$cache/.nats-server-XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  CGO_ENABLED=0 GOFLAGS= go build -o "$tmp" "$module"
  mv "$tmp" "$bin"
fi
"$bin" --version >&2
echo "$bin"
