#!/usr/bin/env python3
"""A live fork against a cold boot, side by side in one run (vm backend, as root, QEMU guests
of the built debian image, under TCG unless DYNOCAP_VM_ACCEL says otherwise): the time from
`task fork --live` of a running task to the fork's first command's answer, against the time
from `task start` of the same project to its first command's answer. The running task has a
server started as a job, which the live fork keeps; the first command of each asks it. Each
run's cold start is the next live fork's parent.

    sudo scripts/bench-live-fork.py [--runs 3] [--files 2000]

Uses target/debug (or DYNOCAP_BIN_DIR) and DYNOCAP_AGENT like the e2e tests, and the vm
setup of scripts/bench-fork.py."""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("bench_fork", HERE / "bench-fork.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

# The first command: the server's answer when it runs, a plain `true` where it does not.
FIRST = "curl -s -o /dev/null -w '%{http_code}' localhost:8000/ || true"


def to_first_exec(home: Path, name: str, *start: str) -> float:
    """Seconds from the start of `dynocap START...` to the answer of the first command in the
    task `name` it starts."""
    began = time.monotonic()
    bench.dynocap(home, *start)
    bench.dynocap(home, "task", "exec", name, "--", FIRST)
    return time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dynocap-bench-live-") as tmp:
        home = Path(tmp) / "home"
        src = Path(tmp) / "project"
        src.mkdir()
        bench.project(src, args.files)
        bench.vm_setup(home)
        colds, lives = [], []
        for i in range(args.runs):
            # Each run's cold start is the next live fork's parent: a live fork is the first
            # freeze of its parent's disk in its QEMU (see docs/tasks.md#live-forks).
            colds.append(to_first_exec(home, f"cold{i}", "task", "start", str(src), "--name",
                                       f"cold{i}"))
            bench.dynocap(home, "task", "exec", f"cold{i}", "--background", "--timeout", "3600",
                          "--", "cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1")
            bench.dynocap(home, "task", "exec", f"cold{i}", "--", "for i in $(seq 150); do "
                          "curl -s -o /dev/null localhost:8000/ && break; sleep 0.2; done")
            lives.append(to_first_exec(home, f"live{i}", "task", "fork", f"cold{i}", f"live{i}",
                                       "--live"))
            for name in (f"live{i}", f"cold{i}"):
                bench.dynocap(home, "rm", "--force", "--purge", name)
    cold, live = statistics.median(colds), statistics.median(lives)
    accel = bench.EXTRA_ENV["DYNOCAP_VM_ACCEL"]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"vm ({accel}): project of {args.files} files, {args.runs} runs each, medians; "
          f"load average {load}")
    print(f"task start to first exec (cold boot):  {cold * 1000:.0f} ms")
    print(f"task fork --live to first exec:        {live * 1000:.0f} ms  "
          f"= {live / cold:.2f}x a cold boot (target at most 0.5x)")


if __name__ == "__main__":
    main()
