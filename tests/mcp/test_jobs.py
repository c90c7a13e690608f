"""Jobs over MCP with the official SDK: an exec still running at the server's wait bound
(DYNOCAP_MCP_WAIT_SECONDS) answers with its job instead of being killed, and dynocap_job
follows it to its end from offsets; background: true; kill: true; a job id reaches only the
jobs of the sandbox it is asked of."""

from __future__ import annotations

import time

import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

WAIT = {"DYNOCAP_MCP_WAIT_SECONDS": "2"}


async def follow(s, name: str, job: str, out: int = 0, errs: int = 0) -> tuple[dict, str]:
    """Polls dynocap_job from the offsets until the job ends; its last answer and all stdout."""
    text = ""
    for _ in range(30):
        report = ok(await s.call_tool("dynocap_job", {
            "name": name, "job": job, "waitSeconds": 2, "stdoutOffset": out, "stderrOffset": errs}))
        assert report["job"] == job
        text += report["stdout"]
        assert report["stdoutOffset"] >= out
        out, errs = report["stdoutOffset"], report["stderrOffset"]
        if not report["running"]:
            return report, text
    raise AssertionError(f"job {job} did not end")


async def test_an_exec_past_the_wait_bound_becomes_a_job_followed_to_its_end(host: Host) -> None:
    async with connect(host, env=WAIT) as s:
        ok(await s.call_tool("dynocap_run", {"name": "jobs"}))
        started = time.monotonic()
        result = ok(await s.call_tool("dynocap_exec", {
            "name": "jobs", "command": "echo first; sleep 5; echo done", "timeoutSeconds": 60}))
        waited = time.monotonic() - started
        assert waited < 4.5, waited
        assert result["running"] is True, result
        assert result["job"].startswith("job-")
        assert result["exitCode"] is None and result["timedOut"] is False
        assert result["stdout"] == "first\n"
        assert result["stdoutOffset"] == len("first\n")
        report, rest = await follow(s, "jobs", result["job"], result["stdoutOffset"])
        assert rest == "done\n"
        assert (report["state"], report["exitCode"], report["signal"]) == ("exited", 0, None)
        assert report["command"] == "echo first; sleep 5; echo done"
        # From the start again: the whole output is kept.
        whole = ok(await s.call_tool("dynocap_job", {"name": "jobs", "job": result["job"]}))
        assert whole["stdout"] == "first\ndone\n"
        # A command that ends within the bound is an ordinary Exec object.
        quick = ok(await s.call_tool("dynocap_exec", {"name": "jobs", "command": "echo quick"}))
        assert quick["stdout"] == "quick\n" and "running" not in quick and "job" not in quick


async def test_background_kill_and_another_sandboxs_job(host: Host) -> None:
    async with connect(host, env=WAIT) as s:
        ok(await s.call_tool("dynocap_run", {"name": "one"}))
        ok(await s.call_tool("dynocap_run", {"name": "two"}))
        started = time.monotonic()
        bg = ok(await s.call_tool("dynocap_exec", {
            "name": "one", "command": "echo started; sleep 300", "background": True,
            "timeoutSeconds": 600}))
        assert time.monotonic() - started < 1.9
        assert bg["running"] is True
        job = bg["job"]
        # The same id asked of another sandbox names nothing there.
        text = err(await s.call_tool("dynocap_job", {"name": "two", "job": job}), "not_found")
        assert "has no job" in text
        err(await s.call_tool("dynocap_job", {"name": "one", "job": "job-999"}), "not_found")
        report = ok(await s.call_tool("dynocap_job", {"name": "one", "job": job, "waitSeconds": 1}))
        assert report["state"] == "running" and report["running"] is True
        assert report["stdout"] == "started\n"
        killed = ok(await s.call_tool("dynocap_job", {"name": "one", "job": job, "kill": True}))
        assert (killed["state"], killed["running"]) == ("killed", False), killed
        assert killed["signal"] in ("SIGTERM", "SIGKILL"), killed
        # The sandbox is still there and its other commands run.
        after = ok(await s.call_tool("dynocap_exec", {
            "name": "one", "command": "ps -eo args | grep -c '^sleep 300' || true"}))
        assert after["stdout"] == "0\n", after
        # A task's exec becomes a job the same way.
        project = host.project()
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project)}))
        tj = ok(await s.call_tool("dynocap_task_exec", {
            "name": task["id"], "command": "sleep 3; ls README.md", "background": True}))
        report, out = await follow(s, task["id"], tj["job"])
        assert (report["state"], report["exitCode"], out) == ("exited", 0, "README.md\n")
