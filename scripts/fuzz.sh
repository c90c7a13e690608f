#!/usr/bin/env bash
# Runs every fuzz target of every cargo-fuzz crate in the repository (crates/*/fuzz) for a
# bounded time each, and fails if any of them found a crash. Not part of scripts/test.sh:
# building with sanitizers and fuzzing take minutes, not seconds.
#
#   scripts/fuzz.sh                      every target, DYNOCAP_FUZZ_SECONDS (default 30) each
#   scripts/fuzz.sh netproxy agent       every target of those crates
#   scripts/fuzz.sh netproxy/tls_watch   one target
#   scripts/fuzz.sh 120 proto            a number is the seconds each, over DYNOCAP_FUZZ_SECONDS
#
# A crash leaves its input in crates/CRATE/fuzz/artifacts/TARGET/; replay it with
# `cargo fuzz run --fuzz-dir crates/CRATE/fuzz TARGET THAT-FILE` (prefixed with
# RUSTC_BOOTSTRAP=1 on a stable toolchain, as below). What each run learnt stays in
# crates/CRATE/fuzz/corpus/TARGET and starts the next run, beside the committed seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

seconds="${DYNOCAP_FUZZ_SECONDS:-30}"
wanted=()
for arg in "$@"; do
    if [[ $arg =~ ^[0-9]+$ ]]; then seconds="$arg"; else wanted+=("$arg"); fi
done
[[ $seconds =~ ^[1-9][0-9]*$ ]] || {
    echo "fuzz.sh: the time for each target must be a whole number of seconds above 0, not '$seconds'" >&2
    exit 2
}

cargo_fuzz_version=0.13.2
if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
    echo "fuzz.sh: installing cargo-fuzz $cargo_fuzz_version (about a minute)" >&2
    cargo install cargo-fuzz --locked --version "$cargo_fuzz_version"
fi

# cargo-fuzz builds with unstable compiler flags (sanitizers, coverage instrumentation). A
# nightly toolchain has them; a stable one is told to accept them with RUSTC_BOOTSTRAP=1, which
# works because the flags are the same compiler's, only gated.
if ! rustc --version | grep -q -- '-nightly'; then
    echo "fuzz.sh: $(rustc --version) is not a nightly; building with RUSTC_BOOTSTRAP=1" >&2
    export RUSTC_BOOTSTRAP=1
fi

# One target directory for every fuzz crate, so libFuzzer and shared dependencies build once;
# it is apart from the workspace's own builds, which use other flags.
target_dir="$PWD/target/fuzz"

# The targets to run, as crate/target.
targets=()
for fuzz_dir in crates/*/fuzz; do
    [[ -f $fuzz_dir/Cargo.toml ]] || continue
    crate="$(basename "$(dirname "$fuzz_dir")")"
    for target in $(cargo fuzz list --fuzz-dir "$fuzz_dir"); do
        if ((${#wanted[@]} == 0)) || printf '%s\n' "${wanted[@]}" | grep -qxF -e "$crate" -e "$crate/$target"; then
            targets+=("$crate/$target")
        fi
    done
done
if ((${#targets[@]} == 0)); then
    echo "fuzz.sh: no fuzz target matches '${wanted[*]}'; the crates with targets are:" $(ls -d crates/*/fuzz | cut -d/ -f2) >&2
    exit 2
fi

failed=()
for entry in "${targets[@]}"; do
    crate="${entry%%/*}"
    target="${entry#*/}"
    echo "fuzz.sh: $entry for ${seconds} s" >&2
    # The corpus grows in corpus/TARGET (not in git); seeds/TARGET, committed, holds real
    # inputs (a curl ClientHello, an index git wrote) that start the search deep in the format.
    corpus=("crates/$crate/fuzz/corpus/$target")
    mkdir -p "${corpus[0]}"
    [[ -d crates/$crate/fuzz/seeds/$target ]] && corpus+=("crates/$crate/fuzz/seeds/$target")
    # -timeout: one input taking 10 s is a hang worth reporting, not a slow run to wait for.
    if ! cargo fuzz run --fuzz-dir "crates/$crate/fuzz" --target-dir "$target_dir" "$target" "${corpus[@]}" -- \
        -max_total_time="$seconds" -timeout=10 -print_final_stats=1; then
        failed+=("$entry")
    fi
done

if ((${#failed[@]})); then
    echo "fuzz.sh: found crashes in: ${failed[*]} (inputs under crates/*/fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz.sh: no crash in ${#targets[@]} target(s), ${seconds} s each" >&2
