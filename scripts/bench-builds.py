#!/usr/bin/env python3
"""Compares builds of DynoCap side by side in one run: the CLI's `run` + `exec true` +
`destroy`, and the same three calls over one MCP session, for each build, every cycle beside
a `bwrap --unshare-all ... true` after the same idle pause (as tests/benches/sandbox.rs pairs
them). Prints medians and each build's ratio to bwrap: ratios, not absolute times.

Usage (root, on a quiet machine):
    scripts/bench-builds.py NAME=DIR [NAME=DIR ...]
where DIR holds a build's `dynocap`, `dynocap-core` and static `dynocap-agent` (a release
build of an older commit: `git worktree add /tmp/old REV`, build it with
`CARGO_TARGET_DIR=... cargo build --release -p dynocap` and the musl agent, copy the three).
CYCLES (default 15) sets the cycles per build. The MCP part needs the `mcp` package (the
tests' venv: target/mcp-venv/bin/python); without it only the CLI part runs. It also times
EXECS (default 100) `dynocap_exec true` calls on a running sandbox per build, the builds'
calls alternating, and prints each build's median beside the first build's.
"""

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

CYCLES = int(os.environ.get("CYCLES", "15"))
EXECS = int(os.environ.get("EXECS", "100"))
PAUSE = 0.2
BWRAP = [
    "bwrap", "--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev",
    "--tmpfs", "/tmp", "true",
]


def bwrap():
    start = time.perf_counter()
    subprocess.run(BWRAP, check=True)
    return time.perf_counter() - start


def environment(directory, home):
    return dict(os.environ, DYNOCAP_HOME=home, DYNOCAP_AGENT=os.path.join(directory, "dynocap-agent"))


def cli_part(builds):
    homes = {name: tempfile.mkdtemp(prefix="dcbb", dir="/tmp") for name in builds}

    def cli(name, *args):
        env = environment(builds[name], homes[name])
        subprocess.run([os.path.join(builds[name], "dynocap"), *args], env=env, check=True,
                       stdout=subprocess.DEVNULL)

    def cycle(name, i):
        times = []
        for args in (("run", f"c{i}"), ("exec", f"c{i}", "--", "true"), ("destroy", f"c{i}")):
            start = time.perf_counter()
            cli(name, *args)
            times.append(time.perf_counter() - start)
        return times

    for name in builds:
        cycle(name, "warm")
    results = {name: [] for name in builds}
    baseline = []
    for i in range(CYCLES):
        for name in builds:
            time.sleep(PAUSE)
            baseline.append(bwrap())
            time.sleep(PAUSE)
            results[name].append(cycle(name, i))
    b = statistics.median(baseline)
    print(f"CLI run + exec true + destroy; bwrap median {b * 1e3:.2f} ms")
    for name, cycles in results.items():
        run, exe, destroy = (statistics.median(c[k] for c in cycles) * 1e3 for k in range(3))
        total = statistics.median(sum(c) for c in cycles) * 1e3
        print(f"  {name}: run {run:.2f} exec {exe:.2f} destroy {destroy:.2f} | cycle {total:.2f} ms,"
              f" ratio {total / (b * 1e3):.2f}x")


async def mcp_part(builds):
    from contextlib import AsyncExitStack

    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    async with AsyncExitStack() as stack:
        sessions = {}
        for name, directory in builds.items():
            home = tempfile.mkdtemp(prefix="dcbm", dir="/tmp")
            params = StdioServerParameters(command=os.path.join(directory, "dynocap"), args=["mcp"],
                                           env=environment(directory, home))
            read, write = await stack.enter_async_context(stdio_client(params))
            session = await stack.enter_async_context(ClientSession(read, write))
            await session.initialize()
            sessions[name] = session

        async def call(session, tool, args):
            start = time.perf_counter()
            result = await session.call_tool(tool, args)
            if result.is_error:
                raise SystemExit(f"{tool}: {result}")
            return time.perf_counter() - start

        async def cycle(session, i):
            return [await call(session, tool, args)
                    for tool, args in (("dynocap_run", {"name": i}),
                                       ("dynocap_exec", {"name": i, "command": "true"}),
                                       ("dynocap_destroy", {"name": i}))]

        for session in sessions.values():
            await cycle(session, "warm")
        results = {name: [] for name in sessions}
        baseline = []
        for i in range(CYCLES):
            for name, session in sessions.items():
                await asyncio.sleep(PAUSE)
                baseline.append(bwrap())
                await asyncio.sleep(PAUSE)
                results[name].append(await cycle(session, f"m{i}"))
        b = statistics.median(baseline)
        print(f"MCP dynocap_run + dynocap_exec + dynocap_destroy; bwrap median {b * 1e3:.2f} ms")
        for name, cycles in results.items():
            run, exe, destroy = (statistics.median(c[k] for c in cycles) * 1e3 for k in range(3))
            total = statistics.median(sum(c) for c in cycles) * 1e3
            print(f"  {name}: run {run:.2f} exec {exe:.2f} destroy {destroy:.2f} | cycle"
                  f" {total:.2f} ms, ratio {total / (b * 1e3):.2f}x")
        if EXECS:
            execs = {name: [] for name in sessions}
            for session in sessions.values():
                await call(session, "dynocap_run", {"name": "hot"})
                await call(session, "dynocap_exec", {"name": "hot", "command": "true"})
            for _ in range(EXECS):
                for name, session in sessions.items():
                    await asyncio.sleep(PAUSE / 10)
                    execs[name].append(
                        await call(session, "dynocap_exec", {"name": "hot", "command": "true"}))
            for session in sessions.values():
                await call(session, "dynocap_destroy", {"name": "hot"})
            first = statistics.median(next(iter(execs.values())))
            print(f"MCP dynocap_exec true on a running sandbox, {EXECS} per build, alternating")
            for name, times in execs.items():
                m = statistics.median(times)
                print(f"  {name}: median {m * 1e3:.2f} ms, ratio to the first build {m / first:.2f}x")


def main(argv):
    if not argv:
        sys.exit(__doc__)
    builds = dict(arg.split("=", 1) for arg in argv)
    cli_part(builds)
    try:
        import mcp  # noqa: F401
    except ImportError:
        print("MCP part skipped: no `mcp` package in this Python (use target/mcp-venv/bin/python)")
        return
    asyncio.run(mcp_part(builds))


if __name__ == "__main__":
    main(sys.argv[1:])
