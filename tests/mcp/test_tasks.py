"""Task tools over MCP: the full cycle start -> exec -> diff (with sensitive paths) -> finish
-> ls -> rm with purge, the task defaults, history modes, names and ids, errors, progress
notifications during start, a cancelled start that leaves nothing behind (not even git packing
its history on the host), and the project paths a start could not bring."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

TASK_ID = re.compile(r"^task-[a-z0-9]+$")


async def sh(s: ClientSession, target: str, command: str, **extra: Any) -> dict[str, Any]:
    return ok(await s.call_tool("dynocap_task_exec", {"name": target, "command": command, **extra}))


async def test_full_task_cycle(host: Host) -> None:
    app = host.project("app", files={"README.md": "hello\n", "src/main.c": "int main(void) { return 0; }\n"})
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, total, message))

    async with connect(host) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "cycle"},
                                    progress_callback=on_progress))
        assert TASK_ID.match(task["id"]), task
        assert {k: task[k] for k in ("name", "state", "network", "cpus", "memoryMB", "ttlSeconds")} == {
            "name": "cycle", "state": "running", "network": "none", "cpus": 2, "memoryMB": 1024,
            "ttlSeconds": 1800}
        assert task["source"]["projectPath"] == str(app)
        assert task["source"]["history"] == "branches"
        assert task["source"]["files"] >= 2 and task["source"]["bytes"] > 0
        # Progress notifications arrived and only ever went up.
        assert progress, "no notifications/progress during dynocap_task_start"
        values = [p[0] for p in progress]
        assert values == sorted(values) and len(set(values)) == len(values), progress
        # Every phase says what it is doing: boot, import, history, baseline.
        messages = " | ".join(p[2] or "" for p in progress)
        for phase in ("booting the sandbox", "guest agent answered", "importing",
                      "sending the git history", "recording the baseline"):
            assert phase in messages, messages

        out = await sh(s, "cycle", "pwd; cat README.md")
        assert out["stdout"] == "/workspace\nhello\n"
        assert (await sh(s, task["id"], "ls src"))["stdout"] == "main.c\n"  # the id works too
        change = ("echo world >> README.md && mkdir -p .github/workflows && "
                  "printf 'on: push\\n' > .github/workflows/x.yml && ln -s /etc/passwd link && "
                  "printf '#!/bin/sh\\necho hi\\n' > run.sh && chmod 755 run.sh")
        assert (await sh(s, "cycle", change))["exitCode"] == 0

        result = await s.call_tool("dynocap_diff", {"target": "cycle"})
        assert not result.is_error, result.content[0].text
        text = result.content[0].text
        header_line, _, patch = text.partition("\n")
        header = json.loads(header_line)
        diff = result.structured_content
        assert diff == {**header, "patch": patch}
        assert set(header) == {"files", "additions", "deletions", "sensitivePaths", "changes",
                               "omittedFiles"}
        assert header["omittedFiles"] == [] and len(header["changes"]) == header["files"]
        assert header["files"] == 4 and header["additions"] >= 4
        kinds = {(p["path"], p["kind"]) for p in header["sensitivePaths"]}
        assert (".github/workflows/x.yml", "ci-workflow") in kinds, kinds
        assert ("link", "symlink") in kinds, kinds
        assert ("run.sh", "exec-bit") in kinds, kinds
        assert all(p["reason"] for p in header["sensitivePaths"])
        assert "+world" in patch and "README.md" in patch

        finish = ok(await s.call_tool("dynocap_task_finish", {"id": "cycle"}))
        assert finish["id"] == task["id"] and finish["name"] == "cycle"
        assert finish["state"] == "finished"
        assert finish["verified"] is True and finish["verifyError"] is None, finish
        assert (finish["files"], finish["additions"], finish["deletions"]) == (
            header["files"], header["additions"], header["deletions"])
        assert finish["sensitivePaths"] == header["sensitivePaths"]
        saved = Path(finish["patchPath"])
        assert "+world" in saved.read_text()
        assert Path(finish["summaryPath"]).is_file() and Path(finish["logPath"]).is_file()
        # Finishing it again is the same saved result, and says so.
        again = ok(await s.call_tool("dynocap_task_finish", {"id": "cycle"}))
        assert again.pop("alreadyFinished") is True and "alreadyFinished" not in finish
        assert again == finish
        # A finished task's diff is the patch it saved.
        shown = await s.call_tool("dynocap_diff", {"target": "cycle"})
        assert not shown.is_error, shown.content[0].text
        assert "+world" in shown.structured_content["patch"]
        assert shown.structured_content["files"] == finish["files"]

        listed = ok(await s.call_tool("dynocap_ls", {}))
        [record] = [t for t in listed["tasks"] if t["id"] == task["id"]]
        assert record["state"] == "finished" and record["name"] == "cycle"
        assert record["result"]["verified"] is True and record["result"]["files"] == finish["files"]
        assert record["result"]["resultsDir"] == str(Path(finish["patchPath"]).parent)
        err(await s.call_tool("dynocap_task_exec", {"name": "cycle", "command": "true"}), "conflict")

        removed = ok(await s.call_tool("dynocap_rm", {"target": "cycle", "purge": True}))
        assert removed == {"released": "cycle", "purged": True, "destroyed": False}
        listed = ok(await s.call_tool("dynocap_ls", {}))
        assert all(t["id"] != task["id"] for t in listed["tasks"])
        assert not saved.exists()
        err(await s.call_tool("dynocap_diff", {"target": task["id"]}), "not_found")
        # The name is free again.
        again = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "cycle"}))
        ok(await s.call_tool("dynocap_rm", {"target": again["id"], "force": True, "purge": True}))


async def test_task_defaults_history_and_exec_options(host: Host) -> None:
    app = host.project("app")
    git = "git -c user.name=t -c user.email=t@example.com"
    subprocess.run(f"{git} branch feature && {git} branch other", shell=True, cwd=app, check=True,
                   env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(host.home)})
    async with connect(host) as s:
        branches = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app)}))
        assert branches["name"] is None and branches["source"]["history"] == "branches"
        head = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "history": "head",
                                                            "ttlSeconds": 30, "cpus": 1, "memoryMB": 256}))
        assert (head["ttlSeconds"], head["cpus"], head["memoryMB"]) == (30, 1, 256)
        none = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "history": "none"}))
        assert none["source"]["history"] == "none"
        refs = "git for-each-ref --format='%(refname)' refs/heads 2>/dev/null; true"
        assert "refs/heads/feature" in (await sh(s, branches["id"], refs))["stdout"]
        assert "refs/heads/feature" not in (await sh(s, head["id"], refs))["stdout"]
        assert "refs/heads/main" not in (await sh(s, none["id"], refs))["stdout"]

        out = await sh(s, branches["id"], 'pwd; echo "$X"', cwd="/tmp", env={"X": "y"})
        assert out["stdout"] == "/tmp\ny\n"
        timed = await sh(s, branches["id"], "sleep 20", timeoutSeconds=1)
        assert timed["timedOut"] is True
        tty = await sh(s, branches["id"], "test -t 0 && echo tty", terminal=True)
        assert "tty" in tty["transcript"]
        for t in (branches, head, none):
            removed = ok(await s.call_tool("dynocap_rm", {"target": t["id"], "force": True, "purge": True}))
            assert removed["destroyed"] is True and removed["released"] is None


async def test_task_errors(host: Host) -> None:
    app = host.project("app", git=False)
    async with connect(host) as s:
        for tool, args in (("dynocap_task_exec", {"name": "ghost", "command": "true"}),
                           ("dynocap_diff", {"target": "ghost"}),
                           ("dynocap_task_finish", {"id": "ghost"}),
                           ("dynocap_rm", {"target": "ghost"}),
                           ("dynocap_task_exec", {"name": "task-000000000000", "command": "true"})):
            err(await s.call_tool(tool, args), "not_found")
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "busy"}))
        assert task["source"]["history"] == "none"  # not a git repository: a plain tree
        err(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "busy"}), "conflict")
        err(await s.call_tool("dynocap_run", {"name": "busy"}), "conflict")
        # Hints name tools and parameters, never CLI commands or flags.
        text = err(await s.call_tool("dynocap_exec", {"name": "busy", "command": "true"}), "conflict")
        assert "dynocap_task_exec" in text and "dynocap task" not in text, text
        text = err(await s.call_tool("dynocap_destroy", {"name": "busy"}), "conflict")
        assert "dynocap_task_finish" in text and "dynocap_rm" in text, text
        text = err(await s.call_tool("dynocap_rm", {"target": "busy"}), "conflict")  # needs force
        assert "force: true" in text and "--force" not in text, text
        removed = ok(await s.call_tool("dynocap_rm", {"target": "busy", "force": True}))
        assert removed["destroyed"] is True and removed["released"] == "busy"
        ok(await s.call_tool("dynocap_rm", {"target": task["id"], "purge": True}))


async def test_a_taken_name_names_its_holder_and_the_tool_that_frees_it(host: Host) -> None:
    """A second use of a name says what holds it (a finished task, a running task, a raw
    sandbox) and names the tool that frees it, never a CLI command; nothing is left of the
    refused start, and the tool named frees the name."""
    app = host.project("app", git=False)
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "done"}))
        ok(await s.call_tool("dynocap_task_finish", {"id": "done"}))
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "busy"}))
        ok(await s.call_tool("dynocap_run", {"name": "box"}))
        before = ok(await s.call_tool("dynocap_ls", {}))
        cases = (
            ("dynocap_task_start", {"projectPath": str(app), "name": "done"},
             ("by a finished task", "dynocap_rm")),
            ("dynocap_run", {"name": "done"}, ("by a finished task", "dynocap_rm")),
            ("dynocap_run", {"name": "busy"},
             ("by a running task", "dynocap_task_finish", "dynocap_rm")),
            ("dynocap_task_start", {"projectPath": str(app), "name": "box"},
             ("by a raw sandbox", "dynocap_destroy")),
            ("dynocap_run", {"name": "box"}, ("by a raw sandbox", "dynocap_destroy")),
        )
        for tool, args, says in cases:
            text = err(await s.call_tool(tool, args), "conflict")
            for needle in says:
                assert needle in text, (tool, args, text)
            assert "dynocap rm" not in text and "`" not in text, text
        after = ok(await s.call_tool("dynocap_ls", {}))
        assert after == before, "a refused start left something behind"
        ok(await s.call_tool("dynocap_rm", {"target": "done"}))
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "done"}))
        ok(await s.call_tool("dynocap_destroy", {"name": "box"}))
        ok(await s.call_tool("dynocap_run", {"name": "box"}))


async def test_cancelled_start_leaves_nothing(host: Host) -> None:
    files = {f"pkg{i // 100}/file{i}.txt": f"line {i}\n" * 50 for i in range(3000)}
    app = host.project("big", files=files)
    cancelled = anyio.Event()

    async with connect(host) as s:
        with anyio.CancelScope() as scope:
            async def on_progress(value: float, total: float | None, message: str | None) -> None:
                scope.cancel()  # the first sign of life: cancel the start mid-way
                cancelled.set()

            with anyio.fail_after(120):
                await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "gone"},
                                  progress_callback=on_progress)
        assert cancelled.is_set(), "no progress arrived before the start completed"
        # Nothing half-made: no record, no sandbox state, the name is free.
        for _ in range(40):
            listed = ok(await s.call_tool("dynocap_ls", {}))
            leftovers = list((host.state / "sandboxes").iterdir())
            if not listed["tasks"] and not leftovers:
                break
            await anyio.sleep(0.25)
        assert listed["tasks"] == [] and listed["sandboxes"] == [], listed
        assert leftovers == [], leftovers
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "gone",
                                                            "history": "none"}))
        ok(await s.call_tool("dynocap_rm", {"target": task["id"], "force": True, "purge": True}))
    assert "dynocap_task_start cancelled by the client" in host.server_log()


def slow_bundle_project(host: Host, name: str) -> Path:
    """A project whose history takes minutes to bundle: thousands of similar files, and a
    repository configuration (git's own) that makes pack-objects try each as a delta base for
    every other, on one thread."""
    rng = random.Random(7)
    base = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz \n") for _ in range(8192))
    files = {}
    for i in range(3000):
        text = list(base)
        for _ in range(20):
            text[rng.randrange(len(text))] = "x"
        files[f"d{i // 100:02}/f{i:04}.txt"] = "".join(text)
    app = host.project(name, files=files)
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    for key, value in (("pack.window", "3000"), ("pack.depth", "1000"), ("pack.threads", "1")):
        subprocess.run(["git", "config", key, value], cwd=app, env=env, check=True)
    return app


def processes_in(project: Path) -> list[tuple[int, str]]:
    """Live host processes working in `project` or naming it: (pid, command line)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state not in ("Z", "X") and (Path(cwd).is_relative_to(project) or str(project) in cmdline):
            found.append((int(entry.name), cmdline))
    return found


async def test_cancelled_start_stops_git_packing_on_the_host(host: Host) -> None:
    app = slow_bundle_project(host, "slow")
    async with connect(host) as s:
        scope = anyio.CancelScope()

        async def start() -> None:
            with scope:
                await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "slow"})

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(start)
                # The bundle takes minutes: cancel once git's own child is packing.
                while not any("pack-objects" in cmd for _, cmd in processes_in(app)):
                    await anyio.sleep(0.05)
                scope.cancel()
        # Killed processes take a moment to exit; 10 s is a hang bound, the old leak ran on
        # for minutes here.
        for _ in range(100):
            left = processes_in(app)
            if not left:
                break
            await anyio.sleep(0.1)
        for pid, _ in left:  # a failing run must not leave git packing for minutes
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        assert left == [], f"host processes outlived the cancelled start: {left}"
        listed = ok(await s.call_tool("dynocap_ls", {}))
        assert listed["tasks"] == [], listed


async def test_task_start_reports_paths_it_could_not_bring(host: Host) -> None:
    app = host.project("special", git=False, files={"keep.txt": "keep\n"})
    os.mkfifo(app / "fifo")
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(app / "sock"))
    async with connect(host) as s:
        result = await s.call_tool("dynocap_task_start", {"projectPath": str(app)})
        task = ok(result)
        assert json.loads(result.content[0].text) == task
        source = task["source"]
        assert source["files"] == 1 and source["skippedTotal"] == 2, source
        assert [(p["path"], p["kind"]) for p in source["skipped"]] == [
            ("fifo", "special-file"), ("sock", "special-file")], source
        assert "a fifo" in source["skipped"][0]["reason"]
        # ls keeps them with the record.
        listed = ok(await s.call_tool("dynocap_ls", {}))
        [record] = [t for t in listed["tasks"] if t["id"] == task["id"]]
        assert record["source"] == source
        ok(await s.call_tool("dynocap_rm", {"target": task["id"], "force": True, "purge": True}))


async def test_a_large_diff_keeps_every_file_in_the_header_and_bounds_the_text(host: Host) -> None:
    app = host.project("big", files={"README.md": "hello\n"})
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "wide"}))
        made = await sh(s, "wide", "mkdir -p gen .github/workflows && for i in $(seq 1 120); do "
                        "seq 1 400 > gen/f$i.txt; done && printf 'on: push\\n' > .github/workflows/z.yml")
        assert made["exitCode"] == 0, made
        result = await s.call_tool("dynocap_diff", {"target": "wide"})
        assert not result.is_error, result.content[0].text
        diff = result.structured_content
        header_line, _, text = result.content[0].text.partition("\n")
        assert text == diff["patch"] and json.loads(header_line)["omittedFiles"] == diff["omittedFiles"]
        assert diff["files"] == 121 and len(diff["changes"]) == 121
        assert {c["path"] for c in diff["changes"]} >= {"gen/f1.txt", ".github/workflows/z.yml"}
        assert all(c["status"] == "added" and c["additions"] in (1, 400) for c in diff["changes"])
        assert [p["path"] for p in diff["sensitivePaths"]] == [".github/workflows/z.yml"]
        # About 1.9 KB per file: the text stops at a file boundary before 64 KiB.
        assert 50_000 < len(diff["patch"].encode()) <= 64 * 1024
        assert diff["patch"].startswith("diff --git ") and diff["patch"].endswith("+400\n")
        shown = diff["patch"].count("diff --git ")
        assert shown + len(diff["omittedFiles"]) == 121
        # Any file left out can be asked for by name; stat gives the header alone.
        wanted = diff["omittedFiles"][-1]
        one = (await s.call_tool("dynocap_diff", {"target": "wide", "paths": [wanted]})).structured_content
        assert one["patch"].count("diff --git ") == 1 and f"b/{wanted}" in one["patch"]
        assert len(one["changes"]) == 121 and len(one["omittedFiles"]) == 120
        stat = (await s.call_tool("dynocap_diff", {"target": "wide", "stat": True})).structured_content
        assert stat["patch"] == "" and len(stat["changes"]) == 121
        err(await s.call_tool("dynocap_diff", {"target": "wide", "paths": "gen/f1.txt"}), "invalid_argument")
        ok(await s.call_tool("dynocap_rm", {"target": "wide", "force": True, "purge": True}))
