#!/usr/bin/env bash
# Installs what DynoCap needs to build and test on Debian/Ubuntu: system packages from apt
# (only those missing) and a Rust toolchain when cargo is absent. Safe to run repeatedly.
set -euo pipefail

packages=(
    build-essential pkg-config  # the C toolchain the bundled SQLite needs
    git                         # tasks import and diff projects with git
    sqlite3                     # tests inspect the catalog
    procps util-linux perl      # used inside sandboxes by the tests (ps, unshare, perl)
    e2fsprogs                   # mkfs.ext4: every sandbox's disk is an ext4 image
    xfsprogs                    # mkfs.xfs: the jail fork tests' XFS homes (reflink clones)
    iproute2                    # network namespaces for test hosts
    bubblewrap                  # the benchmark's baseline
    ca-certificates
    python3 python3-venv        # the MCP tests' client: the official Python SDK, in a venv
    openssh-client              # ssh-keygen: real keys for the MCP sshKeyPath tests
    passt                       # pasta: user-mode networking for network "nat"
    mmdebstrap                  # dynocap image build debian (and the image tests)
    busybox-static              # the image import tests' tiny rootfs (a static busybox)
    openssh-server openssl      # network tests: an sshd serving git, a test CA
    curl wget netcat-openbsd iputils-ping python3-pip  # run inside guests by the network tests (host /usr)
    docker-registry apache2-utils  # image pull tests: a real OCI registry on loopback, basic auth (htpasswd)
    skopeo umoci                # image tests build OCI images, and the pull benchmark's baseline
    chromium                    # port forward tests: a real browser loads a page the sandbox serves
)
# The MCP Inspector CLI (MCP tests) is installed with npm; keep a Node.js that is already there
# (e.g. from NodeSource), else Debian's. The Inspector's own Node comes from npm, see below.
command -v npm >/dev/null 2>&1 || packages+=(npm)

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

# The vm backend: QEMU and qemu-img (qemu-utils). Both must come from the same QEMU release
# (qemu-utils Breaks older qemu-system-common); a machine image that carries a newer
# qemu-utils from backports than the distribution's qemu-system-x86 would otherwise refuse to
# install, or silently remove qemu-img. So both are installed at qemu-system-x86's version.
if ! dpkg-query -W -f='${Status}' qemu-system-x86 2>/dev/null | grep -q "install ok installed"; then
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    qemu_version=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/{print $2}')
    echo "install-deps: installing qemu-system-x86 and qemu-utils $qemu_version (vm backend)" >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends --allow-downgrades \
        "qemu-system-x86=$qemu_version" "qemu-utils=$qemu_version"
fi

if ! command -v cargo >/dev/null 2>&1; then
    [[ -x "$HOME/.cargo/bin/cargo" ]] || {
        echo "install-deps: installing the Rust toolchain with rustup" >&2
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    }
fi

# The guest agent is a static binary (musl), so it runs in any guest image whatever its libc.
export PATH="$HOME/.cargo/bin:$PATH"
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
    echo "install-deps: adding the Rust target x86_64-unknown-linux-musl (static guest agent)" >&2
    rustup target add x86_64-unknown-linux-musl
fi

# rustfmt and clippy, which scripts/lint.sh runs (a minimal rustup profile has neither).
if command -v rustup >/dev/null 2>&1; then
    for component in rustfmt clippy; do
        if ! rustup component list --installed | grep -q "^$component"; then
            echo "install-deps: adding the Rust component $component (scripts/lint.sh)" >&2
            rustup component add "$component"
        fi
    done
fi

# cargo-deny, pinned: scripts/lint.sh checks the dependency tree against deny.toml with it.
# Built from source when missing or another version (about four minutes on two cores).
cargo_deny_version=0.20.2
if [[ "$(cargo deny --version 2>/dev/null)" != "cargo-deny $cargo_deny_version" ]]; then
    echo "install-deps: installing cargo-deny $cargo_deny_version (dependency checks)" >&2
    cargo install cargo-deny --locked --version "$cargo_deny_version"
fi

# The MCP tests' clients, pinned: the Python SDK in target/mcp-venv (tests/mcp/requirements.txt)
# and the MCP Inspector in tests/mcp/node_modules (tests/mcp/package-lock.json, which also brings
# the Node.js >= 22.19 it needs). Reinstalled only when the pins change.
repo="$(cd "$(dirname "$0")/.." && pwd)"
python=/usr/bin/python3
[[ -x $python ]] || python="$(command -v python3)"
venv="$repo/target/mcp-venv"
want="$(sha256sum "$repo/tests/mcp/requirements.txt" | cut -d' ' -f1)"
if [[ ! -x $venv/bin/python || "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]]; then
    echo "install-deps: installing the MCP test client (Python SDK) into $venv" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$repo/tests/mcp/requirements.txt"
    echo "$want" >"$venv/.requirements.sha256"
fi
want="$(sha256sum "$repo/tests/mcp/package-lock.json" | cut -d' ' -f1)"
if [[ "$(cat "$repo/tests/mcp/node_modules/.lock.sha256" 2>/dev/null)" != "$want" ]]; then
    echo "install-deps: installing the MCP Inspector into tests/mcp/node_modules" >&2
    # `npm install --no-save` follows the lock file and never rewrites it. Not `npm ci`: one of
    # the Inspector's transitive optional dependencies (Windows-only) is not on the registry,
    # which `npm ci` takes for an out-of-sync lock file.
    (cd "$repo/tests/mcp" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$want" >"$repo/tests/mcp/node_modules/.lock.sha256"
fi
