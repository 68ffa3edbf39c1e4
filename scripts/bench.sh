#!/usr/bin/env bash
# Benchmarks, each against a peer measured in the same run on the same machine.
# usage: scripts/bench.sh [SECTION...]     (default: bundle server)
#   bundle   pack / install / verify of a 100 MiB distribution vs tar czf / tar xzf / b2sum+sha256sum
#   server   download throughput and /version rate vs nginx (/healthz beside it); 2000
#            attempts at limit 45 (SERVER_ONLY=version: /version alone, printed)
#   agent    first 409 to updater spawned, 20 MiB and 100 MiB bundles (download vs verify)
#   update   downtime of an update and of a rollback (default timings) vs a wrapper restart
#   fleet    30 agents through a download limit of 5 with Retry-After 1
#   rollout  fleet-sim: connect latency with and without a rollout, wave times with a plan
#   hostile  peak memory of install/update on a hostile archive; server memory under slow heads
#   trust    HTTPS download and /version rate vs nginx with ssl on the same certificate;
#            the cost of token checks on connect at 1,000 agents vs the server before them
#   cloud    fleet-sim at 10,000 agents: one server on SQLite vs two on PostgreSQL, then
#            staged rollouts (1%, 10%, 100%) with 2 % and 10 % simulated failures
#   longpoll fleet-sim at 10,000 agents: a staged rollout with long polls vs heartbeats;
#            one server holding 20,000 long-polling agents (RSS, CPU, wave to told);
#            LONGPOLL_ONLY=rollout|held runs one part and prints it, BENCHMARKS.md untouched
#            (LONGPOLL_MODES="longpoll" then skips the heartbeat rounds)
#   workload the node exporter as a workload: its downtime in an update vs a plain restart
#            of the same program; the agent's CPU and RSS while it supervises
#   opamp    fleet-sim --protocol opamp at 10,000 agents over HTTP and WebSocket vs the
#            native protocol; a configuration push to APPLIED on 10,000 WebSocket agents
#   config   fleet-sim: a configuration set to 1,000 and 10,000 agents (APPLIED at the
#            server), heartbeats vs long polls; connect latency with a config rollout vs none
#   platforms bundle size for x86_64 and aarch64, glibc and static musl; the musl and the
#            glibc agent's RSS and update time; a 10,000-agent fleet-sim rollout of a
#            release of three platforms vs one (PLATFORMS_ONLY=size|update|fleet: one part,
#            printed, BENCHMARKS.md untouched)
#   delta    bytes of a delta vs the whole bundle for three kinds of release, beside bsdiff,
#            zstd --patch-from and xdelta3; time and memory to make and apply one
#   releases a real agent's `release rollback` to the version it kept vs its forward update
#            to a new release, alternating rounds (RELEASES_ROUNDS, RELEASES_MIB); then
#            RELEASES_AGENTS (10000) fleet-sim agents' rollback vs a forward rollout of the
#            same release (RELEASES_FLEET_ROUNDS)
#   networks an update over HTTPS through squid (CONNECT, basic auth) vs direct, alternating
#            rounds (NETWORKS_ROUNDS, NETWORKS_MIB); a fleet-sim rollout to NETWORKS_AGENTS
#            (10000): bundle bytes the server sent with an nginx download source vs without
#   maintenance fleet-sim at 10,000 agents (MAINTENANCE_AGENTS, MAINTENANCE_ROUNDS): a
#            rollout whose group's window opens a minute after the release vs no window:
#            bytes sent before the opening, opening (or release) to the last INSTALLED
#   scale    fleet-sim processes of up to 19,800 long-polling agents (SCALE_PER_PROC)
#            against SCALE_SERVERS servers on one PostgreSQL, SCALE_AGENTS in all
#            (99,000 on 5), waves 1%,10%,100% with deltas: registration, waves, errors,
#            latencies, server RSS and CPU while holding, PostgreSQL's CPU and connections;
#            SCALE_HTTP2=N shares N HTTP/2 connections a process (100,000: SCALE_AGENTS=100000
#            SCALE_PER_PROC=20000 SCALE_HTTP2=128); SCALE_ONLY=hold: CPU of SCALE_SERVERS (1)
#            servers holding SCALE_AGENTS (20,000) on HTTP/2, rounds alternating with
#            BENCH_BASELINE (SCALE_HOLD_ROUNDS, 3)
#            SCALE_DEPLOYMENTS=N: the agents in N groups, and once held N deployments
#            (group=dK, release 2.K.0) each converge to its own release: per deployment,
#            creation to the last INSTALLED, errors; servers alive (SCALE_PRINT_ONLY=1:
#            printed, BENCHMARKS.md untouched)
#   deployments fleet-sim: connect latency with 50 deployments vs default alone, at rest,
#            alternating rounds (DEPLOYMENTS_AGENTS 1000, DEPLOYMENTS_ROUNDS 3, DEPLOYMENTS_MANY 50)
#   windows  the Windows bundle beside the Linux one; the Windows agent's update as a
#            service under Wine vs the Linux agent's, alternating rounds (WINDOWS_ROUNDS);
#            the service's and agent's memory under Wine; msiexec /i of the release's MSI
#            vs the bundle's --install, to the agent registered (WINDOWS_MSI_ROUNDS)
#            (WINDOWS_ONLY=size|update|msi: one part, printed, BENCHMARKS.md untouched)
#   releasebounds what one server keeps on disk and its peak RSS for three releases of three
#            platforms (BOUNDS_MIB, 100 MiB distributions), each earlier one kept served by a
#            deployment, and the deltas between them, vs one platform and one release pair,
#            alternating rounds (BOUNDS_ROUNDS, 3); meant for BENCH_PROFILE=dev
# Each section rewrites its own block in BENCHMARKS.md; the others are left as they were.
# BENCH_PROFILE=dev: measure the dev build (target/debug, as the tests run it).
# BENCH_BASELINE=DIR: a checkout of an earlier commit with target/release built; update,
# fleet, longpoll's held agents and SCALE_ONLY=hold then measure it too, alternating.
# Needs: hyperfine, wrk, nginx, jq, minisign, python3, GNU time (installed with apt-get when
# missing and run as root).
set -euo pipefail

usage() { sed -n '2,70p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."
root=$(pwd)

sections=()
for arg in "$@"; do
    case "$arg" in
    bundle | server | agent | update | fleet | rollout | hostile | trust | cloud | longpoll | workload | opamp | config | platforms | delta | networks | maintenance | scale | releases | windows | deployments | releasebounds) sections+=("$arg") ;;
    all) sections+=(bundle server agent update fleet rollout hostile trust cloud longpoll workload opamp config platforms delta networks maintenance scale releases windows deployments releasebounds) ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown section $arg" >&2; usage >&2; exit 2 ;;
    esac
done
((${#sections[@]})) || sections=(bundle server)

# The shared setup and helpers, then one file per benchmark (scripts/bench/NAME.sh).
# shellcheck source=scripts/bench/common.sh
source scripts/bench/common.sh
for section in "${sections[@]}"; do
    # shellcheck source=/dev/null
    source "scripts/bench/$section.sh"
done

for section in "${sections[@]}"; do
    "bench_$section"
done
echo "wrote BENCHMARKS.md" >&2
