"""Port forwards over MCP with the official SDK: opening one (publish on dynocap_run,
dynocap_port) is refused with policy_denied naming DYNOCAP_MCP_ALLOW_PUBLISH unless the host
set it; with it, a server in a `none` sandbox is reached from the host through the forward's
url (urllib and curl), the forward is listed in dynocap_ps and dynocap_port results, a caller
cannot name an address, and removing the forward closes the host port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

ALLOW = {"DYNOCAP_MCP_ALLOW_PUBLISH": "1"}


def fetch(url: str) -> str:
    """GETs `url`, retried while the sandbox's server comes up."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(5)
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_forwards_are_refused_without_the_hosts_flag(host: Host) -> None:
    async with connect(host) as s:
        text = err(await s.call_tool("dynocap_run", {
            "name": "nopub", "publish": [{"guestPort": 8000}]}), "policy_denied")
        assert "DYNOCAP_MCP_ALLOW_PUBLISH" in text
        # Refused before anything boots.
        assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
        ok(await s.call_tool("dynocap_run", {"name": "nopub"}))
        text = err(await s.call_tool("dynocap_port", {"name": "nopub", "guestPort": 8000}),
                   "policy_denied")
        assert "DYNOCAP_MCP_ALLOW_PUBLISH=1" in text
        # Listing needs no flag.
        assert ok(await s.call_tool("dynocap_port", {"name": "nopub"})) == {"forwards": []}

        # Every other way to open one is refused the same way, before anything starts: a
        # task's start and a fork of it.
        project = host.project("site")
        text = err(await s.call_tool("dynocap_task_start", {
            "projectPath": str(project), "name": "t", "publish": [{"guestPort": 8000}]}),
            "policy_denied")
        assert "DYNOCAP_MCP_ALLOW_PUBLISH=1" in text
        assert ok(await s.call_tool("dynocap_ls", {}))["tasks"] == []
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "t"}))
        text = err(await s.call_tool("dynocap_task_start", {
            "fromTask": "t", "name": "t2", "publish": [{"guestPort": 8000}]}), "policy_denied")
        assert "DYNOCAP_MCP_ALLOW_PUBLISH=1" in text
        assert [t["name"] for t in ok(await s.call_tool("dynocap_ls", {}))["tasks"]] == ["t"]
        err(await s.call_tool("dynocap_port", {"name": "t", "guestPort": 8000, "hostPort": 0}),
            "policy_denied")


async def test_a_published_port_reaches_the_sandboxs_server(host: Host) -> None:
    async with connect(host, env=ALLOW) as s:
        # A caller never picks the address; malformed entries are invalid_argument.
        text = err(await s.call_tool("dynocap_run", {
            "name": "pub", "publish": [{"guestPort": 8000, "hostAddress": "0.0.0.0"}]}),
            "invalid_argument")
        assert "127.0.0.1" in text
        err(await s.call_tool("dynocap_run", {"name": "pub", "publish": [{"guestPort": 0}]}),
            "invalid_argument")
        sandbox = ok(await s.call_tool("dynocap_run", {
            "name": "pub", "publish": [{"guestPort": 8000}]}))
        assert sandbox["network"] == "none"
        [forward] = sandbox["forwards"]
        assert forward["guestPort"] == 8000 and forward["hostAddress"] == "127.0.0.1"
        port = forward["hostPort"]
        assert forward["url"] == f"http://127.0.0.1:{port}/"
        ok(await s.call_tool("dynocap_exec", {
            "name": "pub",
            "command": "mkdir -p /tmp/site && echo served-from-the-sandbox > /tmp/site/index.html",
        }))
        started = ok(await s.call_tool("dynocap_exec", {
            "name": "pub", "background": True, "timeoutSeconds": 600,
            "command": "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/site"}))
        assert started["running"] is True
        assert fetch(forward["url"]) == "served-from-the-sandbox\n"
        if shutil.which("curl"):
            out = subprocess.run(["curl", "-sS", "--max-time", "20", forward["url"]],
                                 capture_output=True, text=True, check=True)
            assert out.stdout == "served-from-the-sandbox\n"

        # Listed where the agent looks.
        ps = ok(await s.call_tool("dynocap_ps", {}))
        assert ps["sandboxes"][0]["forwards"] == [forward]
        listed = ok(await s.call_tool("dynocap_port", {"name": "pub"}))
        assert listed == {"forwards": [forward]}

        # A second forward by dynocap_port, then removed: its host port closes.
        opened = ok(await s.call_tool("dynocap_port", {"name": "pub", "guestPort": 8000 + 1}))
        second = opened["forward"]
        assert opened["forwards"] == [forward, second]
        removed = ok(await s.call_tool("dynocap_port", {
            "name": "pub", "guestPort": 8001, "remove": True}))
        assert removed == {"removed": second, "forwards": [forward]}
        assert refused(second["hostPort"])
        err(await s.call_tool("dynocap_port", {"name": "pub", "guestPort": 8001, "remove": True}),
            "not_found")
        # A host port in use is a conflict naming the fix.
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            text = err(await s.call_tool("dynocap_port", {
                "name": "pub", "guestPort": 9000, "hostPort": taken.getsockname()[1]}), "conflict")
            assert "in use" in text

        ok(await s.call_tool("dynocap_destroy", {"name": "pub"}))
        assert refused(port)
