"""Jobs over MCP with the official SDK: an exec still running at the server's wait bound
(DYNOCAP_MCP_WAIT_SECONDS) answers with its job instead of being killed, and dynocap_job
follows it to its end from offsets; background: true; kill: true; a job id reaches only the
jobs of the sandbox it is asked of. dynocap_ps and dynocap_ls list running jobs; a task's
finish and its TTL say which jobs they cut off and keep each job's whole output."""

from __future__ import annotations

import json
import time
from pathlib import Path

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
        # The command waits for a file this test makes only once the call has answered: the
        # answer can come from the wait bound only (without it, the call would end at the
        # command's timeout, timedOut). No clock is read.
        command = "echo first; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo done"
        result = ok(await s.call_tool("dynocap_exec", {
            "name": "jobs", "command": command, "timeoutSeconds": 120}))
        assert result["running"] is True, result
        assert result["job"].startswith("job-")
        assert result["exitCode"] is None and result["timedOut"] is False
        assert result["stdout"] == "first\n"
        assert result["stdoutOffset"] == len("first\n")
        await s.call_tool("dynocap_write_file", {"name": "jobs", "path": "/tmp/go"})
        report, rest = await follow(s, "jobs", result["job"], result["stdoutOffset"])
        assert rest == "done\n"
        assert (report["state"], report["exitCode"], report["signal"]) == ("exited", 0, None)
        assert report["command"] == command
        # From the start again: the whole output is kept.
        whole = ok(await s.call_tool("dynocap_job", {"name": "jobs", "job": result["job"]}))
        assert whole["stdout"] == "first\ndone\n"
        # A command that ends within the bound is an ordinary Exec object.
        quick = ok(await s.call_tool("dynocap_exec", {"name": "jobs", "command": "echo quick"}))
        assert quick["stdout"] == "quick\n" and "running" not in quick and "job" not in quick


async def test_background_kill_and_another_sandboxs_job(host: Host) -> None:
    # A wait bound longer than the command: a background start that answers at all answered
    # at once (waited for, the call would end with the command, 300 s on). No clock is read.
    async with connect(host, env={"DYNOCAP_MCP_WAIT_SECONDS": "600"}) as s:
        ok(await s.call_tool("dynocap_run", {"name": "one"}))
        ok(await s.call_tool("dynocap_run", {"name": "two"}))
        bg = ok(await s.call_tool("dynocap_exec", {
            "name": "one", "command": "echo started; sleep 300", "background": True,
            "timeoutSeconds": 600}))
        assert bg["running"] is True
        job = bg["job"]
        # The same id asked of another sandbox names nothing there.
        text = err(await s.call_tool("dynocap_job", {"name": "two", "job": job}), "not_found")
        assert "has no job" in text
        err(await s.call_tool("dynocap_job", {"name": "one", "job": "job-999"}), "not_found")
        # Not the form ids take: unknown, never taken for a job the sandbox forgot.
        text = err(await s.call_tool("dynocap_job", {"name": "one", "job": "job-0" + job[4:]}),
                   "not_found")
        assert "has no job" in text and "no longer kept" not in text, text
        for _ in range(30):
            report = ok(await s.call_tool("dynocap_job", {"name": "one", "job": job,
                                                          "waitSeconds": 1}))
            if report["stdout"]:
                break
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


async def test_ps_and_ls_list_running_jobs(host: Host) -> None:
    async with connect(host, env=WAIT) as s:
        ok(await s.call_tool("dynocap_run", {"name": "listed"}))
        assert "jobs" not in ok(await s.call_tool("dynocap_ps", {}))["sandboxes"][0]
        bg = ok(await s.call_tool("dynocap_exec", {
            "name": "listed", "command": "sleep 301", "background": True, "timeoutSeconds": 600}))
        box = ok(await s.call_tool("dynocap_ps", {}))["sandboxes"][0]
        assert [(j["job"], j["command"]) for j in box["jobs"]] == [(bg["job"], "sleep 301")], box
        assert box["jobs"][0]["startedAt"].endswith("Z") and box["jobs"][0]["runningSeconds"] >= 0
        listed = ok(await s.call_tool("dynocap_ls", {}))["sandboxes"][0]
        assert listed["jobs"][0]["job"] == bg["job"], listed
        ok(await s.call_tool("dynocap_job", {"name": "listed", "job": bg["job"], "kill": True}))
        assert "jobs" not in ok(await s.call_tool("dynocap_ps", {}))["sandboxes"][0]


def saved(result: dict, job: str) -> dict:
    """The finish result's entry for `job`, its output file checked to be in the results."""
    [entry] = [j for j in result["jobs"] if j["job"] == job]
    assert Path(entry["stdoutPath"]).parent == Path(result["summaryPath"]).parent / "jobs"
    return entry


async def test_a_finish_says_which_jobs_it_cut_off(host: Host) -> None:
    async with connect(host, env=WAIT) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(host.project())}))
        bg = ok(await s.call_tool("dynocap_task_exec", {
            "name": task["id"], "command": "seq 1 100000; sleep 302", "background": True,
            "timeoutSeconds": 600}))
        whole = "".join(f"{n}\n" for n in range(1, 100001))
        for _ in range(30):
            report = ok(await s.call_tool("dynocap_job", {
                "name": task["id"], "job": bg["job"], "waitSeconds": 1}))
            if report["stdoutOffset"] == len(whole):
                break
        listed = ok(await s.call_tool("dynocap_ls", {}))["tasks"]
        assert [j["job"] for t in listed if t["id"] == task["id"] for j in t["jobs"]] == [bg["job"]]
        result = ok(await s.call_tool("dynocap_task_finish", {"id": task["id"]}))
        assert [(j["job"], j["command"]) for j in result["jobsCutOff"]] == [
            (bg["job"], "seq 1 100000; sleep 302")], result
        entry = saved(result, bg["job"])
        assert entry["cutOff"] is True
        assert Path(entry["stdoutPath"]).read_text() == whole
        assert entry["stdoutBytes"] == len(whole)
        summary = json.loads(Path(result["summaryPath"]).read_text())
        assert summary["task"]["jobsCutOff"][0]["job"] == bg["job"]
        # The job cannot be asked any more; asking says where its output was saved.
        text = err(await s.call_tool("dynocap_job", {"name": task["id"], "job": bg["job"]}),
                   "conflict")
        assert entry["stdoutPath"] in text, text


async def test_a_tasks_ttl_says_which_jobs_it_cut_off(host: Host) -> None:
    async with connect(host, env=WAIT) as s:
        task = ok(await s.call_tool("dynocap_task_start", {
            "projectPath": str(host.project()), "ttlSeconds": 30}))
        bg = ok(await s.call_tool("dynocap_task_exec", {
            "name": task["id"], "command": "echo before the ttl; sleep 303", "background": True,
            "timeoutSeconds": 600}))
        for _ in range(90):
            listed = ok(await s.call_tool("dynocap_ls", {}))["tasks"]
            if [t for t in listed if t["id"] == task["id"] and t["state"] == "expired"]:
                break
            time.sleep(1)
        else:
            raise AssertionError("the task did not expire")
        result = ok(await s.call_tool("dynocap_task_finish", {"id": task["id"]}))
        assert result["state"] == "expired" and result["alreadyFinished"] is True, result
        assert [j["job"] for j in result["jobsCutOff"]] == [bg["job"]], result
        entry = saved(result, bg["job"])
        assert entry["cutOff"] is True
        assert Path(entry["stdoutPath"]).read_text() == "before the ttl\n"


async def test_sixteen_background_jobs_refuse_a_seventeenth_not_an_exec(host: Host) -> None:
    # Every MCP exec starts as a job: with 16 background jobs running, even `echo ok` was
    # refused. The bound is on background jobs; an exec within its call has its own.
    async with connect(host, env=WAIT) as s:
        ok(await s.call_tool("dynocap_run", {"name": "many"}))
        jobs = []
        for _ in range(16):
            bg = ok(await s.call_tool("dynocap_exec", {
                "name": "many", "command": "sleep 300", "background": True,
                "timeoutSeconds": 600}))
            assert bg["running"] is True, bg
            jobs.append(bg["job"])
        text = err(await s.call_tool("dynocap_exec", {
            "name": "many", "command": "sleep 300", "background": True,
            "timeoutSeconds": 600}), "conflict")
        assert "dynocap_job" in text and "kill" in text, text
        assert "dynocap job NAME JOB --kill" in text, text
        quick = ok(await s.call_tool("dynocap_exec", {"name": "many", "command": "echo ok"}))
        assert (quick["stdout"], quick["exitCode"]) == ("ok\n", 0), quick
        # One that outlives its call meanwhile (it waits for a file made only once the call
        # answered) goes on as a 17th job, its output kept, rather than being cut off.
        late = ok(await s.call_tool("dynocap_exec", {
            "name": "many", "timeoutSeconds": 120,
            "command": "echo waiting; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo late"}))
        assert late["running"] is True and late["job"] not in jobs, late
        await s.call_tool("dynocap_write_file", {"name": "many", "path": "/tmp/go"})
        report, rest = await follow(s, "many", late["job"], late["stdoutOffset"])
        assert (report["state"], late["stdout"] + rest) == ("exited", "waiting\nlate\n")
        for job in jobs:
            killed = ok(await s.call_tool("dynocap_job", {"name": "many", "job": job,
                                                          "kill": True}))
            assert killed["state"] == "killed", killed
        bg = ok(await s.call_tool("dynocap_exec", {
            "name": "many", "command": "true", "background": True}))
        assert bg["running"] is True, bg


async def done(s, name: str, job: str) -> dict:
    """dynocap_job until `job` ended; its last answer."""
    for _ in range(60):
        report = ok(await s.call_tool("dynocap_job", {"name": name, "job": job, "waitSeconds": 2}))
        if not report["running"]:
            return report
    raise AssertionError(f"job {job} did not end")


async def test_an_ended_jobs_output_makes_room_for_a_newer_jobs(host: Host) -> None:
    # 200 MB, then 100 MB: past the sandbox's 256 MiB of kept job output. The second job's
    # output used to be dropped (and every later job's) because the first, long ended, held
    # the room; now the first one's output is forgotten to make room, and it says so.
    first_len, second_len = 200_000_000, 100_000_000
    async with connect(host, env=WAIT) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(host.project())}))
        name = task["id"]
        first = ok(await s.call_tool("dynocap_task_exec", {
            "name": name, "command": f"head -c {first_len} /dev/zero", "background": True,
            "timeoutSeconds": 300}))
        report = await done(s, name, first["job"])
        assert (report["state"], report["stdoutOffset"]) == ("exited", first_len), report
        assert "outputEvicted" not in report and "stdoutDropped" not in report, report
        second = ok(await s.call_tool("dynocap_task_exec", {
            "name": name, "command": f"head -c {second_len} /dev/zero; echo end",
            "background": True, "timeoutSeconds": 300}))
        report = await done(s, name, second["job"])
        assert (report["state"], report["exitCode"]) == ("exited", 0), report
        assert report["stdoutOffset"] == second_len + 4, report
        assert "stdoutDropped" not in report and "outputEvicted" not in report, report
        assert report["stdout"].endswith("end\n"), report["stdout"][-20:]
        evicted = ok(await s.call_tool("dynocap_job", {"name": name, "job": first["job"]}))
        assert evicted["outputEvicted"] is True, evicted
        assert (evicted["state"], evicted["exitCode"]) == ("exited", 0), evicted
        assert (evicted["stdoutOffset"], evicted["stdoutDropped"]) == (0, first_len), evicted
        assert evicted["stdout"] == "", evicted
        result = ok(await s.call_tool("dynocap_task_finish", {"id": name}))
        entry = saved(result, first["job"])
        assert (entry["stdoutBytes"], entry["stdoutDropped"]) == (0, first_len), entry
        assert Path(entry["stdoutPath"]).stat().st_size == 0
        entry = saved(result, second["job"])
        assert entry["stdoutBytes"] == second_len + 4 and "stdoutDropped" not in entry, entry
        assert Path(entry["stdoutPath"]).stat().st_size == second_len + 4
