#!/usr/bin/env bash
# Installs what the example receivers in examples/receivers need and is
# missing: python3 (3.7+), Node.js (16+) and a JDK (11+; the single-file
# source launcher needs the compiler, a JRE is not enough). Debian or
# Ubuntu, run as root. Idempotent: when everything is present it installs
# nothing and does not touch apt. It ends by printing the versions.
#
#     sudo examples/receivers/install-runtimes.sh
#     TXHOOK_REQUIRE_RECEIVERS=1 go test ./examples/receivers/...
#
# JDK_PACKAGE overrides the JDK package (default: default-jdk-headless if
# apt has it, else openjdk-17-jdk-headless).
set -euo pipefail

log() { printf 'install-runtimes: %s\n' "$*" >&2; }

have() { command -v "$1" >/dev/null 2>&1; }

python_ok() {
	have python3 && python3 -c 'import sys; sys.exit(sys.version_info < (3, 7))' 2>/dev/null
}

node_ok() {
	have node && node -e 'process.exit(Number(process.versions.node.split(".")[0]) < 16 ? 1 : 0)' 2>/dev/null
}

java_ok() {
	if ! have java || ! have javac; then
		return 1
	fi
	local v
	v=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java\.specification\.version = //p')
	[[ $v =~ ^[0-9]+$ ]] && ((v >= 11))
}

# has_candidate PACKAGE: apt knows a version of PACKAGE it could install.
has_candidate() {
	local policy
	policy=$(apt-cache policy "$1" 2>/dev/null) || return 1
	[[ $policy =~ Candidate:\ [^\ \(] ]]
}

missing=()
python_ok || missing+=(python3)
node_ok || missing+=(nodejs)
need_jdk=false
java_ok || need_jdk=true

wanted=("${missing[@]}")
if [[ $need_jdk == true ]]; then
	wanted+=(JDK)
fi

if ((${#wanted[@]} > 0)); then
	if ((EUID != 0)); then
		log "must run as root to install: ${wanted[*]}"
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	if [[ $need_jdk == true ]]; then
		jdk=${JDK_PACKAGE:-}
		if [[ -z $jdk ]]; then
			if has_candidate default-jdk-headless; then
				jdk=default-jdk-headless
			else
				jdk=openjdk-17-jdk-headless
			fi
		fi
		missing+=("$jdk")
		# Slim images drop man pages; some JDK postinst scripts fail
		# without this directory.
		mkdir -p /usr/share/man/man1
	fi
	log "installing: ${missing[*]}"
	apt-get install -y --no-install-recommends "${missing[@]}"
else
	log "python3, node and a JDK are present; nothing to install"
fi

status=0
python_ok || { log "python3 3.7 or later is still missing"; status=1; }
node_ok || { log "Node.js 16 or later is still missing (the distribution's nodejs may be too old)"; status=1; }
java_ok || { log "a JDK 11 or later (java and javac) is still missing"; status=1; }

first_line() { printf '%s\n' "${1%%$'\n'*}"; }
if have python3; then first_line "python3: $(python3 --version 2>&1)"; fi
if have node; then first_line "node: $(node --version 2>&1)"; fi
if have java; then first_line "java: $(java -version 2>&1)"; fi
if have javac; then first_line "javac: $(javac -version 2>&1)"; fi
exit "$status"
