#!/usr/bin/env bash
# Runs the benchmarks with their baselines side by side and prints ratios. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
# As installed (README, "Install"): the static client and agent, dynocap-core. The benches copy
# the three into target/bench-install and run them from there.
cargo build --release --locked -p dynocap
cargo build --release --locked --target x86_64-unknown-linux-musl -p dynocap-client -p dynocap-agent
export DYNOCAP_AGENT="$PWD/target/bench-install/dynocap-agent"
cargo bench --locked -p dynocap-e2e --bench sandbox
cargo bench --locked -p dynocap-e2e --bench tasks
cargo bench --locked -p dynocap-e2e --bench load
cargo bench --locked -p dynocap-e2e --bench network
cargo bench --locked -p dynocap-e2e --bench caches
# Under TCG unless DYNOCAP_VM_ACCEL says otherwise (see tests/benches/vm.rs).
cargo bench --locked -p dynocap-e2e --bench vm
