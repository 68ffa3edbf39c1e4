#!/usr/bin/env bash
# Runs the whole test suite: unit, handler and end-to-end tests.
# usage: scripts/test.sh [extra nextest/cargo test arguments]
set -euo pipefail

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    echo "usage: $0 [test filter or runner arguments]"
    exit 0
fi
cd "$(dirname "$0")/.."

# The end-to-end tests use the real tools the interface promises, a real PostgreSQL
# server (the tests make throw-away clusters with its initdb), and a real headless
# Chromium driven through chromedriver (the fleet page).
have_postgres() { compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && command -v psql >/dev/null 2>&1; }
missing=()
# prometheus-node-exporter is the real workload the workload tests pack into bundles.
for tool in minisign unzip wget curl openssl prometheus-node-exporter; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
have_postgres || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
# The OpAMP tests: node and npm for the npm client, python3 -m venv for the PyPI one.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing+=(python3-venv)
# The install tests: a Debian root booted with its own systemd, a busybox-only root, the
# static musl agent (musl-gcc for ring's C code), and the script's own checks.
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
command -v systemd-nspawn >/dev/null 2>&1 || missing+=(systemd-container)
# (ldd refuses a static executable: the busybox root has no libc to load.)
if [[ ! -x /bin/busybox ]] || ldd /bin/busybox >/dev/null 2>&1; then missing+=(busybox-static); fi
command -v dash >/dev/null 2>&1 || missing+=(dash)
command -v musl-gcc >/dev/null 2>&1 || missing+=(musl-tools)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
# The platform tests run a real aarch64 agent: cross-built with Debian's aarch64 gcc (the
# linker, and the C compiler for ring; it brings libc6-arm64-cross, the sysroot a glibc
# aarch64 binary loads under qemu) and run by qemu-user-static through binfmt_misc.
command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
[[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ]] || missing+=(libc6-arm64-cross)
command -v qemu-aarch64-static >/dev/null 2>&1 || missing+=(qemu-user-static)
# The networks tests: Debian's squid as the agents' proxy (its basic_ncsa_auth for the
# user and password), nginx as a download source. Both live in /usr/sbin.
PATH=$PATH:/usr/sbin command -v squid >/dev/null 2>&1 || missing+=(squid)
PATH=$PATH:/usr/sbin command -v nginx >/dev/null 2>&1 || missing+=(nginx)
# The Windows tests: the agent cross-built with mingw (the linker, and the C compiler for
# ring) and run as a Windows service under Debian's 64-bit Wine.
command -v x86_64-w64-mingw32-gcc >/dev/null 2>&1 || missing+=(gcc-mingw-w64-x86-64)
[[ -x /usr/lib/wine/wine64 ]] || missing+=(wine64)
# The Windows installer and its signatures: Debian's wixl builds the MSI (its own
# package, not msitools), osslsigncode signs and verifies Authenticode offline.
command -v wixl >/dev/null 2>&1 || missing+=(wixl)
command -v osslsigncode >/dev/null 2>&1 || missing+=(osslsigncode)
# The alert rules shipped for the server's metrics: promtool checks and unit-tests them.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ((${#missing[@]})); then
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: installing ${missing[*]}" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        # The packages start Debian's node exporter (:9100) and Prometheus (:9090) where
        # systemd runs; the tests run their own exporters on free ports and need neither.
        for unit in prometheus-node-exporter prometheus; do
            if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
                systemctl disable --now "$unit" >/dev/null 2>&1 || true
            fi
        done
    else
        echo "test.sh: missing ${missing[*]}; install them (sudo apt-get install ${missing[*]}) and run again" >&2
        exit 1
    fi
fi

# Made once under target/ and reused, while the builds below compile (they wait on the
# network, the builds on the processor); the tests wait for them. The OpAMP tests run
# the two registry OpAMP clients (crates/opamp/tests/clients): a Python virtual
# environment and an npm directory. The install tests boot a Debian root.
mkdir -p target
# A run that ends early (a failure, ^C) leaves none of the setups and builds below behind.
stop_background() {
    local job
    for job in $(jobs -p); do
        pkill -TERM -P "$job" 2>/dev/null || true
        kill "$job" 2>/dev/null || true
    done
}
trap stop_background EXIT
scripts/opamp-clients.sh target/opamp-clients >target/opamp-clients.log 2>&1 &
clients=$!
scripts/debian-root.sh target/debian-systemd-root >target/debian-root.log 2>&1 &
debian=$!
# made PID WHAT LOG: waits for a setup started above; its log and exit if it failed.
made() {
    if ! wait "$1"; then
        echo "test.sh: making $2 failed; the end of $3:" >&2
        tail -n 20 "$3" >&2
        exit 1
    fi
}
export OPAMP_PYTHON="$PWD/target/opamp-clients/venv/bin/python"
export OPAMP_NODE_MODULES="$PWD/target/opamp-clients/npm/node_modules"

# The end-to-end tests spawn the built binaries; the crash tests also need a stub with
# the updater's fault points compiled in, kept apart so no other binary has them. It is
# built in the same target directory, which shares the dependencies (a directory of its
# own compiled them all again), and copied out before the plain build puts the plain
# stub back (cargo links a binary out again when its features switch back). It is built
# as a binary of the whole workspace, not of its package alone: features are unified
# over the packages named, and with the stub's package alone some forty dependencies
# came out with other features and were compiled twice.
# The delta tests pack a second build of the agent, one small change apart, as the next
# release: the same source with AGENT_BUILD_NOTE compiled in (`agent --version` shows it).
# Built as the whole workspace (the same features as below), so the build below puts
# the plain agent back and the two differ by that note alone.
target_dir=${CARGO_TARGET_DIR:-target}
cargo build --workspace --bin agent-bundle --features agent-bundle/failpoints --locked
install -D "$target_dir/debug/agent-bundle" "$target_dir/failpoints/debug/agent-bundle"
AGENT_BUILD_NOTE=rebuilt cargo build --workspace --bins --locked
install -D "$target_dir/debug/agent" "$target_dir/rebuilt/agent"
cargo build --workspace --bins --locked

# The other platforms' agents, for the install, platform and Windows tests alone
# (scripts/build-cross.sh): built while the other tests run, at the lowest priority (so
# they take only the processor the tests leave idle; CI builds them before, beside the
# host's build, and this finds them done). The tests make their Wine prefix once under
# target/wine.
(
    renice -n 19 -p "$BASHPID" >/dev/null
    scripts/build-cross.sh
) >"$target_dir/cross-build.log" 2>&1 &
cross_build=$!
scripts/binfmt-aarch64.sh
made "$clients" "the OpAMP clients" target/opamp-clients.log
# The tests of the other platforms (and the Debian root's install tests) run last, once
# their builds are done.
other_platforms='package(e2e) and test(/^(windows::|platforms::|install::|planned_stop::windows_)/)'
all_made() {
    if kill -0 "$cross_build" 2>/dev/null; then
        echo "test.sh: waiting for the other platforms' agents to build ($target_dir/cross-build.log)" >&2
    fi
    made "$cross_build" "the other platforms' agents" "$target_dir/cross-build.log"
    made "$debian" "the Debian root" target/debian-root.log
    echo "test.sh: the other platforms' agents and the Debian root are ready at $SECONDS s" >&2
}
nextest() { cargo nextest run --workspace --locked --profile "${nextest_profile:-${NEXTEST_PROFILE:-default}}" "$@"; }
if ! cargo nextest --version >/dev/null 2>&1; then
    all_made
    cargo test --workspace --locked "$@"
elif (($#)); then
    all_made
    nextest "$@"
else
    # The other platforms' tests start as soon as their agents are built, beside the
    # rest rather than after it: most of those wait on Wine, qemu or a booting systemd,
    # and the rest's own waits (heartbeats, windows, full disks) leave a core idle. Each
    # group reports its own results (`<profile>-platforms`: the ci profile's junit.xml
    # is per group).
    failed=0
    echo "test.sh: host builds done at $SECONDS s" >&2
    nextest -E "not ($other_platforms)" &
    main=$!
    all_made
    nextest_profile=${NEXTEST_PROFILE:-default}-platforms nextest -E "$other_platforms" || failed=$?
    echo "test.sh: the other platforms' tests ended at $SECONDS s" >&2
    wait "$main" || failed=$?
    echo "test.sh: the rest ended at $SECONDS s" >&2
    exit "$failed"
fi
