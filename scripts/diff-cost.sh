#!/usr/bin/env bash
# Splits the cost of a task diff on a 20,000-file tree: the agent's two git steps (refresh the
# private index with `add -A`, then `diff --cached` against the baseline) beside plain
# `git diff --binary` in an ordinary repository. Runs on the host in a temp dir; no root needed.
set -euo pipefail
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; mkdir -p "$work"/wt; cd "$work"/wt
for d in $(seq 0 199); do mkdir d$d; for f in $(seq 0 99); do printf '%s\n' "file $d $f $(seq 1 300 | tr '\n' ' ')" > d$d/f$f.txt; done; done
G="git --git-dir=$work/priv.git --work-tree=$work/wt -c core.hooksPath=/dev/null"
export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=a@b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=a@b GIT_INDEX_FILE="$work"/index GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
git init -q --bare "$work"/priv.git
$G add -A; t=$($G write-tree); c=$(echo b | $G commit-tree $t); $G update-ref refs/dynocap/baseline $c
for f in $(ls d0 | head -50); do echo x >> d0/$f; done
# ms LABEL COMMAND...: runs COMMAND and prints how long it took.
ms() { local label=$1; shift; local s=$(date +%s%N); "$@" >/dev/null; echo "$(( ($(date +%s%N)-s)/1000000 )) ms  $label"; }
echo "-- the agent: refresh the private index, then diff against the baseline"
for i in 1 2 3; do ms "add -A (private index)" $G add -A; ms "diff --cached vs baseline" $G diff --cached --binary --full-index --no-renames refs/dynocap/baseline; done
echo "-- floor: plain git diff in a normal repo"
unset GIT_INDEX_FILE; git init -q .; git add -A; git -c user.name=a -c user.email=b commit -qm x
for f in $(ls d0 | head -50); do echo y >> d0/$f; done
for i in 1 2 3; do ms "plain git diff --binary" git diff --binary; done
