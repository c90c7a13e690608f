"""`repositoryUrl` clones and the network modes end to end over MCP, with the host flags set in
the server's environment, against the loopback fixtures of netfix.py (a test CA, the HTTPS
server with git smart HTTP, an sshd serving git):

- an HTTPS clone is the task's baseline (`source.baseCommit`, exec, diff, finish), and a
  `none` task has no egress afterwards, not even to its git host;
- a `filtered` clone task reaches its git host and the npm registry only (403 for others), and
  its finish result reports the hosts reached;
- a `filtered` raw sandbox's exec results list the connections refused while they ran
  (`networkRefusals`), with what would allow a host off the allowlist (`allowHosts` within
  DYNOCAP_MCP_EGRESS_ALLOW, else the server's settings), and following that fix works;
- an SSH clone with `sshKeyPath` works only with DYNOCAP_MCP_ALLOW_SSH_KEY=1, never echoes
  the key, and a passphrase-protected key is a clear error that leaves no task;
- a clone that fails is an `internal:` error with git's message and leaves nothing behind;
- a start whose clone hangs, cancelled by the client (`notifications/cancelled`), ends at once
  with its supervisor and guest, and leaves nothing behind; so does one whose server is killed
  (SIGKILL, no chance to cancel): its supervisor notices that nobody waits for the start;
- an https URL with credentials is refused without repeating them.

Traffic stays on loopback: every name a test uses is resolved through DYNOCAP_RESOLVE to the
fixture's 127.X.Y.Z (or, for the conftest's other test names, to a loopback address nothing
listens on), so no DNS query or packet leaves the machine. Needs root."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession

from conftest import Host, connect, err, need, ok, text_of
from netfix import GIT_HOST, NPM_HOST, OTHER_HOST, REPO, REPO_FILES, SSH_USER, NetFix

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

# What a task's tree must list: the served `main` exactly.
LIST_FILES = "find . -path ./.git -prune -o -type f -print | sort"
# A git smart-HTTP request the fixture answers with 200.
INFO_REFS = f"https://{GIT_HOST}/{REPO}/info/refs?service=git-upload-pack"


def server_env(host: Host, fix: NetFix, **flags: str) -> dict[str, str]:
    """The server's environment: git.test is a trusted git host, every fixture name resolves
    to the fixture (after the conftest's loopback sinks for the other names), the guest trusts
    the test CA; plus `flags`."""
    return {**fix.product_env(host.env()["DYNOCAP_RESOLVE"]), "DYNOCAP_MCP_GIT_HOSTS": GIT_HOST,
            **flags}


async def sh(s: ClientSession, task: str, command: str) -> dict[str, Any]:
    return ok(await s.call_tool("dynocap_task_exec", {"name": task, "command": command, "timeoutSeconds": 60}))


async def ok_sh(s: ClientSession, task: str, command: str) -> str:
    out = await sh(s, task, command)
    assert out["exitCode"] == 0, (command, out["stdout"], out["stderr"])
    return out["stdout"]


async def assert_clone_is_the_baseline(s: ClientSession, fix: NetFix, task: dict[str, Any]) -> None:
    """The task holds `main`'s tree exactly, at its commit; a change shows alone in the diff
    and finish verifies it."""
    name = task["name"]
    assert task["source"]["baseCommit"] == fix.head, task
    assert (await ok_sh(s, name, LIST_FILES)).splitlines() == sorted(f"./{p}" for p in REPO_FILES)
    for path, content in REPO_FILES.items():
        assert await ok_sh(s, name, f"cat {path}") == content
    assert (await ok_sh(s, name, "git rev-parse HEAD")).strip() == fix.head
    await ok_sh(s, name, "echo changed >> README.md")
    diff = await s.call_tool("dynocap_diff", {"target": name})
    assert not diff.is_error, text_of(diff)
    assert diff.structured_content["files"] == 1, diff.structured_content
    patch = diff.structured_content["patch"]
    assert "README.md" in patch and "+changed" in patch, patch


async def finish(s: ClientSession, name: str) -> dict[str, Any]:
    done = ok(await s.call_tool("dynocap_task_finish", {"id": name}))
    assert done["state"] == "finished" and done["verified"] is True, done
    return done


async def test_https_clone_then_no_egress(host: Host, fix: NetFix) -> None:
    url = fix.https_repo_url()
    async with connect(host, env=server_env(host, fix)) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"repositoryUrl": url, "name": "https"}))
        assert task["network"] == "none", task
        assert task["source"]["repositoryUrl"] == url, task
        clone = [r for r in fix.requests() if r["path"].startswith(f"/{REPO}/")]
        assert clone and all(r["sni"] == GIT_HOST for r in clone), fix.https_entries()
        seen = len(fix.https_entries())

        # No egress after the clone: no name server, and the fixture's address inside the
        # guest's own network namespace is only the guest's loopback, where nothing listens.
        by_name = await sh(s, "https", f"curl -sS --max-time 10 {INFO_REFS}")
        assert by_name["exitCode"] == 6, by_name  # curl: could not resolve host
        by_addr = await sh(s, "https",
                           f"curl -sS --max-time 10 --resolve {GIT_HOST}:443:{fix.addr} {INFO_REFS}")
        assert by_addr["exitCode"] == 7, by_addr  # curl: could not connect

        await assert_clone_is_the_baseline(s, fix, task)
        done = await finish(s, "https")
        # The clone's connections are all the task ever made: the curls above never reached
        # the proxy, not even to be refused.
        assert {h["host"] for h in done["network"]["hostsReached"]} == {GIT_HOST}, done["network"]
        assert done["network"]["refusals"]["count"] == 0, done["network"]
    # Nothing reached the server after the clone, not even a failed handshake.
    assert fix.https_entries()[seen:] == []


async def test_filtered_clone_reaches_its_allowlist_only(host: Host, fix: NetFix) -> None:
    url = fix.https_repo_url()
    async with connect(host, env=server_env(host, fix, DYNOCAP_MCP_ALLOW_FILTERED="1")) as s:
        task = ok(await s.call_tool("dynocap_task_start",
                                    {"repositoryUrl": url, "name": "filtered", "network": "filtered"}))
        assert task["network"] == "filtered", task
        assert sorted(task["egressAllowlist"]) == sorted([GIT_HOST, NPM_HOST]), task

        # The git host, by curl and by git itself through the proxy settings the task has.
        status = "curl -sS --max-time 20 -o /dev/null -w '%{http_code}'"
        assert await ok_sh(s, "filtered", f"{status} '{INFO_REFS}'") == "200"
        refs = await ok_sh(s, "filtered", f"git ls-remote {url}")
        assert f"{fix.head}\trefs/heads/main" in refs, refs
        # The npm registry is on the list too (the fixture serves its package document).
        assert await ok_sh(s, "filtered", f"{status} https://{NPM_HOST}/dynocap-fixture") == "200"

        # A host off the list: the proxy answers CONNECT with 403 and never dials it.
        before = len(fix.https_entries())
        other = await sh(s, "filtered",
                         f"curl -sS --max-time 20 -o /dev/null -w '%{{http_connect}}' https://{OTHER_HOST}/")
        assert other["exitCode"] != 0 and other["stdout"] == "403", other
        assert fix.https_entries()[before:] == []

        await assert_clone_is_the_baseline(s, fix, task)
        done = await finish(s, "filtered")
    reached = {h["host"] for h in done["network"]["hostsReached"]}
    assert GIT_HOST in reached and OTHER_HOST not in reached, done["network"]
    refusals = done["network"]["refusals"]
    assert refusals["count"] >= 1 and OTHER_HOST in {r["host"] for r in refusals["first"]}, refusals


async def test_exec_results_list_the_connections_refused_while_they_ran(host: Host, fix: NetFix) -> None:
    """A raw `filtered` sandbox: dynocap_exec's structured result names each refused host with
    its port, reason, count and, for a host off the allowlist, what allows it from here: the
    caller's own allowHosts when DYNOCAP_MCP_EGRESS_ALLOW covers the host, else the server's
    settings; a job's result (dynocap_job, once it ended) lists them the same way. Following the
    fix, a new sandbox reaches the host, and its command, refused
    nothing, has no networkRefusals. Every refusal happens at the CONNECT: nothing reaches the
    fixture."""
    env = server_env(host, fix, DYNOCAP_MCP_ALLOW_FILTERED="1", DYNOCAP_MCP_EGRESS_ALLOW=OTHER_HOST)
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_run", {"name": "refusals", "network": "filtered"}))
        before = len(fix.https_entries())
        refused = ok(await s.call_tool("dynocap_exec", {
            "name": "refusals",
            "command": f"curl -sS https://{OTHER_HOST}/; curl -sS https://{OTHER_HOST}/; "
                       f"curl -sS https://{GIT_HOST}/; curl -sS https://{NPM_HOST}:8443/",
            "timeoutSeconds": 60,
        }))
        assert refused["exitCode"] != 0, refused
        by_target = {(r["host"], r["port"]): r for r in refused["networkRefusals"]}
        assert set(by_target) == {(OTHER_HOST, 443), (GIT_HOST, 443), (NPM_HOST, 8443)}, refused
        other = by_target[(OTHER_HOST, 443)]
        assert other["count"] == 2, other
        assert other["reason"] == f"{OTHER_HOST} is not on this sandbox's allowlist", other
        assert other["fix"].startswith(f'start a new sandbox with allowHosts: ["{OTHER_HOST}"]'), other
        git = by_target[(GIT_HOST, 443)]
        assert git["count"] == 1, git
        assert f"add {GIT_HOST} to DYNOCAP_MCP_EGRESS_ALLOW in the server's environment" in git["fix"], git
        assert "DYNOCAP_EGRESS_ALLOW (every filtered sandbox" in git["fix"], git
        for entry in (other, git):
            assert "--allow-host" not in entry["fix"], entry
        port = by_target[(NPM_HOST, 8443)]
        assert port["count"] == 1 and "port 8443 is not allowed" in port["reason"], port
        assert "fix" not in port, port
        assert "networkRefusalsOmitted" not in refused, refused
        # A job's result, once it ended, lists them the same way, the fix spelt for here.
        started = ok(await s.call_tool("dynocap_exec", {
            "name": "refusals", "command": f"curl -sS https://{OTHER_HOST}/; echo done",
            "background": True,
        }))
        assert started["running"] is True, started
        report = started
        while report["running"]:
            report = ok(await s.call_tool("dynocap_job", {"name": "refusals", "job": started["job"],
                                                          "waitSeconds": 30}))
        assert report["state"] == "exited" and report["stdout"] == "done\n", report
        assert [(r["host"], r["port"], r["count"]) for r in report["networkRefusals"]] == \
            [(OTHER_HOST, 443, 1)], report
        assert report["networkRefusals"][0]["fix"] == other["fix"], report
        assert fix.https_entries()[before:] == []
        ok(await s.call_tool("dynocap_destroy", {"name": "refusals"}))

        ok(await s.call_tool("dynocap_run", {"name": "allowed", "network": "filtered",
                                             "allowHosts": [OTHER_HOST]}))
        reached = ok(await s.call_tool("dynocap_exec", {
            "name": "allowed",
            "command": f"curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' https://{OTHER_HOST}/",
            "timeoutSeconds": 60,
        }))
        assert reached["exitCode"] == 0 and reached["stdout"] == "200", reached
        assert "networkRefusals" not in reached, reached
        ok(await s.call_tool("dynocap_destroy", {"name": "allowed"}))


async def test_a_registry_host_the_server_allows_alone_is_fixed_by_that_host(host: Host, fix: NetFix) -> None:
    """DYNOCAP_MCP_EGRESS_ALLOW=pypi.org covers pypi.org but not @pypi (files.pythonhosted.org
    is outside it): the refusal of pypi.org tells the caller the allowHosts it can pass, the
    host, and what the whole registry needs; the refusal of files.pythonhosted.org, which the
    caller cannot add, names the server's setting. The fix given is one the server accepts.
    Both refusals happen at the CONNECT: no name is resolved."""
    env = server_env(host, fix, DYNOCAP_MCP_ALLOW_FILTERED="1", DYNOCAP_MCP_EGRESS_ALLOW="pypi.org")
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_run", {"name": "partial", "network": "filtered"}))
        refused = ok(await s.call_tool("dynocap_exec", {
            "name": "partial",
            "command": "curl -sS https://pypi.org/simple/; curl -sS https://files.pythonhosted.org/",
            "timeoutSeconds": 60,
        }))
        fixes = {r["host"]: r["fix"] for r in refused["networkRefusals"]}
        assert set(fixes) == {"pypi.org", "files.pythonhosted.org"}, refused
        assert fixes["pypi.org"].startswith('start a new sandbox with allowHosts: ["pypi.org"]'), fixes
        assert "add @pypi to DYNOCAP_MCP_EGRESS_ALLOW" in fixes["pypi.org"], fixes
        assert fixes["files.pythonhosted.org"].startswith(
            "the person running this MCP server can allow it: add @pypi to DYNOCAP_MCP_EGRESS_ALLOW"), fixes
        ok(await s.call_tool("dynocap_destroy", {"name": "partial"}))
        followed = ok(await s.call_tool("dynocap_run", {"name": "followed", "network": "filtered",
                                                        "allowHosts": ["pypi.org"]}))
        assert "pypi.org" in followed["egressAllowlist"], followed
        ok(await s.call_tool("dynocap_destroy", {"name": "followed"}))


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and needle in p.read_bytes()]


async def test_ssh_clone_with_a_key(host: Host, fix: NetFix) -> None:
    # The product trusts the host keys of the known_hosts of the user running it.
    (host.home / ".ssh" / "known_hosts").write_text(fix.known_hosts_line())
    url = fix.ssh_repo_url()
    # The key's second line: base64 found nowhere else.
    marker = fix.key.read_text().splitlines()[1]
    texts: list[str] = []

    async def start(s: ClientSession, **args: Any) -> Any:
        result = await s.call_tool("dynocap_task_start", {"repositoryUrl": url, **args})
        texts.append(text_of(result))
        return result

    sshd_before = fix.ssh_connections()
    async with connect(host, env=server_env(host, fix)) as s:
        text = err(await start(s, sshKeyPath=str(fix.key), name="nokey"), "policy_denied")
        assert "DYNOCAP_MCP_ALLOW_SSH_KEY" in text, text
    assert fix.ssh_connections() == sshd_before, fix.sshd_log()

    async with connect(host, env=server_env(host, fix, DYNOCAP_MCP_ALLOW_SSH_KEY="1")) as s:
        task = ok(await start(s, sshKeyPath=str(fix.key), name="ssh"))
        # The product records every URL with its userinfo masked (it may hold a token); for
        # ssh that is the user name.
        assert task["source"]["repositoryUrl"] == url.replace(f"{SSH_USER}@", "***@"), task
        assert "Accepted publickey" in fix.sshd_log(), fix.sshd_log()
        await assert_clone_is_the_baseline(s, fix, task)
        done = await finish(s, "ssh")
        texts.append(str(done))

        # A key with a passphrase: refused with a clear message before any connection, and
        # no task is left.
        sshd_before = fix.ssh_connections()
        text = err(await start(s, sshKeyPath=str(fix.passphrase_key), name="locked"), "invalid_argument")
        assert "protected by a passphrase" in text and str(fix.passphrase_key) in text, text
        assert fix.ssh_connections() == sshd_before, fix.sshd_log()
        listed = ok(await s.call_tool("dynocap_ls", {}))
        assert [t["name"] for t in listed["tasks"]] == ["ssh"], listed
        texts.append(str(listed))

    for where, text in [*(("a result", t) for t in texts), ("the server log", host.server_log()),
                        ("sshd's log", fix.sshd_log())]:
        assert marker not in text, f"the key's content in {where}"
    assert files_containing(host.state, marker.encode()) == []


async def test_a_failed_clone_leaves_nothing(host: Host, fix: NetFix) -> None:
    missing = fix.https_repo_url("missing.git")
    async with connect(host, env=server_env(host, fix)) as s:
        result = await s.call_tool("dynocap_task_start", {"repositoryUrl": missing, "name": "clone"})
        text = err(result, "internal")
        # git's own message.
        assert "not found" in text and "missing.git" in text, text
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}
        # The name was never taken.
        task = ok(await s.call_tool("dynocap_task_start",
                                    {"repositoryUrl": fix.https_repo_url(), "name": "clone"}))
        assert task["source"]["baseCommit"] == fix.head, task


def supervisor_pids(host: Host) -> list[int]:
    """Pids of the supervisors the home's catalog names."""
    with sqlite3.connect(host.state / "catalog.db") as db:
        rows = db.execute("SELECT supervisor_pid FROM sandboxes WHERE supervisor_pid IS NOT NULL")
        return [int(pid) for (pid,) in rows]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


async def test_a_cancelled_start_whose_clone_hangs_leaves_nothing(host: Host, fix: NetFix) -> None:
    hanging = f"https://{GIT_HOST}/hang/{REPO}"
    processes: list[int] = []
    async with connect(host, env=server_env(host, fix)) as s:
        with anyio.CancelScope() as scope:
            async def cancel_once_the_clone_hangs() -> None:
                with anyio.fail_after(300):
                    while not any(r["path"].startswith("/hang/") for r in fix.requests()):
                        await anyio.sleep(0.2)
                for pid in supervisor_pids(host):
                    processes.extend([pid, *descendants(pid)])
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_once_the_clone_hangs)
                await s.call_tool("dynocap_task_start", {"repositoryUrl": hanging, "name": "hangs"})
        assert scope.cancelled_caught
        assert processes, "no supervisor was running while the clone hung"
        with anyio.fail_after(30):
            while any(Path(f"/proc/{pid}").exists() for pid in processes):
                await anyio.sleep(0.2)
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}
        assert list((host.state / "sandboxes").iterdir()) == []
        # The name is free.
        task = ok(await s.call_tool("dynocap_task_start",
                                    {"repositoryUrl": fix.https_repo_url(), "name": "hangs"}))
        assert task["source"]["baseCommit"] == fix.head, task
    assert "dynocap_task_start cancelled by the client" in host.server_log()


def running(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for a late reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except (OSError, IndexError):
        return False


def home_processes(host: Host) -> list[str]:
    """The running processes naming the home (state dir) in their command line, environment,
    working directory, root or open files: every host process of its sandboxes and servers."""
    needle = str(host.state)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid() or not running(int(entry)):
            continue
        proc = Path(f"/proc/{entry}")
        texts = []
        for name in ("cmdline", "environ"):
            try:
                texts.append((proc / name).read_bytes().decode(errors="replace"))
            except OSError:
                pass
        links = [proc / "cwd", proc / "root"]
        try:
            links += list((proc / "fd").iterdir())
        except OSError:
            pass
        for link in links:
            try:
                texts.append(os.readlink(link))
            except OSError:
                pass
        if any(needle in text for text in texts):
            found.append(f"{entry}: {texts[0].replace(chr(0), ' ') if texts else '?'}")
    return found


async def test_a_start_whose_server_is_killed_ends_and_leaves_nothing(host: Host, fix: NetFix) -> None:
    """SIGKILL of `dynocap mcp` in the middle of a `dynocap_task_start` (no chance to cancel):
    the supervisor sees that nobody waits for its start and removes it, guest and record."""
    hanging = f"https://{GIT_HOST}/hang/{REPO}"
    processes: list[int] = []
    killed: list[int] = []
    try:
        async with connect(host, env=server_env(host, fix)) as s:
            with anyio.CancelScope() as scope:
                async def kill_the_server_once_the_clone_hangs() -> None:
                    with anyio.fail_after(300):
                        while not any(r["path"].startswith("/hang/") for r in fix.requests()):
                            await anyio.sleep(0.2)
                    for pid in supervisor_pids(host):
                        processes.extend([pid, *descendants(pid)])
                    server = int(Path(f"/proc/{processes[0]}/stat").read_text()
                                 .rsplit(")", 1)[1].split()[1])
                    assert b"mcp" in Path(f"/proc/{server}/cmdline").read_bytes()
                    os.kill(server, 9)
                    killed.append(server)
                    # The session cannot end by itself once its server is gone.
                    with anyio.fail_after(60):
                        while running(server):
                            await anyio.sleep(0.1)
                    scope.cancel()

                async with anyio.create_task_group() as group:
                    group.start_soon(kill_the_server_once_the_clone_hangs)
                    await s.call_tool("dynocap_task_start", {"repositoryUrl": hanging, "name": "hangs"})
    except Exception:  # noqa: BLE001 - a session whose server was killed ends in an error
        pass
    assert killed, "the server was never killed"
    with anyio.fail_after(120):
        while home_processes(host):
            await anyio.sleep(0.2)
    assert not [pid for pid in processes if running(pid)]
    assert host.cli("ls") == {"tasks": [], "sandboxes": []}
    assert list((host.state / "sandboxes").iterdir()) == []
    results = host.state / "results"
    assert not results.exists() or list(results.iterdir()) == []
    # The name is free.
    async with connect(host, env=server_env(host, fix)) as s:
        task = ok(await s.call_tool("dynocap_task_start",
                                    {"repositoryUrl": fix.https_repo_url(), "name": "hangs"}))
        assert task["source"]["baseCommit"] == fix.head, task


async def test_credentials_in_a_url_are_refused_and_not_repeated(host: Host, fix: NetFix) -> None:
    token = "ghp_McpS3cretTok3nNeverShown"
    async with connect(host, env=server_env(host, fix)) as s:
        for url in (f"https://user:{token}@{GIT_HOST}/{REPO}", f"https://{token}@{GIT_HOST}",
                    f"https://user:{token}@{GIT_HOST}//x"):
            result = await s.call_tool("dynocap_task_start", {"repositoryUrl": url, "name": "x"})
            assert result.is_error, result
            assert token not in text_of(result), text_of(result)
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}
    assert token not in host.server_log()
    assert files_containing(host.state, token.encode()) == []
