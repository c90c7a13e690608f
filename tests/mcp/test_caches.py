"""Package caches over MCP: a task of a project has the project's caches (what one task left
in ~/.cache/pip the next finds), `noCache: true` on dynocap_task_start leaves them out (no
cache is mounted, nothing of the project's is there, nothing the task writes there stays),
a non-boolean noCache is invalid_argument, and noCache cannot go with fromTask (a fork has its
parent's caches)."""

from __future__ import annotations

import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

MOUNTED = "grep -c '/.cache/pip' /proc/self/mountinfo || true"


async def test_no_cache_leaves_the_projects_caches_out(host: Host) -> None:
    app = host.project("cached")
    async with connect(host) as s:
        async def sh(task: str, command: str) -> dict:
            return ok(await s.call_tool("dynocap_task_exec", {"name": task, "command": command}))

        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "first"}))
        first = await sh("first", f"{MOUNTED}; echo kept > ~/.cache/pip/marker")
        assert first["exitCode"] == 0 and first["stdout"].split() == ["1"], first
        ok(await s.call_tool("dynocap_task_finish", {"id": "first"}))

        ok(await s.call_tool("dynocap_task_start",
                             {"projectPath": str(app), "name": "bare", "noCache": True}))
        bare = await sh("bare", f"{MOUNTED}; test -e ~/.cache/pip/marker && echo seen; "
                                "mkdir -p ~/.cache/pip && echo own > ~/.cache/pip/marker")
        assert bare["exitCode"] == 0 and bare["stdout"].split() == ["0"], bare
        text = err(await s.call_tool("dynocap_task_start", {"fromTask": "bare", "noCache": True}),
                   "invalid_argument")
        assert "noCache cannot go with fromTask" in text, text
        err(await s.call_tool("dynocap_task_start",
                              {"projectPath": str(app), "name": "odd", "noCache": "yes"}),
            "invalid_argument")
        ok(await s.call_tool("dynocap_task_finish", {"id": "bare"}))

        # The default again: the first task's file is there, the bare one's never was.
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "again"}))
        again = await sh("again", "cat ~/.cache/pip/marker")
        assert again["stdout"] == "kept\n", again
        ok(await s.call_tool("dynocap_task_finish", {"id": "again"}))
