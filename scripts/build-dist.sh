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
#              service, and agent-V-T.msi, its MSI, built with wixl, and its
#              .msi.minisig); without it, one
#              agent-bundle-V for this machine
#   --authenticode CERT.pfx  sign the Windows programs, bundle and MSI with this
#              code-signing certificate (osslsigncode); unsigned without it
#   --authenticode-password-file F  the .pfx's password, on the first line of F
# AGENT_BIN_DIR=DIR uses binaries already built there instead of a release build.
# AGENT_TARGET_BIN_DIR=DIR does so for each --target T: DIR/T/release, or DIR/T/PROFILE
# with AGENT_TARGET_PROFILE=PROFILE (the tests: target/cross and debug).
# AGENT_DIST_ROOT=DIR assembles under DIR instead of dist/ (DIR/agent-V, DIR/bundle).
set -euo pipefail

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
cd "$(dirname "$0")/.."
repo=$PWD

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
build=$(git rev-list --count HEAD 2>/dev/null || echo 1)
key=""
root=${AGENT_DIST_ROOT:-dist}
out="$root/bundle"
server_url=""
targets=()
authenticode=""
authenticode_password_file=""
while (($#)); do
    case "$1" in
    --version) version=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --key) key=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --server-url) server_url=$2; shift 2 ;;
    --target) targets+=("$2"); shift 2 ;;
    --authenticode) authenticode=$2; shift 2 ;;
    --authenticode-password-file) authenticode_password_file=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build-dist.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

if [[ -n "$authenticode" ]]; then
    command -v osslsigncode >/dev/null || { echo "build-dist.sh: --authenticode needs osslsigncode (apt-get install osslsigncode)" >&2; exit 1; }
    [[ -f "$authenticode" ]] || { echo "build-dist.sh: --authenticode $authenticode: no such file" >&2; exit 1; }
fi
if [[ -n "$authenticode_password_file" && -z "$authenticode" ]]; then
    echo "build-dist.sh: --authenticode-password-file goes with --authenticode CERT.pfx" >&2
    exit 2
fi

# Every release's MSI has it, never changed: a newer MSI replaces an older one.
msi_upgrade_code=6B0A3C55-2E1D-4F1C-9A43-7C9C2C0D6A11

# authenticode FILE: signs a Windows program or MSI in place (sha256, the certificate's
# chain from the .pfx), when --authenticode is given. The signature covers every byte
# before it, a bundle's payload included.
authenticode() {
    [[ -n "$authenticode" ]] || return 0
    local file=$1 pass=()
    if [[ -n "$authenticode_password_file" ]]; then
        pass=(-readpass "$authenticode_password_file")
    fi
    osslsigncode sign -pkcs12 "$authenticode" "${pass[@]}" -h sha256 -n "agent" \
        -in "$file" -out "$file.signed" >&2
    mv "$file.signed" "$file"
}

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

# assemble DIST AGENT_BINARY [WINDOWS]: the distribution directory of one platform: the
# agent, and agent-service built beside it (the supervisor the wrapper runs). With
# WINDOWS non-empty, a Windows one: agent.exe, and beside it agent-service.exe (the
# service, which plays the wrapper's part there), agent-bundle.exe and
# agent-launcher.exe (installed as <home>\bin\agent.exe), each signed when signing.
assemble() {
    local dist=$1 agent=$2 windows=${3:-}
    local bin_dir
    bin_dir=$(dirname "$agent")
    rm -rf "$dist"
    mkdir -p "$dist/bin" "$dist/conf.default"
    if [[ -n "$windows" ]]; then
        cp "$agent" "$dist/bin/agent.exe"
        cp "$bin_dir/agent-service.exe" "$bin_dir/agent-bundle.exe" "$bin_dir/agent-launcher.exe" "$dist/bin/"
        local program
        for program in "$dist"/bin/*.exe; do
            authenticode "$program"
        done
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
        windows=yes
    fi
    if [[ -n "${AGENT_TARGET_BIN_DIR:-}" ]]; then
        tbin=$AGENT_TARGET_BIN_DIR/$target/${AGENT_TARGET_PROFILE:-release}
    else
        cargo build --release --locked --target "$target" "${packages[@]}" >&2
        tbin=target/$target/release
    fi
    dist=$root/agent-$version-$target
    assemble "$dist" "$tbin/agent$exe" "$windows"
    staging=$out/.pack-$target
    rm -rf "$staging"
    mkdir -p "$staging"
    # The stub is the distribution's agent-bundle (signed there when signing).
    stub=$tbin/agent-bundle$exe
    if [[ -n "$windows" ]]; then
        stub=$dist/bin/agent-bundle.exe
    fi
    "$bin/agent-bundle" pack --dist "$dist" --version "$version" --build "$build" --key "$key" \
        --out "$staging" --stub "$stub" --platform "$target" >&2
    bundle=$out/agent-bundle-$version-$target$exe
    mv "$staging/agent-bundle-$version" "$bundle"
    mv "$staging/agent-bundle-$version.minisig" "$bundle.minisig"
    rmdir "$staging"
    echo "$bundle"
    if [[ -n "$windows" ]]; then
        # Signed with its payload appended (the bundle reads its payload up to the
        # signature), then signed again with the update key: agents check the final bytes.
        if [[ -n "$authenticode" ]]; then
            authenticode "$bundle"
            "$bin/agent-bundle" sign --key "$key" "$bundle" >&2
        fi
        # The MSI: the bundle and its signature, run by a deferred custom action. Its
        # version is the agent's without a pre-release (MSI versions are numbers).
        msi=$out/agent-$version-$target.msi
        # Its custom action (a DLL: what it runs says its words in the MSI log) is built
        # beside the bundle, as wixl takes a file's Source relative to where it runs.
        x86_64-w64-mingw32-gcc -shared -O2 -static-libgcc -o "$out/msi-action.dll" \
            installer/windows/msi-action.c -lmsi >&2
        authenticode "$out/msi-action.dll"
        (cd "$out" && wixl -a x64 -D "Version=${version%%[-+]*}" \
            -D "UpgradeCode=$msi_upgrade_code" -D "Bundle=$(basename "$bundle")" \
            -o "$(basename "$msi")" "$repo/installer/windows/agent.wxs") >&2
        rm -f "$out/msi-action.dll"
        authenticode "$msi"
        # Its .msi.minisig over the final bytes, for this build (the bundle beside it
        # names it): what `update-server release publish` takes it into a release with.
        "$bin/agent-bundle" sign --key "$key" "$msi" >&2
        echo "$msi"
    fi
done
