#!/usr/bin/env bash
# Builds release binaries, assembles the reference agent distribution and packs it into
# a signed bundle.
# usage: scripts/build-dist.sh [--version V] [--build N] [--key FILE] [--out DIR] [--target T]...
#   --version  agent version (default: the workspace version)
#   --build    build number (default: the number of commits, or 1)
#   --key      secret signing key (default: a throw-away dev key in $AGENT_DEV_KEYS, default
#              dev-keys/, made on first use)
#   --out      where agent-bundle-V and its .minisig go (default: dist/bundle)
#   --server-url URL  the server the packed agent talks to by default (server.urls)
#   --target T  (repeatable) build, assemble and pack for the Rust target T, as
#              agent-bundle-V-T (e.g. x86_64-unknown-linux-musl: static, any x86_64 Linux;
#              x86_64-pc-windows-gnu: agent-bundle-V-T.exe, the agent as a Windows
#              service); without it, one agent-bundle-V for this machine
# AGENT_BIN_DIR=DIR uses binaries already built there instead of a release build.
# AGENT_DIST_ROOT=DIR assembles under DIR instead of dist/ (DIR/agent-V, DIR/bundle).
set -euo pipefail

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
build=$(git rev-list --count HEAD 2>/dev/null || echo 1)
key=""
root=${AGENT_DIST_ROOT:-dist}
out="$root/bundle"
server_url=""
targets=()
while (($#)); do
    case "$1" in
    --version) version=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --key) key=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --server-url) server_url=$2; shift 2 ;;
    --target) targets+=("$2"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-dist.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -n "${AGENT_BIN_DIR:-}" ]]; then
    bin=$AGENT_BIN_DIR
else
    cargo build --release --locked --bins >&2
    bin=target/release
fi

if [[ -z "$key" ]]; then
    keys=${AGENT_DEV_KEYS:-dev-keys}
    key=$keys/update.key
    if [[ ! -f "$key" ]]; then
        "$bin/agent-bundle" keygen --out "$keys" >&2
        cat >&2 <<'NOTE'
************************************************************************
*  Made a THROW-AWAY DEVELOPMENT KEY (dev-keys/ is git-ignored).      *
*  It is NOT for production: make an offline key with                  *
*  `agent-bundle keygen --out /secure/place` and pass --key.           *
************************************************************************
NOTE
    fi
fi

# assemble DIST AGENT_BINARY [WINDOWS_BIN_DIR]: the distribution directory of one
# platform: the agent, and agent-service built beside it (the supervisor the wrapper
# runs). With WINDOWS_BIN_DIR, a Windows one: agent.exe, and agent-service.exe (the
# service, which plays the wrapper's part there) and agent-bundle.exe beside it.
assemble() {
    local dist=$1 agent=$2 windows=${3:-}
    rm -rf "$dist"
    mkdir -p "$dist/bin" "$dist/conf.default"
    if [[ -n "$windows" ]]; then
        cp "$agent" "$dist/bin/agent.exe"
        cp "$windows/agent-service.exe" "$windows/agent-bundle.exe" "$dist/bin/"
    else
        cp "$agent" "$dist/bin/agent"
        cp "$(dirname "$agent")/agent-service" "$dist/bin/agent-service"
        cp installer/agent-wrapper.sh "$dist/bin/agent-wrapper.sh"
    fi
    cp installer/agent.toml "$dist/conf.default/agent.toml"
    if [[ -n "$server_url" ]]; then
        sed -i "s|^urls = .*|urls = [\"$server_url\"]|" "$dist/conf.default/agent.toml"
    fi
    # The public half of the signing key: what a fresh install trusts by default.
    local pub="${key%.key}.pub"
    if [[ -f "$pub" ]]; then
        cp "$pub" "$dist/conf.default/update.pub"
    fi
    # What `--help` shows above the options: each system's own paths and commands.
    if [[ -n "$windows" ]]; then
        cp installer/windows/README.txt "$dist/README.txt"
    else
        cp installer/README.txt "$dist/README.txt"
    fi
    cp LICENSE "$dist/LICENSE"
}

if ((${#targets[@]} == 0)); then
    dist=$root/agent-$version
    assemble "$dist" "$bin/agent"
    "$bin/agent-bundle" pack --dist "$dist" --version "$version" --build "$build" --key "$key" --out "$out" >&2
    echo "$out/agent-bundle-$version"
    exit 0
fi

# Each target's bundle is its own platform's executable: its stub is agent-bundle built
# for that target, and its properties and signature name the target. ring has C code,
# so each target needs a C compiler for it (docs/releases.md, "Keys and signing").
for target in "${targets[@]}"; do
    case "$target" in
    x86_64-unknown-linux-musl) export CC_x86_64_unknown_linux_musl=${CC_x86_64_unknown_linux_musl:-musl-gcc} ;;
    aarch64-unknown-linux-musl)
        export CC_aarch64_unknown_linux_musl=${CC_aarch64_unknown_linux_musl:-aarch64-linux-gnu-gcc}
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER:-aarch64-linux-gnu-gcc}
        ;;
    aarch64-unknown-linux-gnu)
        export CC_aarch64_unknown_linux_gnu=${CC_aarch64_unknown_linux_gnu:-aarch64-linux-gnu-gcc}
        export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}
        ;;
    x86_64-pc-windows-gnu)
        export CC_x86_64_pc_windows_gnu=${CC_x86_64_pc_windows_gnu:-x86_64-w64-mingw32-gcc}
        export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=${CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER:-x86_64-w64-mingw32-gcc}
        ;;
    esac
    # Windows runs programs by their extension, and its agent runs as a service.
    exe="" packages=(-p agent -p agent-bundle -p agent-service) windows=""
    if [[ "$target" == *-windows-* ]]; then
        exe=".exe"
        windows=target/$target/release
    fi
    cargo build --release --locked --target "$target" "${packages[@]}" >&2
    tbin=target/$target/release
    dist=$root/agent-$version-$target
    assemble "$dist" "$tbin/agent$exe" "$windows"
    staging=$out/.pack-$target
    rm -rf "$staging"
    "$bin/agent-bundle" pack --dist "$dist" --version "$version" --build "$build" --key "$key" \
        --out "$staging" --stub "$tbin/agent-bundle$exe" --platform "$target" >&2
    mv "$staging/agent-bundle-$version" "$out/agent-bundle-$version-$target$exe"
    mv "$staging/agent-bundle-$version.minisig" "$out/agent-bundle-$version-$target$exe.minisig"
    rmdir "$staging"
    echo "$out/agent-bundle-$version-$target$exe"
done
