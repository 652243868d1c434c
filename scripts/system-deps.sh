#!/usr/bin/env bash
# `make deps`: install the Debian packages of system-packages.txt that this machine lacks.
#
# As root: apt-get update, then one non-interactive apt-get install of the missing packages. A
# policy-rc.d that refuses every start is in place meanwhile, so no daemon they bring starts in the
# machine's own namespace (the lab runs its own copies in namespaces of its own), and the services
# the install enabled for the machine's next boot are disabled again.
# Without root: prints the one apt-get line to run and what is skipped until then.
set -euo pipefail
cd "$(dirname "$0")/.."

# (GPULAB_SYSTEM_PACKAGES: another list, for the tests of this script)
list=${GPULAB_SYSTEM_PACKAGES:-system-packages.txt}
[ -r "$list" ] || { echo "deps: cannot read the package list $list" >&2; exit 1; }
mapfile -t wanted < <(sed -e 's/#.*//' "$list" | tr -s ' \t' '\n' | sed '/^$/d')
missing=()
for pkg in "${wanted[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

line="apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" != 0 ]; then
  echo "deps: skipped: installing system packages needs root. As root, run:"
  echo "  $line"
  echo "deps: until then, make demo runs only the API stages and the tests that need the lab's hosts are skipped"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "deps: this machine has no apt-get; install these packages (or their equivalents): ${missing[*]}" >&2
  exit 1
fi

echo "deps: installing ${missing[*]}"
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\n# written by gpulab make deps while it installs packages\nexit 101\n' > "$policy"
  chmod 755 "$policy"
  trap 'rm -f "$policy"' EXIT
fi
export DEBIAN_FRONTEND=noninteractive
apt_opts=(-q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
if ! apt-get "${apt_opts[@]}" update >/tmp/gpulab-deps-apt.log 2>&1 \
  || ! apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}" >>/tmp/gpulab-deps-apt.log 2>&1; then
  tail -n 5 /tmp/gpulab-deps-apt.log >&2
  echo "deps: apt could not install ${missing[*]} (is a Debian package registry reachable? full log:" \
    "/tmp/gpulab-deps-apt.log). Install them and run make again: $line" >&2
  exit 1
fi

# Services these packages enable at the machine's boot: the lab starts its own, the machine needs none.
units=()
for pkg in "${missing[@]}"; do
  case "$pkg" in
    openssh-server) units+=(ssh.service ssh.socket) ;;
    kea-dhcp4-server) units+=(kea-dhcp4-server.service) ;;
    kea-ctrl-agent) units+=(kea-ctrl-agent.service) ;;
  esac
done
if [ ${#units[@]} -gt 0 ] && command -v systemctl >/dev/null; then
  systemctl disable --quiet "${units[@]}" 2>/dev/null || true
fi
echo "deps: installed ${missing[*]}"
