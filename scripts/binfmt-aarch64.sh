#!/usr/bin/env bash
# Lets this x86_64 machine run aarch64 executables: registers qemu-user-static's
# qemu-aarch64 with the kernel's binfmt_misc, so that an aarch64 ELF started by anyone
# (a test, the agent starting its updater) runs under qemu. Idempotent; needs root the
# first time. A glibc aarch64 binary also needs QEMU_LD_PREFIX=/usr/aarch64-linux-gnu
# (libc6-arm64-cross); the tests set it for what they start.
# usage: scripts/binfmt-aarch64.sh
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    echo "usage: $0   (registers qemu-aarch64 with binfmt_misc; run as root)"
    exit 0
fi

dir=/proc/sys/fs/binfmt_misc
# Debian's qemu-user-static ships the registration line (flag F: the kernel opens qemu
# once, at registration, so it also runs in chroots that have no qemu).
conf=/usr/lib/binfmt.d/qemu-aarch64.conf

fail() {
    echo "binfmt-aarch64.sh: $*" >&2
    exit 1
}

if [[ -e $dir/qemu-aarch64 ]]; then
    grep -qx enabled "$dir/qemu-aarch64" ||
        fail "qemu-aarch64 is registered with binfmt_misc but disabled; enable it as root: echo 1 > $dir/qemu-aarch64"
    exit 0
fi
[[ -f $conf ]] || fail "$conf is missing: install qemu-user-static (apt-get install qemu-user-static)"
if [[ $(id -u) -ne 0 ]]; then
    fail "aarch64 binaries cannot run here: qemu-aarch64 is not registered with binfmt_misc, and registering it needs root. As root: mount -t binfmt_misc binfmt_misc $dir (if $dir/register is missing), then cat $conf > $dir/register"
fi
if [[ ! -e $dir/register ]]; then
    mount -t binfmt_misc binfmt_misc "$dir" ||
        fail "cannot mount binfmt_misc on $dir (a container without the right to: run the tests on a machine or VM, or register qemu-aarch64 on the host)"
fi
# The kernel takes one registration per write.
cat "$conf" >"$dir/register" ||
    fail "the kernel refused the qemu-aarch64 registration from $conf (see dmesg)"
[[ -e $dir/qemu-aarch64 ]] || fail "qemu-aarch64 was written to $dir/register but is not registered"
echo "binfmt-aarch64.sh: registered qemu-aarch64 with binfmt_misc" >&2
