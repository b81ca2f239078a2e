# Sourced by the .ci scripts: apt_install PACKAGE installs a Debian package
# as root, running apt-get update only when apt does not know the package
# yet, or its lists are stale.

# has_candidate PACKAGE: apt knows a version of PACKAGE it could install.
has_candidate() {
	local policy
	policy=$(apt-cache policy "$1" 2>/dev/null) || return 1
	[[ $policy =~ Candidate:\ [^\ \(] ]]
}

apt_install() {
	export DEBIAN_FRONTEND=noninteractive
	if has_candidate "$1" && apt-get install -y --no-install-recommends "$1" >&2; then
		return
	fi
	printf 'apt: updating the package lists\n' >&2
	apt-get update >&2
	apt-get install -y --no-install-recommends "$1" >&2
}
