"""Raw sandbox tools over MCP: dynocap_run, dynocap_exec, dynocap_ps, dynocap_destroy. Happy
paths, every default, range edges, names, errors for unknown names, the network flags, and
cancellation of a running exec."""

from __future__ import annotations

import json
import re

import anyio
import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


async def test_run_exec_ps_destroy_with_defaults(host: Host) -> None:
    async with connect(host) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "web"}))
        assert {k: box[k] for k in ("name", "state", "network", "cpus", "memoryMB", "ttlSeconds")} == {
            "name": "web", "state": "running", "network": "none", "cpus": 1, "memoryMB": 1024,
            "ttlSeconds": 1800,
        }
        assert box["diskMB"] == 10240  # the extension's default
        assert box["backend"] in ("jail", "vm")
        assert RFC3339.match(box["createdAt"]) and RFC3339.match(box["expiresAt"])

        result = ok(await s.call_tool("dynocap_exec", {"name": "web", "command": "pwd; echo out; echo err >&2; exit 3"}))
        assert result["stdout"] == "/\nout\n"  # default cwd /
        assert result["stderr"] == "err\n"
        assert (result["exitCode"], result["signal"], result["timedOut"], result["truncated"]) == (3, None, False, False)
        assert isinstance(result["durationMs"], int)
        assert "transcript" not in result

        listed = ok(await s.call_tool("dynocap_ps", {}))
        assert [b["name"] for b in listed["sandboxes"]] == ["web"]
        assert listed["sandboxes"][0] == box

        assert ok(await s.call_tool("dynocap_destroy", {"name": "web"})) == {"destroyed": "web"}
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
        err(await s.call_tool("dynocap_exec", {"name": "web", "command": "true"}), "not_found")


async def test_explicit_values_and_ttl_edges(host: Host) -> None:
    async with connect(host) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "a", "ttlSeconds": 30, "cpus": 2, "memoryMB": 64, "diskMB": 64}))
        assert (box["ttlSeconds"], box["cpus"], box["memoryMB"], box["diskMB"]) == (30, 2, 64, 64)
        # Integral floats are whole numbers.
        box = ok(await s.call_tool("dynocap_run", {"name": "b", "ttlSeconds": 86400.0, "network": "none"}))
        assert box["ttlSeconds"] == 86400
        for bad in (29, 86401, 30.5):
            text = err(await s.call_tool("dynocap_run", {"name": "c", "ttlSeconds": bad}), "invalid_argument")
            assert "ttlSeconds" in text
        names = [b["name"] for b in ok(await s.call_tool("dynocap_ps", {}))["sandboxes"]]
        assert sorted(names) == ["a", "b"]


async def test_exec_options(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "x"}))
        result = ok(await s.call_tool("dynocap_exec", {
            "name": "x", "command": 'pwd; echo "$GREETING $OTHER"', "cwd": "/tmp",
            "env": {"GREETING": "hello", "OTHER": "world"}}))
        assert result["stdout"] == "/tmp\nhello world\n"
        tty = ok(await s.call_tool("dynocap_exec", {
            "name": "x", "command": "test -t 1 && echo is-a-tty; echo to-stderr >&2", "terminal": True}))
        assert "stdout" not in tty and "stderr" not in tty
        assert "is-a-tty" in tty["transcript"] and "to-stderr" in tty["transcript"]
        timed = ok(await s.call_tool("dynocap_exec", {
            "name": "x", "command": "echo before; sleep 30; echo after", "timeoutSeconds": 1}))
        assert timed["timedOut"] is True  # a timeout is a result, not an error
        assert timed["stdout"] == "before\n"
        assert timed["durationMs"] < 10_000
        err(await s.call_tool("dynocap_exec", {"name": "x", "command": "true", "cwd": "/nonexistent"}),
            "invalid_argument")


async def test_default_exec_timeout_is_30_seconds(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "slow"}))
        with anyio.fail_after(60):
            result = ok(await s.call_tool("dynocap_exec", {"name": "slow", "command": "sleep 45"}))
        assert result["timedOut"] is True
        assert 29_000 <= result["durationMs"] <= 40_000, result


async def test_names_and_errors(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "dup"}))
        text = err(await s.call_tool("dynocap_run", {"name": "dup"}), "conflict")
        assert "dup" in text
        for bad in ("UPPER", "-dash", "a b", "a/b", "x" * 64, "sbx-1", "task-1"):
            err(await s.call_tool("dynocap_run", {"name": bad}), "invalid_argument")
        ok(await s.call_tool("dynocap_run", {"name": "0.a_b-c"}))
        err(await s.call_tool("dynocap_exec", {"name": "ghost", "command": "true"}), "not_found")
        err(await s.call_tool("dynocap_destroy", {"name": "ghost"}), "not_found")
        # Raw tools refuse tasks' names and the other way round, with the right tool named.
        text = err(await s.call_tool("dynocap_task_exec", {"name": "dup", "command": "true"}), "conflict")
        assert "exec" in text
        err(await s.call_tool("dynocap_diff", {"target": "dup"}), "conflict")


async def test_network_flags_for_run(host: Host) -> None:
    async with connect(host) as s:
        for mode, var in (("filtered", "DYNOCAP_MCP_ALLOW_FILTERED"), ("nat", "DYNOCAP_MCP_ALLOW_NAT")):
            text = err(await s.call_tool("dynocap_run", {"name": "n", "network": mode}), "policy_denied")
            assert f"{var}=1" in text
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
    log = host.server_log()
    assert "[rule network.filtered]" in log and "[rule network.nat]" in log
    flags = {"DYNOCAP_MCP_ALLOW_FILTERED": "1", "DYNOCAP_MCP_ALLOW_NAT": "1"}
    async with connect(host, env=flags) as s:
        for mode in ("filtered", "nat"):
            # Allowed by the host, not built yet: a clear internal error, never a downgrade.
            text = err(await s.call_tool("dynocap_run", {"name": "n", "network": mode}), "internal")
            assert "not available" in text
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
        ok(await s.call_tool("dynocap_run", {"name": "n", "network": "none"}))


async def test_cancelled_exec_is_killed(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "c"}))
        with anyio.move_on_after(3) as scope:
            await s.call_tool("dynocap_exec", {"name": "c", "command": "sleep 100", "timeoutSeconds": 600})
        assert scope.cancelled_caught
        # The process is gone (give the supervisor a moment to reap it).
        procs = ""
        for _ in range(20):
            procs = ok(await s.call_tool("dynocap_exec", {"name": "c", "command": "ps -eo args"}))["stdout"]
            if "sleep 100" not in procs:
                break
            await anyio.sleep(0.25)
        assert "sleep 100" not in procs, procs
        # The session and the sandbox keep working.
        assert ok(await s.call_tool("dynocap_exec", {"name": "c", "command": "echo alive"}))["stdout"] == "alive\n"
    assert "cancelled by the client" in host.server_log()


async def test_client_going_away_kills_its_exec(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "g"}))
        with anyio.move_on_after(2):
            async with connect(host) as other:
                await other.call_tool("dynocap_exec", {"name": "g", "command": "sleep 101", "timeoutSeconds": 600})
        procs = ""
        for _ in range(40):
            procs = ok(await s.call_tool("dynocap_exec", {"name": "g", "command": "ps -eo args"}))["stdout"]
            if "sleep 101" not in procs:
                break
            await anyio.sleep(0.25)
        assert "sleep 101" not in procs, procs


async def test_structured_and_text_agree_for_every_raw_tool(host: Host) -> None:
    async with connect(host) as s:
        for tool, args in (("dynocap_run", {"name": "t"}),
                           ("dynocap_exec", {"name": "t", "command": "echo '{\"a\": 1}'"}),
                           ("dynocap_ps", {}), ("dynocap_ls", {}),
                           ("dynocap_destroy", {"name": "t"})):
            result = await s.call_tool(tool, args)
            assert json.loads(result.content[0].text) == ok(result), tool
