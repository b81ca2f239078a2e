#!/usr/bin/env bash
# Installs Debian's chromium for the browser test of the operations UI
# (dlq.TestBrowserReplaysADeadLetter), when /usr/bin/chromium is missing.
# Debian or Ubuntu, run as root. Idempotent: with Chromium present it
# installs nothing and does not touch apt; apt-get update runs only when
# apt does not know the package yet, or its lists are stale.
#
#     bash .ci/install-browser.sh
#     TXHOOK_REQUIRE_BROWSER=1 go test ./dlq -run Browser
#
# Set TXHOOK_CHROMIUM to use a Chromium elsewhere; this script then checks
# that one instead.
set -euo pipefail

log() { printf 'install-browser: %s\n' "$*" >&2; }

chromium=${TXHOOK_CHROMIUM:-/usr/bin/chromium}

if [[ -x $chromium ]]; then
	log "$chromium is present; nothing to install"
else
	if ((EUID != 0)); then
		log "must run as root to install chromium"
		exit 1
	fi
	source "$(dirname "$0")/apt.sh"
	apt_install chromium
fi

if [[ ! -x $chromium ]]; then
	log "$chromium is still missing"
	exit 1
fi
log "$("$chromium" --version 2>/dev/null | head -n 1)"
