#!/usr/bin/env bash
# Builds DynoCap and shows it working: boots a sandbox, runs commands in it (including proof
# that it is isolated), and destroys it. Needs root for the jail backend's uid mapping.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

cargo build --release --locked -p dynocap -p dynocap-agent
dynocap=target/release/dynocap
export DYNOCAP_HOME="${DYNOCAP_HOME:-$(mktemp -d /tmp/dynocap-demo.XXXXXX)}"

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

run "$dynocap" doctor || true
run "$dynocap" run demo --ttl 300 --memory-mb 512
run "$dynocap" exec demo -- 'echo "hello from $(hostname) as $(id -un)"; uname -sr'
run "$dynocap" exec demo -- 'ls -A /root /home; ps -e; cat /proc/self/uid_map'
run "$dynocap" exec demo -- 'unshare -U true || echo "new namespaces are refused"'
run "$dynocap" exec demo --tty -- 'printf "working 50%%\rworking 100%%\n"; stty size'
run "$dynocap" ps
run "$dynocap" destroy demo
run "$dynocap" ps
