#!/usr/bin/env bash
# Makes a minimal Debian with systemd (the install tests boot it with systemd-nspawn), once.
# usage: scripts/debian-root.sh DIR
# DIR is made only if missing: debootstrap fills DIR.tmp, which is renamed into place
# when it is whole, so an interrupted run leaves no half root behind. The mirror is the
# one apt already uses here (DEBIAN_MIRROR overrides it).
set -euo pipefail

if [[ $# -ne 1 || "$1" == "-h" || "$1" == "--help" ]]; then
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'
    [[ $# -eq 1 ]] && exit 0
    exit 2
fi
root=$1
if [[ -x "$root/usr/lib/systemd/systemd" || -x "$root/lib/systemd/systemd" ]]; then
    exit 0
fi

# The first http(s) URI of a "debian" repository in apt's sources (deb822 or one-line).
mirror=${DEBIAN_MIRROR:-}
if [[ -z "$mirror" ]]; then
    mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        sed -n 's/^URIs:[[:space:]]*\(https\{0,1\}:[^[:space:]]*\/debian\)\/\{0,1\}$/\1/p' | head -n 1)
fi
if [[ -z "$mirror" ]]; then
    mirror=$(sed -n 's/^deb[[:space:]]\{1,\}\(https\{0,1\}:[^[:space:]]*\/debian\)\/\{0,1\}[[:space:]].*/\1/p' /etc/apt/sources.list 2>/dev/null | head -n 1)
fi
mirror=${mirror:-http://deb.debian.org/debian}

tmp="$root.tmp"
rm -rf "$tmp"
mkdir -p "$(dirname "$root")"
echo "debian-root.sh: debootstrap bookworm from $mirror into $root (once)" >&2
debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,curl,ca-certificates \
    bookworm "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
    echo "debian-root.sh: debootstrap failed; the end of $tmp.log:" >&2
    tail -n 20 "$tmp.log" >&2
    rm -rf "$tmp"
    exit 1
}
rm -f "$tmp.log"
mv "$tmp" "$root"
