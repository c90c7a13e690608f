"""Raw sandbox tools over MCP: dynocap_run, dynocap_exec, dynocap_ps, dynocap_destroy. Happy
paths, every default, range edges, names, errors for unknown names, the network flags, and
cancellation of a running exec, and a run whose server is killed while it starts."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import time

from pathlib import Path
from typing import Any

import anyio
import pytest

from conftest import Host, connect, err, need, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


async def test_run_exec_ps_destroy_with_defaults(host: Host) -> None:
    async with connect(host) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "web"}))
        assert {k: box[k] for k in ("name", "state", "network", "cpus", "memoryMB", "ttlSeconds")} == {
            "name": "web", "state": "running", "network": "none", "cpus": 1, "memoryMB": 1024,
            "ttlSeconds": 1800,
        }
        assert box["diskMB"] == 2048  # the extension's default
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


async def test_results_name_the_image_and_dynocap_image_sets_the_default(host: Host) -> None:
    async with connect(host) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "plain"}))
        assert box["image"] == "host" and "imageId" not in box
        ok(await s.call_tool("dynocap_destroy", {"name": "plain"}))
    # The operator's DYNOCAP_IMAGE is the server's default; one that is not built is refused
    # with the command that builds it, and nothing starts.
    async with connect(host, env={"DYNOCAP_IMAGE": "debian"}) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "deb"}), "invalid_argument")
        assert "dynocap image build debian" in text
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}


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


async def test_output_keeps_head_and_tail_and_can_be_bytes(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "out"}))
        # A long build log: the default keeps 8 KiB of head and 24 KiB of tail.
        log = ok(await s.call_tool("dynocap_exec", {
            "name": "out", "command": "seq 1 200000; echo 'error: the real failure' >&2; seq 1 50000 >&2"}))
        assert log["truncated"] is True and log["oomKilled"] is False
        assert log["stdout"].startswith("1\n2\n3\n") and log["stdout"].endswith("\n199999\n200000\n")
        assert re.search(r"\[… [0-9,]+ bytes omitted …\]", log["stdout"]), log["stdout"][8000:8300]
        assert 32 * 1024 <= len(log["stdout"].encode()) < 32 * 1024 + 100
        # The tail starts at a whole line, not inside one.
        first, second = log["stdout"].split("omitted …]\n", 1)[1].split("\n")[:2]
        assert int(first) + 1 == int(second), (first, second)
        # The head ends at one: its last line is whole (line N reads N, not the `1` of a cut
        # `1234`), and the marker follows it with no empty line between.
        head = log["stdout"].split("[… ", 1)[0]
        assert head.endswith("\n") and not head.endswith("\n\n"), head[-40:]
        lines = head.split("\n")[:-1]
        assert lines[-1] == str(len(lines)), lines[-3:]
        assert "error: the real failure" in log["stderr"] and log["stderr"].endswith("\n50000\n")
        # maxOutputBytes asks for more, within its range.
        more = ok(await s.call_tool("dynocap_exec", {
            "name": "out", "command": "seq 1 200000", "maxOutputBytes": 1048576}))
        assert more["truncated"] is True and more["stdout"].endswith("\n200000\n")
        assert len(more["stdout"].encode()) > 1_000_000
        whole = ok(await s.call_tool("dynocap_exec", {
            "name": "out", "command": "seq 1 1000", "maxOutputBytes": 1048576}))
        assert whole["truncated"] is False and whole["stdout"] == "".join(f"{i}\n" for i in range(1, 1001))
        err(await s.call_tool("dynocap_exec", {"name": "out", "command": "true", "maxOutputBytes": 0}),
            "invalid_argument")
        err(await s.call_tool("dynocap_exec", {"name": "out", "command": "true", "maxOutputBytes": 1048577}),
            "invalid_argument")
        # Binary output, byte for byte.
        raw = ok(await s.call_tool("dynocap_exec", {
            "name": "out", "command": "printf '\\000\\377\\200ok'", "outputEncoding": "base64"}))
        import base64
        assert base64.b64decode(raw["stdout"]) == b"\x00\xff\x80ok"
        lossy = ok(await s.call_tool("dynocap_exec", {"name": "out", "command": "printf '\\377ok'"}))
        assert lossy["stdout"] == "\ufffdok"
        err(await s.call_tool("dynocap_exec", {"name": "out", "command": "true", "outputEncoding": "hex"}),
            "invalid_argument")


async def test_a_running_exec_reports_progress_with_its_latest_output(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "prog"}))
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message))

        result = await s.call_tool(
            "dynocap_exec",
            {"name": "prog", "timeoutSeconds": 60,
             "command": "for i in 1 2 3 4 5 6 7 8; do echo \"\\033[1mbuilding part $i\\033[0m\"; sleep 1; done"},
            progress_callback=on_progress)
        assert ok(result)["stdout"].count("building part") == 8
        await anyio.sleep(0.2)  # notifications are delivered on their own task
        assert seen, "progress arrived while the command ran"
        progresses = [p for p, _, _ in seen]
        assert progresses == sorted(progresses) and len(set(progresses)) == len(progresses)
        assert all(total == 60 for _, total, _ in seen)
        messages = [m or "" for _, _, m in seen]
        assert any("building part" in m for m in messages), messages
        assert all("\x1b" not in m for m in messages), "escapes are stripped"


async def test_progress_keeps_a_command_longer_than_the_clients_timeout_alive(host: Host) -> None:
    """A client that resets its request timeout on every progress notification (as the MCP
    TypeScript SDK's resetTimeoutOnProgress does) never gives up on a command that runs longer
    than that timeout: the server reports progress while the command runs."""
    client_timeout = 10.0
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "long"}))
        last = anyio.current_time()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            nonlocal last
            last = anyio.current_time()

        result: Any = None
        async with anyio.create_task_group() as group:
            async def call() -> None:
                nonlocal result
                result = await s.call_tool(
                    "dynocap_exec",
                    {"name": "long", "command": "sleep 25; echo done", "timeoutSeconds": 120},
                    progress_callback=on_progress)
                group.cancel_scope.cancel()

            group.start_soon(call)
            while True:
                await anyio.sleep(0.5)
                silent = anyio.current_time() - last
                assert silent < client_timeout, f"no progress for {silent:.1f}s: such a client gives up"
        assert ok(result)["stdout"] == "done\n"


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
        text = err(await s.call_tool("dynocap_exec", {"name": "ghost", "command": "true"}), "not_found")
        assert "dynocap " not in text, "an MCP error names no CLI command"
        near = err(await s.call_tool("dynocap_exec", {"name": "0.a_b-d", "command": "true"}), "not_found")
        assert 'did you mean "0.a_b-c"' in near, near
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
    async with connect(host, env=dict(flags, DYNOCAP_EGRESS_ALLOW="files.test")) as s:
        # Allowed by the host: the mode asked for, with its allowlist in the result.
        sandbox = ok(await s.call_tool("dynocap_run", {"name": "n", "network": "filtered"}))
        assert sandbox["network"] == "filtered"
        assert sandbox["egressAllowlist"] == ["registry.npmjs.org", "files.test"]
        listed = ok(await s.call_tool("dynocap_ps", {}))["sandboxes"]
        assert [x["egressAllowlist"] for x in listed] == [["registry.npmjs.org", "files.test"]]
        # A refusal comes back to the command as the proxy's reason (no packet leaves: the
        # proxy refuses before resolving anything).
        out = ok(await s.call_tool("dynocap_exec", {"name": "n", "command": "curl -sS https://other.test/ 2>&1; true"}))
        assert "403" in out["stdout"], out
        ok(await s.call_tool("dynocap_destroy", {"name": "n"}))


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


class NetnsHost:
    """A network namespace standing in for the host (`H`) and one for a test server (`S`), on a
    veth pair in 198.51.100.0/24 (a documentation range, only inside these namespaces); H's
    default route leads to S and nowhere else. H has a server on its own loopback. Deleted on
    exit, also after a failure."""

    def __init__(self) -> None:
        tag = f"{os.getpid()}m{next(NetnsHost._count)}"
        self.h, self.s = f"dmh{tag}", f"dms{tag}"
        self.server: subprocess.Popen[bytes] | None = None

    _count = itertools.count()

    def __enter__(self) -> "NetnsHost":
        need(shutil.which("pasta") is not None, "pasta is missing (apt-get install passt)")
        try:
            for cmd in (f"netns add {self.h}", f"netns add {self.s}",
                        f"-n {self.h} link set lo up", f"-n {self.s} link set lo up",
                        f"-n {self.h} link add veth-h type veth peer name veth-s",
                        f"-n {self.h} link set veth-s netns {self.s}",
                        f"-n {self.h} addr add 198.51.100.1/24 dev veth-h",
                        f"-n {self.s} addr add 198.51.100.2/24 dev veth-s",
                        f"-n {self.h} link set veth-h up", f"-n {self.s} link set veth-s up",
                        f"-n {self.h} route add default via 198.51.100.2"):
                subprocess.run(["ip", *cmd.split()], check=True)
            self.server = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{self.h}", "--", "python3", "-m", "http.server", "8081",
                 "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            probe = ["nsenter", f"--net=/run/netns/{self.h}", "--", "curl", "-sf", "-m", "2",
                     "-o", "/dev/null", "http://127.0.0.1:8081/"]
            for _ in range(100):
                if subprocess.run(probe).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("H's loopback server did not come up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
        for ns in (self.h, self.s):
            subprocess.run(["ip", "netns", "delete", ns], stderr=subprocess.DEVNULL)

    def wrap(self) -> tuple[str, ...]:
        """Runs the MCP server in H (network only; `ip netns exec` would hide the cgroups)."""
        return ("nsenter", f"--net=/run/netns/{self.h}", "--")


async def test_nat_run_works_when_allowed(host: Host) -> None:
    with NetnsHost() as world:
        async with connect(host, wrap=world.wrap()) as s:
            err(await s.call_tool("dynocap_run", {"name": "n", "network": "nat"}), "policy_denied")
        async with connect(host, env={"DYNOCAP_MCP_ALLOW_NAT": "1"}, wrap=world.wrap()) as s:
            box = ok(await s.call_tool("dynocap_run", {"name": "n", "network": "nat"}))
            assert box["network"] == "nat"
            assert ok(await s.call_tool("dynocap_ps", {}))["sandboxes"][0]["network"] == "nat"

            async def sh(command: str) -> dict:
                return ok(await s.call_tool("dynocap_exec", {"name": "n", "command": command}))

            route = await sh("ip route show default")
            assert "via 198.51.100.2" in route["stdout"], route
            links = await sh("ip -o link show | awk -F': ' '{print $2}'")
            assert links["stdout"].split() == ["lo", "veth-h"], links
            # H's loopback server answers in H (checked above) but not from the guest.
            for target in ("127.0.0.1", "198.51.100.1"):
                got = await sh(f"curl -sS -m 5 http://{target}:8081/")
                assert got["exitCode"] != 0, got
            ok(await s.call_tool("dynocap_destroy", {"name": "n"}))


async def test_a_warm_pool_boots_with_the_server_and_serves_run(host: Host) -> None:
    async with connect(host, env={"DYNOCAP_WARM_POOL": "1"}) as s:
        # The server boots the pool when it starts, before any call.
        deadline = time.monotonic() + 60
        while (host.cli("pool") or {}).get("pool", {}).get("ready") != 1:
            assert time.monotonic() < deadline, host.cli("pool")
            await anyio.sleep(0.1)
        box = ok(await s.call_tool("dynocap_run", {"name": "pooled", "memoryMB": 512, "ttlSeconds": 90}))
        assert (box["name"], box["state"], box["memoryMB"], box["ttlSeconds"]) == ("pooled", "running", 512, 90)
        done = ok(await s.call_tool("dynocap_exec", {"name": "pooled", "command": "hostname"}))
        assert done["stdout"] == "pooled\n"
        logs = "".join(p.read_text(errors="replace") for p in (host.state / "logs").glob("*.log"))
        assert "claimed from the warm pool as pooled" in logs
        assert [b["name"] for b in ok(await s.call_tool("dynocap_ps", {}))["sandboxes"]] == ["pooled"]
        # The server refills the pool after run's reply, not before it: it fills again.
        deadline = time.monotonic() + 60
        while (host.cli("pool") or {}).get("pool", {}).get("ready") != 1:
            assert time.monotonic() < deadline, host.cli("pool")
            await anyio.sleep(0.1)
        assert ok(await s.call_tool("dynocap_destroy", {"name": "pooled"})) == {"destroyed": "pooled"}


def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces: fields follow the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid:
            found.append((int(entry), fields[0]))
    return found


def _the_server() -> int:
    """The `dynocap mcp` process this test started."""
    servers = [pid for pid, _ in _children(os.getpid())
               if open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[1:2] == [b"mcp"]]
    assert len(servers) == 1, servers
    return servers[0]


def _standbys(server: int) -> list[int]:
    """The server's children that stand by: started as standby supervisors and given no
    sandbox yet, so their output still goes nowhere."""
    found = []
    for pid, state in _children(server):
        try:
            words = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            waiting = os.readlink(f"/proc/{pid}/fd/2") == "/dev/null"
        except OSError:
            continue
        if state != "Z" and b"--standby-fd" in words and waiting:
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _disks_made_ahead(home: Path) -> list[str]:
    """Loop devices bound to an unnamed image in the home's disk cache: disks a standby made
    ahead (a sandbox that took one keeps the kernel's name for it)."""
    cache = str(home / "cache" / "disks") + "/"
    found = []
    for device in os.listdir("/sys/block"):
        try:
            backing = open(f"/sys/block/{device}/loop/backing_file").read().strip()
        except OSError:
            continue
        if backing.startswith(cache) and backing.endswith("(deleted)"):
            found.append(device)
    return sorted(found)


def _mounted_on(pid: int, mountpoint: Path) -> tuple[str, str]:
    """(source, mount and filesystem options) of the mount on `mountpoint` in process
    `pid`'s mount table."""
    for line in open(f"/proc/{pid}/mountinfo").read().splitlines():
        left, right = line.split(" - ", 1)
        if left.split(" ")[4] == str(mountpoint):
            _, source, options = right.split(" ")[:3]
            return source, left.split(" ")[5] + "," + options
    raise AssertionError(f"nothing mounted on {mountpoint} for {pid}")


async def _until(what: str, check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        await anyio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_run_takes_the_standby_supervisor_and_another_stands_by(host: Host) -> None:
    logs = host.state / "logs"
    async with connect(host) as s:
        server = _the_server()
        # One idle supervisor beside the server: no sandbox yet, its output goes nowhere.
        [first] = await _until("a standby supervisor", lambda: _standbys(server))
        assert os.readlink(f"/proc/{first}/fd/2") == "/dev/null"
        assert not list(logs.glob("*.log")), "a standby has no sandbox, so no log"
        # While it waits it makes the default sandbox's disk: an unnamed image on a loop
        # device, mounted in no namespace, named nowhere in the home.
        [ahead] = await _until("the standby's disk made ahead", lambda: _disks_made_ahead(host.state))
        assert not any(f" /dev/{ahead} " in open(f"/proc/{pid}/mountinfo").read()
                       for pid in (first, server, os.getpid()))
        assert not list((host.state / "sandboxes").glob("*/disk.img"))

        ok(await s.call_tool("dynocap_run", {"name": "a"}))
        # The standby became a's supervisor: its output is a's log, which says so.
        [log] = logs.glob("*.log")
        assert os.readlink(f"/proc/{first}/fd/2") == str(log)
        assert f"(pid {first})" in log.read_text()
        assert "not usable" not in log.read_text()
        # a's disk is the one made ahead: named in a's directory, mounted in a's supervisor.
        sandbox = host.state / "sandboxes" / log.stem
        assert (sandbox / "disk.img").is_file()
        source, options = _mounted_on(first, sandbox / "disk")
        # ...and there only: not on the host, nor in the server's namespace.
        for pid in (os.getpid(), server):
            assert f" {sandbox / 'disk'} " not in open(f"/proc/{pid}/mountinfo").read()
        assert source == f"/dev/{ahead}", (source, ahead)
        assert {"nosuid", "nodev", "noinit_itable", "no_prefetch_block_bitmaps"} <= set(options.split(",")), options
        assert ok(await s.call_tool("dynocap_exec", {"name": "a", "command": "echo hi"}))["stdout"] == "hi\n"
        # ...and the next one stands by, with a disk of its own made ahead.
        [second] = await _until("the next standby", lambda: [p for p in _standbys(server) if p != first])
        [second_disk] = await _until("the next disk made ahead",
                                     lambda: [d for d in _disks_made_ahead(host.state) if d != ahead])

        # A standby that died is no loss: the kernel frees the disk it made (nothing of it
        # is left), the next run spawns its supervisor, and a new standby takes the place.
        os.kill(second, 9)
        await _until("the killed standby to be reaped", lambda: not _alive(second))
        await _until("the killed standby's disk to be freed",
                     lambda: _disks_made_ahead(host.state) == [ahead])
        ok(await s.call_tool("dynocap_run", {"name": "b"}))
        assert ok(await s.call_tool("dynocap_exec", {"name": "b", "command": "echo there"}))["stdout"] == "there\n"
        spawned = [pid for pid, state in _children(server) if state != "Z" and pid not in (first, second)
                   and b"--id" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")]
        assert len(spawned) == 1, _children(server)
        [third] = await _until("a standby after the spawn", lambda: _standbys(server))
        assert third not in (first, second, spawned[0])
        ok(await s.call_tool("dynocap_destroy", {"name": "b"}))

    # The server is gone, and its standby with it; the sandbox the standby took lives on, in
    # a session of its own.
    await _until("the standby to end with its server", lambda: not _alive(third))
    await _until("the last standby's disk to be freed", lambda: _disks_made_ahead(host.state) == [ahead])
    assert _alive(first)
    assert host.cli("exec", "a", "--", "echo", "still here")["stdout"] == "still here\n"
    assert host.cli("destroy", "a") == {"destroyed": "a"}
    await _until("a's supervisor to end", lambda: not _alive(first))
    await _until("a's disk to be freed", lambda: _disks_made_ahead(host.state) == [])


async def test_the_server_reaps_the_supervisors_it_started(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "kept"}))
        # The server is this test's child that runs `dynocap mcp`; the sandbox's supervisor
        # is the server's child.
        server = _the_server()
        assert any(state != "Z" for _, state in _children(server)), "the supervisor is the server's child"
        for i in range(3):
            ok(await s.call_tool("dynocap_run", {"name": f"b{i}"}))
            ok(await s.call_tool("dynocap_destroy", {"name": f"b{i}"}))
        # Each destroyed sandbox's supervisor exits after its teardown; the server reaps it.
        # Left: kept's supervisor, and the standby for the next run (which starts in the lull
        # after the calls: until then the last destroyed one may still be tearing down).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            zombies = [pid for pid, state in _children(server) if state == "Z"]
            live = [pid for pid, state in _children(server) if state != "Z"]
            if not zombies and len(live) == 2 and _standbys(server):
                break
            await anyio.sleep(0.1)
        assert (zombies, len(live)) == ([], 2), _children(server)
        assert len(_standbys(server)) == 1, _children(server)
        ok(await s.call_tool("dynocap_destroy", {"name": "kept"}))


async def test_a_disk_the_host_cannot_back_is_refused_naming_free_and_asked(host: Host) -> None:
    """A sandbox's disk reserves its whole size on the home's filesystem when it starts: a
    diskMB more than is free there is refused before anything starts, in the tool's own words,
    and one that fits takes its room until it is destroyed."""
    asked = (shutil.disk_usage(host.state).free >> 20) + 1024
    async with connect(host, env={"DYNOCAP_MAX_DISK_MB": "1048576"}) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "big", "diskMB": asked}), "policy_denied")
        assert f"diskMB {asked} needs {asked} MB" in text, text
        assert "MB free" in text and "DYNOCAP_HOME" in text, text
        assert "--disk-mb" not in text, "an MCP error names no CLI flag"
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
        ok(await s.call_tool("dynocap_run", {"name": "small", "diskMB": 256}))
        images = list((host.state / "sandboxes").glob("*/disk.img"))
        assert len(images) == 1, images
        assert images[0].stat().st_blocks * 512 >= 256 << 20, "the whole disk is reserved"
        ok(await s.call_tool("dynocap_destroy", {"name": "small"}))


async def test_a_run_whose_server_is_killed_while_it_starts_leaves_nothing(host: Host) -> None:
    """SIGKILL of `dynocap mcp` during a `dynocap_run` (its standby took the sandbox; the start
    is held with the guest up): the supervisor sees that nobody waits for the start and removes
    the sandbox; the standby ends with the server."""
    from test_network import home_processes, running

    log = host.state / "logs"
    env = {"DYNOCAP_FAILPOINTS": "supervisor.start.agent-answered=sleep(3000)"}
    killed: list[int] = []
    try:
        async with connect(host, env=env) as s:
            async def kill_the_server_once_the_agent_answered() -> None:
                with anyio.fail_after(120):
                    while not any("supervisor: agent " in p.read_text(errors="replace")
                                  for p in log.glob("*.log")):
                        await anyio.sleep(0.1)
                server = next(int(entry) for entry in os.listdir("/proc") if entry.isdigit()
                              and running(int(entry))
                              and Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[1:2]
                              == [b"mcp"]
                              and str(host.state).encode()
                              in Path(f"/proc/{entry}/environ").read_bytes())
                os.kill(server, 9)
                killed.append(server)

            # The call is not cancelled: cancelling it makes the SDK write
            # `notifications/cancelled` to the dead server's stdin, whose broken
            # pipe surfaces outside this test. The server's end of the pipe
            # closes with it, and the SDK ends the call with "Connection closed".
            with anyio.fail_after(120):
                async with anyio.create_task_group() as group:
                    group.start_soon(kill_the_server_once_the_agent_answered)
                    await s.call_tool("dynocap_run", {"name": "held"})
    except Exception:  # noqa: BLE001 - a session whose server was killed ends in an error
        pass
    assert killed, "the server was never killed"
    with anyio.fail_after(120):
        while home_processes(host):
            await anyio.sleep(0.2)
    assert host.cli("ps") == {"sandboxes": []}
    assert list((host.state / "sandboxes").iterdir()) == []
    assert any("nobody waits for this start" in p.read_text(errors="replace")
               for p in log.glob("*.log"))
