#!/usr/bin/env bash
# Builds the other platforms' agents the install, platform and Windows tests run.
# usage: scripts/build-cross.sh [--windows-tests]
#
# The static musl agent a busybox machine runs, the glibc aarch64 one (qemu runs it), and
# for Windows the stub with the updater's fault points (for the crash campaign, set aside
# in target/failpoints/) then the agent, its service and the stub. Debug builds, like the
# rest, in a target directory of their own (target/cross: cargo locks a target directory
# while it builds, and the host's builds would wait); cargo rebuilds only what changed.
# --windows-tests also compiles the Windows crates' tests for Windows, so that what lints
# the build (CI's clippy-driver) sees the test code Windows compiles.
set -euo pipefail
cd "$(dirname "$0")/.."

windows_tests=no
case "${1:-}" in
    "") ;;
    --windows-tests) windows_tests=yes ;;
    -h | --help)
        sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *)
        echo "build-cross.sh: unknown argument $1; usage: scripts/build-cross.sh [--windows-tests]" >&2
        exit 2
        ;;
esac

target_dir=${CARGO_TARGET_DIR:-target}
if command -v rustup >/dev/null 2>&1; then
    rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-gnu x86_64-pc-windows-gnu >/dev/null
fi
# Their dependencies are compiled unoptimised (half the compiling), but for those these
# agents spend their time in: hashes, signatures, compression and patches.
cross=(--target-dir "$target_dir/cross" --locked --config 'profile.dev.package."*".opt-level=0')
for hot in sha2 blake2 md-5 ed25519-dalek curve25519-dalek ring flate2 zlib-rs crc32fast zip \
    bzip2 libbz2-rs-sys qbsdiff suffix_array cdivsufsort sacabase; do
    cross+=(--config "profile.dev.package.$hot.opt-level=2")
done
windows=x86_64-pc-windows-gnu
# The stub with fault points is built naming the same packages as the build after it, so
# the two resolve the same features and share every dependency.
windows_packages=(-p agent -p agent-bundle -p agent-service)

CC_x86_64_unknown_linux_musl=musl-gcc \
    cargo build "${cross[@]}" --target x86_64-unknown-linux-musl -p agent -p agent-bundle -p agent-service
CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    cargo build "${cross[@]}" --target aarch64-unknown-linux-gnu -p agent -p agent-bundle -p agent-service
export CC_x86_64_pc_windows_gnu=x86_64-w64-mingw32-gcc CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
cargo build "${cross[@]}" --target "$windows" "${windows_packages[@]}" --bin agent-bundle --features agent-bundle/failpoints
# (set aside out of cargo's way: the build after it writes the same file)
install -D "$target_dir/cross/$windows/debug/agent-bundle.exe" "$target_dir/failpoints/$windows/debug/agent-bundle.exe"
cargo build "${cross[@]}" --target "$windows" "${windows_packages[@]}"
if [[ "$windows_tests" == yes ]]; then
    cargo build "${cross[@]}" --target "$windows" "${windows_packages[@]}" -p agent-workload -p agent-updater -p agent-extract \
        -p agent-protocol -p agent-delta --tests
fi
