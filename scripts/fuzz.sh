#!/usr/bin/env bash
# Fuzzes the agent protocol decoder (crates/proto/fuzz) for SECONDS (default 60).
set -euo pipefail
cd "$(dirname "$0")/../crates/proto"
command -v cargo-fuzz >/dev/null 2>&1 || cargo install --locked cargo-fuzz
cargo +nightly fuzz run decode -- -max_total_time="${1:-60}" -rss_limit_mb=2048
