"""A task's checkpoints and forks over MCP with the official SDK: dynocap_checkpoint makes,
lists, restores (naming the job it ended) and deletes checkpoints; dynocap_task_start with
fromTask forks a task from its current state and from a checkpoint, each fork finishing with a
verified patch of the shared work and its own change only; on the vm a live fork (live with
fromTask) keeps the server the source runs as a job; a fork's network passes the host
policy as any start's, and what a fork keeps of its parent cannot be given with fromTask."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]


def changed(finish: dict) -> list[str]:
    assert finish["verified"] is True, finish
    patch = Path(finish["patchPath"]).read_text()
    return [line.split(" b/")[0][len("diff --git a/"):]
            for line in patch.splitlines() if line.startswith("diff --git a/")]


async def test_checkpoint_restore_and_forks_over_mcp(host: Host) -> None:
    app = host.project("forked", files={"base.txt": "base\n"})
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "src"}))
        run = lambda name, cmd: s.call_tool("dynocap_task_exec", {"name": name, "command": cmd})  # noqa: E731
        assert ok(await run("src", "echo shared >> base.txt"))["exitCode"] == 0
        made = ok(await s.call_tool("dynocap_checkpoint", {"name": "src", "label": "ready"}))
        assert made["action"] == "create" and made["checkpoint"]["label"] == "ready"
        job = ok(await s.call_tool("dynocap_task_exec", {
            "name": "src", "command": "while :; do date > ~/tick; sleep 0.1; done",
            "background": True, "timeoutSeconds": 300}))["job"]
        assert ok(await run("src", "rm base.txt && echo oops > oops.txt"))["exitCode"] == 0
        restored = ok(await s.call_tool("dynocap_checkpoint",
                                        {"name": "src", "action": "restore", "label": "ready"}))
        assert restored["label"] == "ready"
        assert [j["job"] for j in restored["jobsEnded"]] == [job]
        assert ok(await run("src", "cat base.txt; ls"))["stdout"] == "base\nshared\nbase.txt\n"
        listed = ok(await s.call_tool("dynocap_checkpoint", {"name": "src", "action": "list"}))
        assert [c["label"] for c in listed["checkpoints"]] == ["ready"]

        assert ok(await run("src", "echo later > later.txt"))["exitCode"] == 0
        now = ok(await s.call_tool("dynocap_task_start", {"fromTask": "src", "name": "now"}))
        assert now["forkedFrom"] == {"task": "src", "taskId": now["forkedFrom"]["taskId"]}
        old = ok(await s.call_tool("dynocap_task_start",
                                   {"fromTask": "src", "checkpoint": "ready", "name": "old"}))
        assert old["forkedFrom"]["checkpoint"] == "ready"
        assert ok(await run("now", "echo n > now.txt"))["exitCode"] == 0
        assert ok(await run("old", "echo o > old.txt"))["exitCode"] == 0

        # What a fork keeps of its parent, and a network the host does not allow.
        err(await s.call_tool("dynocap_task_start", {"fromTask": "src", "cpus": 4}),
            "invalid_argument")
        err(await s.call_tool("dynocap_task_start", {"fromTask": "src", "network": "nat"}),
            "policy_denied")
        err(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "checkpoint": "ready"}),
            "invalid_argument")

        deleted = ok(await s.call_tool("dynocap_checkpoint",
                                       {"name": "src", "action": "delete", "label": "ready"}))
        assert deleted["checkpoints"] == []
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "now"}))) == [
            "base.txt", "later.txt", "now.txt"]
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "old"}))) == [
            "base.txt", "old.txt"]
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "src"}))) == [
            "base.txt", "later.txt"]


async def test_vm_checkpoint_restore_and_fork_over_mcp(host: Host) -> None:
    """On the vm backend: the checkpoint is a frozen qcow2 layer, restored and forked from, and
    the source and the fork finish with their own verified patches."""
    from test_vm import vm_env

    env = vm_env(host)
    app = host.project("vmforked", files={"base.txt": "base\n"})
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "vsrc"}))
        run = lambda name, cmd: s.call_tool("dynocap_task_exec", {"name": name, "command": cmd})  # noqa: E731
        assert ok(await run("vsrc", "echo shared >> base.txt"))["exitCode"] == 0
        made = ok(await s.call_tool("dynocap_checkpoint", {"name": "vsrc", "label": "ready"}))
        assert made["checkpoint"]["label"] == "ready"
        assert ok(await run("vsrc", "rm base.txt && echo oops > oops.txt"))["exitCode"] == 0
        restored = ok(await s.call_tool("dynocap_checkpoint",
                                        {"name": "vsrc", "action": "restore", "label": "ready"}))
        assert restored["label"] == "ready"
        assert ok(await run("vsrc", "cat base.txt; ls"))["stdout"] == "base\nshared\nbase.txt\n"
        old = ok(await s.call_tool("dynocap_task_start",
                                   {"fromTask": "vsrc", "checkpoint": "ready", "name": "vold"}))
        assert old["forkedFrom"]["checkpoint"] == "ready"
        assert ok(await run("vold", "echo o > old.txt"))["exitCode"] == 0
        assert ok(await run("vsrc", "echo later > later.txt"))["exitCode"] == 0
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "vsrc"}))) == [
            "base.txt", "later.txt"]
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "vold"}))) == [
            "base.txt", "old.txt"]


async def test_vm_live_fork_over_mcp(host: Host) -> None:
    """On the vm backend, dynocap_task_start with fromTask and live: the server the source runs
    as a background job answers in the fork, under the fork's hostname, and the fork finishes
    with a verified patch of the shared work and its own change only."""
    from test_vm import vm_env

    env = vm_env(host)
    app = host.project("vmlive", files={"base.txt": "base\n"})
    curl = ("for i in $(seq 150); do curl -s -o /dev/null localhost:8000/ && break; sleep 0.2; "
            "done; curl -s -o /dev/null -w '%{http_code}' localhost:8000/")
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "lsrc"}))
        run = lambda name, cmd: s.call_tool("dynocap_task_exec", {"name": name, "command": cmd})  # noqa: E731
        job = ok(await s.call_tool("dynocap_task_exec", {
            "name": "lsrc", "background": True, "timeoutSeconds": 900,
            "command": "cd /tmp && exec python3 -m http.server 8000 --bind 127.0.0.1"}))
        assert job["running"] is True, job
        assert ok(await run("lsrc", curl))["stdout"] == "200"
        assert ok(await run("lsrc", "echo shared >> base.txt"))["exitCode"] == 0
        fork = ok(await s.call_tool("dynocap_task_start",
                                    {"fromTask": "lsrc", "live": True, "name": "lfork"}))
        assert fork["forkedFrom"]["task"] == "lsrc", fork
        seen = ok(await run("lfork", curl + "; echo; hostname"))
        assert seen["stdout"] == "200\nlfork\n", seen
        assert ok(await run("lfork", "echo f > fork.txt"))["exitCode"] == 0
        assert changed(ok(await s.call_tool("dynocap_task_finish", {"id": "lfork"}))) == [
            "base.txt", "fork.txt"]
        assert ok(await run("lsrc", curl))["stdout"] == "200"
