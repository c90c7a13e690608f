#!/usr/bin/env bash
# The static checks, which scripts/test.sh runs first so that a failure stops CI before the
# long tests: formatting (rustfmt), lints (clippy, warnings are errors), the engine's layering
# (scripts/layers.py: no module imports a layer above its own), the engine's configuration
# (scripts/env_reads.py: it reads no environment variable itself) and the dependency
# policy in deny.toml (cargo-deny: licenses, duplicate versions, sources, and advisories when
# RustSec's database can be fetched). Runnable alone; scripts/install-deps.sh installs
# cargo-deny.
#
# DYNOCAP_REQUIRE_ADVISORIES=1 makes a database that cannot be fetched a failure instead of a
# skipped check.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

step() { echo "lint: $*" >&2; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "scripts/layers.py (the engine's imports run only downward)"
python3 scripts/layers.py

step "scripts/import-cycles.py --max 4 (no crate has an import circle of more than 4 files)"
python3 scripts/import-cycles.py --max 4 >/dev/null

step "scripts/env_reads.py (the engine reads no environment: its Config comes from the binary)"
python3 scripts/env_reads.py

# The advisory database is a git repository on GitHub; a machine that cannot reach it can
# still check everything else, and says that it did not check advisories.
checks=(bans licenses sources)
if fetch_error="$(cargo deny --log-level error fetch db 2>&1)"; then
    checks+=(advisories)
elif [[ ${DYNOCAP_REQUIRE_ADVISORIES:-0} == 1 ]]; then
    step "cargo deny: cannot fetch the RustSec advisory database, which DYNOCAP_REQUIRE_ADVISORIES=1 requires:"
    echo "$fetch_error" >&2
    exit 1
else
    step "cargo deny: SKIPPING the advisories check: the RustSec advisory database could not be fetched from GitHub:"
    echo "$fetch_error" | sed 's/^/    /' >&2
    step "cargo deny: run 'cargo deny check advisories' where GitHub is reachable (vulnerable and yanked crates are NOT checked here)"
fi
step "cargo deny check ${checks[*]}"
# The duplicate-version warnings name their crates; `cargo deny check bans` shows who pulls
# each one in.
cargo deny --locked --log-level warn check --hide-inclusion-graph "${checks[@]}"
