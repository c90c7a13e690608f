#!/usr/bin/env bash
# Runs the whole DynoCap test suite: unit tests and the end-to-end tests that drive the real
# binaries. The end-to-end tests need root (namespaces mapped to a host uid range, cgroups).
set -euo pipefail
# The jail backend needs root; elevate once, keeping the caller's Rust toolchain on PATH.
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "$0: run this as root (sudo is not installed)" >&2; exit 1; }
    exec sudo --preserve-env=PATH,HOME,CARGO_HOME,RUSTUP_HOME,DYNOCAP_HOME,DYNOCAP_TEST_IMAGE_CACHE "$0" "$@"
fi
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

# Formatting, clippy and the dependency policy first: minutes, where the tests take many more.
scripts/lint.sh

cargo build --workspace --all-targets --locked
# The end-to-end tests boot guests with the static agent, as installs do; the MCP tests below
# keep finding the agent beside dynocap, the default lookup.
cargo build --locked --target x86_64-unknown-linux-musl -p dynocap-agent
DYNOCAP_AGENT="$PWD/target/x86_64-unknown-linux-musl/debug/dynocap-agent" \
    cargo test --workspace --locked --no-fail-fast -- --test-threads "${DYNOCAP_TEST_THREADS:-4}"

# MCP end-to-end tests: `dynocap mcp` driven by real MCP clients (the official Python SDK and
# the MCP Inspector CLI); see tests/mcp/README.md.
(cd tests/mcp && ../../target/mcp-venv/bin/python -m pytest -q)
