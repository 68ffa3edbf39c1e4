#!/usr/bin/env bash
# scripts/bench.sh hostile: peak memory of install/update on a hostile archive; server memory under slow heads
# Sourced by scripts/bench.sh after scripts/bench/common.sh; run alone, it hands itself
# to scripts/bench.sh hostile.
# shellcheck disable=SC2154,SC2034 # the globals (work, bin, server_bin, ...) are common.sh's
[[ ${BASH_SOURCE[0]} != "$0" ]] || exec "$(dirname "$0")/../bench.sh" hostile "$@"

# peak_kib CMD...: runs CMD and prints its peak resident memory in KiB (GNU time).
peak_kib() {
    /usr/bin/time -f '%M' -o "$work/time.out" "$@" >/dev/null 2>&1 || true
    tail -1 "$work/time.out"
}

# hostile_tarball FILE MIB: a .tar.gz whose first entry is a GNU long name of MIB MiB.
hostile_tarball() {
    python3 - "$1" "$2" <<'PY'
import gzip, sys
path, mib = sys.argv[1], int(sys.argv[2])
size = mib << 20
def header(name, kind, size):
    h = bytearray(512)
    h[0:len(name)] = name.encode()
    h[100:108] = b"0000755\0"
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = ("%011o\0" % size).encode()
    h[136:148] = b"00000000000\0"
    h[156:157] = kind
    h[257:265] = b"ustar  \0"
    h[148:156] = b" " * 8
    h[148:156] = ("%06o\0 " % sum(h)).encode()
    return bytes(h)
with gzip.open(path, "wb", compresslevel=1) as gz:
    gz.write(header("././@LongLink", b"L", size))
    chunk = b"a" * (1 << 20)
    for _ in range(mib):
        gz.write(chunk)
    gz.write(header("agent/x", b"0", 0))
    gz.write(b"\0" * 1024)
PY
}

# wrap_bundle OUT VERSION TARBALL KEY: a bundle of VERSION around TARBALL (stub in front,
# then a zip), signed with the minisign KEY so that --trust-key lets it through.
wrap_bundle() {
    local out=$1 version=$2 tarball=$3 key=$4
    mkdir -p "$out"
    local bundle=$out/agent-bundle-$version
    printf 'agent.latest.version=%s\nagent.latest.build-number=1\nagent.latest.platform=x86_64-unknown-linux-gnu\n' "$version" >"$out/props"
    cp "$bin/agent-bundle" "$bundle"
    python3 - "$bundle" "$version" "$out/props" "$tarball" <<'PY'
import sys, zipfile
bundle, version, props, tarball = sys.argv[1:5]
with open(bundle, "ab") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
    z.write(props, "agent-update-version.properties")
    z.write(tarball, "agent-%s.tar.gz" % version)
    z.writestr("README.txt", "hostile\n")
    z.writestr("LICENSE", "none\n")
PY
    chmod 755 "$bundle"
    local sha
    sha=$(sha256sum "$bundle" | cut -d' ' -f1)
    minisign -S -s "$key" -m "$bundle" -x "$bundle.minisig" \
        -t "version=$version build=1 platform=x86_64-unknown-linux-gnu sha256=$sha signed-at=$(date +%s)" >/dev/null
    echo "$bundle"
}

bench_hostile() {
    echo "hostile: peak memory on hostile archives, server memory under slow clients" >&2
    use_variant ours
    # A minisign key (-W: no password) that agent-bundle pack also reads.
    [[ -f $work/mkeys/k.key ]] || { mkdir -p "$work/mkeys" && minisign -G -W -p "$work/mkeys/k.pub" -s "$work/mkeys/k.key" >/dev/null; }
    local key=$work/mkeys/k.key pub=$work/mkeys/k.pub mib=256
    make_dist "$work/hd" "$mib" 0
    "$bin/agent-bundle" pack --dist "$work/hd" --version 2.0.0 --build 1 --key "$key" --out "$work/hnormal" >/dev/null
    local normal=$work/hnormal/agent-bundle-2.0.0
    hostile_tarball "$work/hostile.tar.gz" "$mib"
    local hostile
    hostile=$(wrap_bundle "$work/hhostile" 2.0.0 "$work/hostile.tar.gz" "$key")
    make_dist "$work/hd0" 0
    "$bin/agent-bundle" pack --dist "$work/hd0" --version 1.0.0 --build 1 --key "$key" --out "$work/hbase" >/dev/null
    local i p
    for i in 1 2 3; do
        rm -rf "$work/hi-n" "$work/hi-h"
        peak_kib "$normal" --install="$work/hi-n" --trust-key "$pub" >>"$work/install-normal"
        peak_kib "$hostile" --install="$work/hi-h" --trust-key "$pub" >>"$work/install-hostile"
        # The updater: a manual --update of an installed 1.0.0 (which it does not start).
        for p in n h; do
            rm -rf "$work/hu-$p"
            "$work/hbase/agent-bundle-1.0.0" --install="$work/hu-$p" --trust-key "$pub" >/dev/null
            printf 'export AGENT_UPDATE_STABILITY_WINDOW=1s\nexport AGENT_UPDATE_HEALTH_TIMEOUT=20s\n' >"$work/hu-$p/agent/conf/agent-env.sh"
            printf '[server]\nurls = ["http://127.0.0.1:1"]\n' >"$work/hu-$p/agent/conf/agent.toml"
        done
        peak_kib env AGENT_UPDATE_STABILITY_WINDOW=1s "$normal" --update="$work/hu-n/agent" >>"$work/update-normal"
        peak_kib "$hostile" --update="$work/hu-h/agent" >>"$work/update-hostile"
        stop_home "$work/hu-n/agent"
        note "round $i: install $(tail -1 "$work/install-normal") vs $(tail -1 "$work/install-hostile") KiB, update $(tail -1 "$work/update-normal") vs $(tail -1 "$work/update-hostile") KiB"
    done
    kib() { awk '{ print $1 / 1024 }' "$1" | spread_as %.1f " MiB"; }

    # The server under 300 clients each sending a 400 KB head slowly, against idle.
    local home=$work/hserver port
    mkdir -p "$home/downloads/agent"
    cp "$work/hbase/agent-bundle-1.0.0" "$work/hbase/agent-bundle-1.0.0.minisig" "$home/downloads/agent/"
    port=$(free_port)
    start_server "$home" "$port" RUST_LOG=warn
    sleep 2
    local idle
    idle=$(awk '/RssAnon/ { print $2 }' "/proc/$server_pid/status")
    sample_anon "$server_pid" "$work/slow-peak" &
    local sampler=$!
    python3 - "$port" <<'PY'
import socket, sys, time
port = int(sys.argv[1])
clients = []
for _ in range(300):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /agentupdate/version HTTP/1.1\r\nHost: x\r\n")
    clients.append(s)
line = b"X-Pad: " + b"a" * 1014 + b"\r\n"
open_ = list(clients)
for _ in range(400):
    still = []
    for s in open_:
        try:
            s.sendall(line)
            still.append(s)
        except OSError:
            pass
    open_ = still
    if not open_:
        break
    time.sleep(0.01)
PY
    sleep 1
    kill "$sampler" 2>/dev/null || true
    local slow
    slow=$(cat "$work/slow-peak")
    note "server anonymous memory: idle $idle KiB, peak under slow heads $slow KiB"
    write_section hostile <<EOF2
## Hostile input: memory

\`scripts/bench.sh hostile\` on $(machine). Peak resident memory (GNU \`time\`), median
(min–max) of 3 rounds, alternating: \`--install\` and a manual \`--update\` of a normal
bundle whose distribution is $mib MiB, against a signed bundle whose tarball opens with a
GNU long-name header of $mib MiB (the largest hostile case; the tar crate alone would read
it whole). The hostile bundle is refused at its header; the normal one is installed.

| | normal ($mib MiB distribution) | hostile ($mib MiB long name) |
|---|---|---|
| \`--install\` | $(kib "$work/install-normal") | $(kib "$work/install-hostile") |
| \`--update\` (the updater) | $(kib "$work/update-normal") | $(kib "$work/update-hostile") |

The server's anonymous memory (heap and stacks) while 300 clients each send a 400 KB
request head a kilobyte at a time (each is cut off with \`431\` at 16 KiB), against the same
server idle: **$(awk -v k="$idle" 'BEGIN { printf "%.1f MiB", k / 1024 }')** idle, **$(awk -v k="$slow" 'BEGIN { printf "%.1f MiB", k / 1024 }')** at the peak (target < 64 MiB).
EOF2
}
