#!/usr/bin/env bash
# Installs what DynoCap needs to build and test on Debian/Ubuntu: system packages from apt
# (only those missing) and a Rust toolchain when cargo is absent. Safe to run repeatedly.
set -euo pipefail

packages=(
    build-essential pkg-config  # the C toolchain the bundled SQLite needs
    git                         # tasks import and diff projects with git
    sqlite3                     # tests inspect the catalog
    procps util-linux perl      # used inside sandboxes by the tests (ps, unshare, perl)
    iproute2                    # network namespaces for test hosts
    bubblewrap                  # the benchmark's baseline
    ca-certificates
)

missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    echo "install-deps: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
    [[ -x "$HOME/.cargo/bin/cargo" ]] || {
        echo "install-deps: installing the Rust toolchain with rustup" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    }
fi
