"""The protocol surface: tools/list (snapshot of the whole answer, schema hygiene, defaults
and ranges exactly as docs/mcp.md documents them), both protocol generations, and the errors
that must never take the server down: unknown tools, wrong argument types, bad JSON."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any

import anyio
import pytest
from jsonschema import Draft202012Validator
from mcp.shared.exceptions import MCPError

from conftest import DYNOCAP, SNAPSHOTS, Host, connect, err, ok, snapshot

pytestmark = pytest.mark.anyio

TOOLS = [
    "dynocap_task_start", "dynocap_task_exec", "dynocap_diff", "dynocap_task_finish",
    "dynocap_ls", "dynocap_rm", "dynocap_run", "dynocap_exec", "dynocap_ps", "dynocap_destroy",
    "dynocap_job", "dynocap_checkpoint", "dynocap_port", "dynocap_read_file", "dynocap_write_file", "dynocap_edit_file",
    "dynocap_list_files",
]

# The parameters as docs/mcp.md documents them: (type, default, minimum, maximum, required).
# "number" parameters are whole numbers (JSON Schema "integer": 30 and 30.0, never 30.5).
EXEC_PARAMS = {
    "name": ("string", None, None, None, True),
    "command": ("string", None, None, None, True),
    "cwd": ("string", "<cwd>", None, None, False),
    "env": ("object", None, None, None, False),
    "timeoutSeconds": ("integer", 30, 1, 86400, False),
    "terminal": ("boolean", False, None, None, False),
    # Extensions (docs/mcp.md): output kept per stream (head and tail), and its encoding.
    "maxOutputBytes": ("integer", 32768, 1, 1048576, False),
    "outputEncoding": ("string", "utf8", None, None, False),
    # Extension (docs/mcp.md): start the command as a job and return at once.
    "background": ("boolean", False, None, None, False),
}
SPEC: dict[str, dict[str, tuple[Any, ...]]] = {
    "dynocap_task_start": {
        "projectPath": ("string", None, None, None, False),
        "repositoryUrl": ("string", None, None, None, False),
        # Extension (docs/mcp.md): a fork of a running task, from a checkpoint of it, or
        # (vm) with its running processes.
        "fromTask": ("string", None, None, None, False),
        "checkpoint": ("string", None, None, None, False),
        "live": ("boolean", False, None, None, False),
        # Extension (docs/mcp.md): a start without the project's package caches.
        "noCache": ("boolean", False, None, None, False),
        "history": ("string", "branches", None, None, False),
        "name": ("string", None, None, None, False),
        "network": ("string", "none", None, None, False),
        "ttlSeconds": ("integer", 1800, 30, 86400, False),
        "cpus": ("integer", 2, 1, 64, False),
        "memoryMB": ("integer", 1024, 64, 1048576, False),
        # Extension (docs/mcp.md): the sandbox's disk limit.
        "diskMB": ("integer", 2048, 64, 1048576, False),
        # Extension (docs/mcp.md): an ssh clone's key, under DYNOCAP_MCP_ALLOW_SSH_KEY.
        "sshKeyPath": ("string", None, None, None, False),
        # Extensions (docs/mcp.md): the image, under DYNOCAP_MCP_IMAGES, and hosts added to
        # a filtered allowlist, under DYNOCAP_MCP_EGRESS_ALLOW.
        "image": ("string", None, None, None, False),
        "allowHosts": ("array", None, None, None, False),
        # Extension (docs/mcp.md): port forwards, under DYNOCAP_MCP_ALLOW_PUBLISH.
        "publish": ("array", None, None, None, False),
    },
    "dynocap_task_exec": {**EXEC_PARAMS, "cwd": ("string", "/workspace", None, None, False)},
    "dynocap_diff": {
        "target": ("string", None, None, None, True),
        # Extensions (docs/mcp.md): narrow the patch text.
        "paths": ("array", None, None, None, False),
        "stat": ("boolean", False, None, None, False),
    },
    "dynocap_task_finish": {
        "id": ("string", None, None, None, True),
        "includeGenerated": ("boolean", False, None, None, False),
    },
    "dynocap_ls": {},
    "dynocap_rm": {
        "target": ("string", None, None, None, True),
        "force": ("boolean", False, None, None, False),
        "purge": ("boolean", False, None, None, False),
    },
    "dynocap_run": {
        "name": ("string", None, None, None, True),
        "network": ("string", "none", None, None, False),
        "ttlSeconds": ("integer", 1800, 30, 86400, False),
        "cpus": ("integer", 1, 1, 64, False),
        "memoryMB": ("integer", 1024, 64, 1048576, False),
        "diskMB": ("integer", 2048, 64, 1048576, False),
        "image": ("string", None, None, None, False),
        "allowHosts": ("array", None, None, None, False),
        "publish": ("array", None, None, None, False),
    },
    "dynocap_exec": {**EXEC_PARAMS, "cwd": ("string", "/", None, None, False)},
    "dynocap_ps": {},
    "dynocap_destroy": {"name": ("string", None, None, None, True)},
    # Extension (docs/mcp.md): a task's checkpoints.
    "dynocap_checkpoint": {
        "name": ("string", None, None, None, True),
        "action": ("string", "create", None, None, False),
        "label": ("string", None, None, None, False),
    },
    # Extension (docs/mcp.md): follow or kill a command that went on as a job.
    "dynocap_job": {
        "name": ("string", None, None, None, True),
        "job": ("string", None, None, None, True),
        "waitSeconds": ("integer", 0, 0, 600, False),
        "stdoutOffset": ("integer", 0, 0, 9007199254740991, False),
        "stderrOffset": ("integer", 0, 0, 9007199254740991, False),
        "kill": ("boolean", False, None, None, False),
    },
    # Extension (docs/mcp.md): port forwards of a sandbox or task.
    "dynocap_port": {
        "name": ("string", None, None, None, True),
        "guestPort": ("integer", None, 1, 65535, False),
        "hostPort": ("integer", 0, 0, 65535, False),
        "remove": ("boolean", False, None, None, False),
    },
    # Extension (docs/mcp.md): file tools, as the sandbox user.
    "dynocap_read_file": {
        "name": ("string", None, None, None, True),
        "path": ("string", None, None, None, True),
        "offset": ("integer", 0, 0, 9007199254740991, False),
        "length": ("integer", 65536, 1, 524288, False),
        "encoding": ("string", "utf8", None, None, False),
    },
    "dynocap_write_file": {
        "name": ("string", None, None, None, True),
        "path": ("string", None, None, None, True),
        "content": ("string", None, None, None, False),
        "encoding": ("string", "utf8", None, None, False),
        "mode": ("string", None, None, None, False),
        "createDirs": ("boolean", False, None, None, False),
    },
    "dynocap_edit_file": {
        "name": ("string", None, None, None, True),
        "path": ("string", None, None, None, True),
        "oldText": ("string", None, None, None, True),
        "newText": ("string", None, None, None, False),
        "replaceAll": ("boolean", False, None, None, False),
    },
    "dynocap_list_files": {
        "name": ("string", None, None, None, True),
        "path": ("string", None, None, None, True),
        "depth": ("integer", 1, 1, 8, False),
        "offset": ("integer", 0, 0, 9007199254740991, False),
    },
}


def walk(path: str, value: Any) -> None:
    """Fails on schema constructs strict clients reject."""
    if isinstance(value, dict):
        assert "$schema" not in value, path
        assert "format" not in value, path
        assert "$ref" not in value and "$defs" not in value, path
        # A "properties" map may describe a field named "type" (a listed file's).
        if "type" in value and not path.endswith(".properties"):
            assert isinstance(value["type"], str), f"{path}: type union {value['type']}"
        for key, child in value.items():
            walk(f"{path}.{key}", child)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            walk(f"{path}[{i}]", child)


def test_tools_list_snapshot(host: Host) -> None:
    """The whole tools/list answer, as it is on the wire, against the committed snapshot."""
    raw = Raw(host)
    try:
        init = raw.initialize("2025-11-25")
        assert init["serverInfo"]["name"] == "dynocap"
        assert init["capabilities"]["tools"] is not None
        raw.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        reply = raw.recv()
    finally:
        raw.close()
    assert reply["id"] == 2
    answer = snapshot("tools_list.json", reply["result"])
    assert [t["name"] for t in answer["tools"]] == TOOLS


async def test_applying_a_patch_is_never_a_tool(host: Host) -> None:
    """`dynocap task apply` stays a person's decision: no tool applies, commits or merges."""
    async with connect(host) as session:
        listing = await session.list_tools()
        names = [t.name for t in listing.tools]
        assert not [n for n in names if any(w in n for w in ("apply", "commit", "merge"))], names
        with pytest.raises(MCPError) as raised:
            await session.call_tool("dynocap_task_apply", {"name": "x"})
        assert "dynocap_task_apply" in raised.value.error.message


async def test_sdk_reads_the_same_tools(host: Host) -> None:
    async with connect(host) as session:
        listing = await session.list_tools()
    tools = [t.model_dump(mode="json", by_alias=True, exclude_unset=True) for t in listing.tools]
    expected = json.loads((SNAPSHOTS / "tools_list.json").read_text())["tools"]
    assert tools == expected


async def test_modern_protocol_lists_the_same_tools(host: Host) -> None:
    async with connect(host, modern=True) as session:
        assert session.protocol_version == "2026-07-28"
        # Every version the pinned SDK speaks, newest first.
        assert session.discover_result is not None
        assert session.discover_result.supported_versions == [
            "2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"]
        modern = await session.list_tools()
        result = await session.call_tool("dynocap_ps", {})
        assert ok(result) == {"sandboxes": []}
    async with connect(host) as session:
        legacy = await session.list_tools()
    dump = lambda r: [t.model_dump(mode="json", by_alias=True, exclude_unset=True) for t in r.tools]  # noqa: E731
    assert dump(modern) == dump(legacy)


async def test_schemas_follow_the_reference_and_are_clean(host: Host) -> None:
    async with connect(host) as session:
        listing = await session.list_tools()
    tools = {t.name: t for t in listing.tools}
    assert sorted(tools) == sorted(TOOLS)
    for name, params in SPEC.items():
        tool = tools[name]
        schema = tool.input_schema
        walk(name, schema)
        walk(name + ".output", tool.output_schema)
        Draft202012Validator.check_schema(schema)
        Draft202012Validator.check_schema(tool.output_schema)
        assert tool.output_schema["type"] == "object"
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == set(params), name
        required = sorted(p for p, spec in params.items() if spec[4])
        assert sorted(schema.get("required", [])) == required, name
        for param, (kind, default, minimum, maximum, _) in params.items():
            prop = schema["properties"][param]
            assert prop["type"] == kind, (name, param)
            assert prop.get("description"), (name, param)
            if default is not None:
                assert prop["default"] == default, (name, param)
            else:
                assert "default" not in prop, (name, param)
            assert prop.get("minimum") == minimum, (name, param)
            assert prop.get("maximum") == maximum, (name, param)
        if "network" in params:
            assert schema["properties"]["network"]["enum"] == ["none", "filtered", "nat"]
        if "history" in params:
            assert schema["properties"]["history"]["enum"] == ["branches", "head", "none"]
        assert tool.description and len(tool.description) > 60, name
    # Descriptions name the flags that refuse what an agent may ask for.
    for flag in ("DYNOCAP_MCP_ALLOW_FILTERED", "DYNOCAP_MCP_ALLOW_NAT", "DYNOCAP_MCP_ROOTS",
                 "DYNOCAP_MCP_GIT_HOSTS", "DYNOCAP_MCP_ALLOW_SSH_KEY", "DYNOCAP_MCP_IMAGES",
                 "DYNOCAP_MCP_EGRESS_ALLOW"):
        assert flag in tools["dynocap_task_start"].description, flag
    for flag in ("DYNOCAP_MCP_ALLOW_FILTERED", "DYNOCAP_MCP_ALLOW_NAT", "DYNOCAP_MCP_IMAGES",
                 "DYNOCAP_MCP_EGRESS_ALLOW"):
        assert flag in tools["dynocap_run"].description, flag


async def test_unknown_tool_is_an_error_and_the_server_keeps_running(host: Host) -> None:
    async with connect(host) as session:
        with pytest.raises(MCPError) as raised:
            await session.call_tool("dynocap_nope", {})
        assert raised.value.error.code == -32602
        assert "dynocap_nope" in raised.value.error.message
        assert "dynocap_run" in raised.value.error.message
        assert ok(await session.call_tool("dynocap_ps", {})) == {"sandboxes": []}


WRONG = [
    ("dynocap_run", {}, "needs \"name\""),
    ("dynocap_run", {"name": 7}, "name must be a string"),
    ("dynocap_run", {"name": "a", "ttl": 60}, "does not take \"ttl\""),
    ("dynocap_run", {"name": "a", "ttlSeconds": "60"}, "ttlSeconds must be a whole number"),
    ("dynocap_run", {"name": "a", "ttlSeconds": 30.5}, "ttlSeconds must be a whole number"),
    ("dynocap_run", {"name": "a", "ttlSeconds": True}, "ttlSeconds must be a whole number"),
    ("dynocap_run", {"name": "a", "ttlSeconds": 29}, "ttlSeconds 29 is below the minimum 30"),
    ("dynocap_run", {"name": "a", "ttlSeconds": 86401}, "ttlSeconds 86401 is above the maximum 86400"),
    ("dynocap_run", {"name": "a", "ttlSeconds": -30}, "ttlSeconds -30 is below the minimum 30"),
    ("dynocap_run", {"name": "a", "cpus": 0}, "cpus 0 is below the minimum 1"),
    ("dynocap_run", {"name": "a", "cpus": 65}, "cpus 65 is above the maximum 64"),
    ("dynocap_run", {"name": "a", "memoryMB": 63}, "memoryMB 63 is below the minimum 64"),
    ("dynocap_run", {"name": "a", "memoryMB": 1048577}, "memoryMB 1048577 is above the maximum"),
    ("dynocap_run", {"name": "a", "diskMB": 63}, "diskMB 63 is below the minimum 64"),
    ("dynocap_run", {"name": "a", "diskMB": 1048577}, "diskMB 1048577 is above the maximum"),
    ("dynocap_run", {"name": "a", "network": "wifi"}, "use one of \"none\", \"filtered\", \"nat\""),
    ("dynocap_run", {"name": "a", "network": ["none"]}, "network must be a string"),
    ("dynocap_run", {"name": "Bad Name"}, "is not valid"),
    ("dynocap_run", {"name": "task-x"}, "reserved"),
    ("dynocap_run", {"name": ""}, "name must not be empty"),
    ("dynocap_exec", {"name": "a"}, "needs \"command\""),
    ("dynocap_exec", {"name": "a", "command": "true", "env": ["A=1"]}, "env must be an object"),
    ("dynocap_exec", {"name": "a", "command": "true", "env": {"A": 1}}, "env.A must be a string"),
    ("dynocap_exec", {"name": "a", "command": "true", "terminal": "yes"}, "terminal must be true or false"),
    ("dynocap_exec", {"name": "a", "command": "true", "timeoutSeconds": 0}, "timeoutSeconds 0 is below"),
    ("dynocap_exec", {"name": "a", "command": "true", "timeoutSeconds": 86401}, "timeoutSeconds 86401 is above"),
    ("dynocap_exec", {"name": "a", "command": "true", "cwd": "tmp"}, "must be an absolute path"),
    ("dynocap_exec", {"name": "a", "command": "true", "env": {"A=B": "x"}}, "not a valid variable name"),
    ("dynocap_exec", {"name": "a", "command": "  "}, "command is empty"),
    ("dynocap_task_exec", {"name": "t", "command": "true", "timeoutSeconds": 1.5}, "whole number"),
    ("dynocap_task_start", {"projectPath": "/x", "ttlSeconds": 29}, "ttlSeconds 29 is below"),
    ("dynocap_task_start", {"projectPath": "/x", "history": "all"}, "\"branches\", \"head\", \"none\""),
    ("dynocap_task_start", {"projectPath": "/x", "cpus": 65}, "cpus 65 is above"),
    ("dynocap_task_start", {"projectPath": "/x", "memoryMB": 1048577}, "memoryMB 1048577 is above"),
    ("dynocap_task_start", {"projectPath": "/x", "diskMB": 63}, "diskMB 63 is below"),
    ("dynocap_task_start", {"projectPath": 5}, "projectPath must be a string"),
    ("dynocap_task_start", {}, "give projectPath"),
    ("dynocap_task_start", {"projectPath": "/x", "repositoryUrl": "https://github.com/o/r"}, "not both"),
    ("dynocap_task_start", {"projectPath": "relative"}, "must be an absolute host path"),
    ("dynocap_diff", {}, "needs \"target\""),
    ("dynocap_task_finish", {"target": "x"}, "does not take \"target\""),
    ("dynocap_rm", {"target": "x", "force": "yes"}, "force must be true or false"),
    ("dynocap_ls", {"all": True}, "takes no parameters"),
    ("dynocap_destroy", {"name": None}, "needs \"name\""),
]


async def test_wrong_arguments_are_invalid_argument(host: Host) -> None:
    async with connect(host) as session:
        for tool, args, expected in WRONG:
            text = err(await session.call_tool(tool, args), "invalid_argument")
            assert expected in text, (tool, args, text)
        # Nothing was created by any of them, and the server still answers.
        assert ok(await session.call_tool("dynocap_ps", {})) == {"sandboxes": []}


def raw_server(host: Host) -> subprocess.Popen[bytes]:
    return subprocess.Popen([str(DYNOCAP), "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=open(host.log, "a"), env=host.env(), cwd=host.root, bufsize=0)


# Not a timing assertion: a reply that never comes fails the test instead of hanging it.
HANG_GUARD_SECONDS = 120


class Raw:
    """JSON lines over a pipe, for what a well-behaved SDK would never send."""

    def __init__(self, host: Host) -> None:
        self.proc = raw_server(host)
        self.pending = b""

    def send(self, line: str | dict[str, Any]) -> None:
        """A line as it is (str) or a message (dict)."""
        self.send_bytes(line.encode() if isinstance(line, str) else json.dumps(line).encode())

    def send_bytes(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], HANG_GUARD_SECONDS)
            assert ready, "no reply: the server left a line unanswered"
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the server closed stdout"
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)  # stdout carries JSON-RPC only

    def ping(self, id: int | str) -> None:
        """The server still answers, and what came before left no reply in between."""
        self.send({"jsonrpc": "2.0", "id": id, "method": "ping"})
        reply = self.recv()
        assert reply == {"jsonrpc": "2.0", "id": id, "result": {}}, reply

    def initialize(self, version: str) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": version, "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        reply = self.recv()
        assert reply["id"] == 0 and reply["result"]["protocolVersion"] == version, reply
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply["result"]

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(timeout=20)


def test_bad_json_gets_a_parse_error_and_the_server_keeps_running(host: Host) -> None:
    raw = Raw(host)
    try:
        raw.send("{this is not json")
        reply = raw.recv()
        assert reply["id"] is None and reply["error"]["code"] == -32700, reply
        assert "this is not" not in reply["error"]["message"]  # never echoes the input
        raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}}})
        init = raw.recv()
        assert init["id"] == 1 and init["result"]["protocolVersion"] == "2025-06-18", init
        raw.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        for garbage in ('{"jsonrpc": "2.0", "id": 2, "method": "tools/list"', "\x00\x01", "]"):
            raw.send(garbage)
            reply = raw.recv()
            assert reply["error"]["code"] == -32700, reply
        # Valid JSON that is not a valid request: a JSON-RPC error, not a crash.
        raw.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": "not an object"})
        reply = raw.recv()
        assert reply["id"] == 3 and reply["error"]["code"] == -32600, reply
        raw.send({"jsonrpc": "2.0", "id": 4, "method": "no/such/method"})
        reply = raw.recv()
        assert reply["id"] == 4 and reply["error"]["code"] == -32601, reply
        # Wrong argument types inside a valid call: a tool error result.
        raw.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                  "params": {"name": "dynocap_run", "arguments": {"name": "a", "ttlSeconds": "x"}}})
        reply = raw.recv()
        assert reply["id"] == 5 and reply["result"]["isError"] is True, reply
        assert reply["result"]["content"][0]["text"].startswith("invalid_argument: ")
        # Still serving.
        raw.send({"jsonrpc": "2.0", "id": 6, "method": "tools/call",
                  "params": {"name": "dynocap_ps", "arguments": {}}})
        reply = raw.recv()
        assert reply["id"] == 6 and reply["result"]["structuredContent"] == {"sandboxes": []}, reply
    finally:
        code = raw.close()
    assert code == 0
    assert "replied with a parse error" in host.server_log()


def test_closing_stdin_ends_the_server(host: Host) -> None:
    raw = Raw(host)
    started = time.monotonic()
    assert raw.close() == 0
    assert time.monotonic() - started < 5


async def test_log_file_flag_and_variable(host: Host) -> None:
    log_file = host.base / "mcp-flag.log"
    async with connect(host, args=("--log-file", str(log_file))) as session:
        err(await session.call_tool("dynocap_run", {"name": "a", "network": "nat"}), "policy_denied")
    text = log_file.read_text()
    assert "serving MCP on stdio" in text
    assert "[rule network.nat]" in text
    async with connect(host, env={"DYNOCAP_MCP_LOG": "1"}) as session:
        await session.call_tool("dynocap_ps", {})
    assert "dynocap_ps ok" in (host.state / "logs" / "mcp.log").read_text()


async def test_log_format_json_and_levels(host: Host) -> None:
    """DYNOCAP_LOG_FORMAT=json: every line the server logs is one JSON object; a mistyped
    DYNOCAP_LOG is reported with the valid levels and info stays the level; DYNOCAP_LOG=warn
    keeps the info lines out."""
    async with connect(host, env={"DYNOCAP_LOG_FORMAT": "json", "DYNOCAP_LOG": "chatty"}) as session:
        await session.call_tool("dynocap_ps", {})
    lines = [json.loads(line) for line in host.server_log().splitlines()]
    assert lines, "the server logged nothing"
    for line in lines:
        assert {"timestamp", "level", "message", "target"} <= line.keys(), line
    warning = lines[0]
    assert warning["level"] == "WARN", warning
    assert "DYNOCAP_LOG=chatty" in warning["message"], warning
    assert "error, warn, info, debug or trace" in warning["message"], warning
    messages = [line["message"] for line in lines if line["target"] == "dynocap::mcp"]
    assert any("serving MCP on stdio" in m for m in messages), messages
    assert any("dynocap_ps ok" in m for m in messages), messages

    host.log.unlink()
    async with connect(host, env={"DYNOCAP_LOG": "warn"}) as session:
        await session.call_tool("dynocap_ps", {})
    log = host.server_log()
    assert "serving MCP on stdio" not in log, log
    assert "dynocap_ps ok" not in log, log


async def test_stdout_carries_the_protocol_only(host: Host) -> None:
    """A refused call and a start-up warning reach stderr, never stdout (the client would
    choke on a stray line)."""
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": "/nonexistent:relative",
                                  "DYNOCAP_MCP_ALLOW_NAT": "maybe"}) as session:
        with anyio.fail_after(20):
            text = err(await session.call_tool("dynocap_task_start", {"projectPath": str(host.root)}),
                       "policy_denied")
        assert "DYNOCAP_MCP_ROOTS" in text
    log = host.server_log()
    assert "ignoring /nonexistent" in log
    assert "ignoring \"relative\"" in log
    assert "DYNOCAP_MCP_ALLOW_NAT=\"maybe\"" in log


def test_concurrent_requests_all_get_their_answer(host: Host) -> None:
    """Many requests in flight at once over one pipe all get their answer."""
    raw = Raw(host)
    try:
        raw.initialize("2025-11-25")
        for i in range(1, 21):
            raw.send({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                      "params": {"name": "dynocap_ls", "arguments": {}}})
        ids = {raw.recv()["id"] for _ in range(20)}
        assert ids == set(range(1, 21))
    finally:
        raw.close()



def error_reply(reply: dict[str, Any]) -> tuple[int, Any]:
    """A JSON-RPC error response, always with an id member (null when it cannot be read)."""
    assert set(reply) == {"jsonrpc", "id", "error"}, reply
    assert reply["jsonrpc"] == "2.0", reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"], reply
    return reply["error"]["code"], reply["id"]


# Lines that are not UTF-8 JSON text, with the id their parse error carries: the request's
# when it can still be read (the client waits on it), else null.
UNDECODABLE: list[tuple[str, bytes, int | None]] = [
    ("invalid UTF-8 in a string value",
     b'{"jsonrpc":"2.0","id":101,"method":"tools/call","params":{"name":"dynocap_ps","arguments":{"x":"\xff"}}}', 101),
    ("invalid UTF-8 in a nested key",
     b'{"jsonrpc":"2.0","id":102,"method":"tools/call","params":{"\xfe\xff":1}}', 102),
    ("invalid UTF-8 in a key before the id", b'{"\xff":1,"jsonrpc":"2.0","id":103,"method":"ping"}', None),
    ("invalid UTF-8 between tokens", b'{"jsonrpc":"2.0","id":104,\xff"method":"ping"}', 104),
    ("truncated multi-byte sequence", b'{"jsonrpc":"2.0","id":105,"method":"ping","params":{"x":"\xe2\x82"}}', 105),
    ("truncated multi-byte sequence ending the line", b'{"jsonrpc":"2.0","id":106,"method":"ping"}\xe2\x82', 106),
    ("overlong encoding of '/'", b'{"jsonrpc":"2.0","id":107,"method":"ping","params":{"x":"\xc0\xaf"}}', 107),
    ("overlong encoding of NUL", b'{"jsonrpc":"2.0","id":108,"method":"ping","params":{"x":"\xc0\x80"}}', 108),
    ("UTF-8-encoded surrogate", b'{"jsonrpc":"2.0","id":109,"method":"ping","params":{"x":"\xed\xa0\x80"}}', 109),
    ("code point above U+10FFFF", b'{"jsonrpc":"2.0","id":110,"method":"ping","params":{"x":"\xf4\x90\x80\x80"}}', 110),
    ("Latin-1 text", '{"jsonrpc":"2.0","id":111,"method":"ping","params":{"x":"caf\u00e9"}}'.encode("latin-1"), 111),
    ("lone leading surrogate escape", b'{"jsonrpc":"2.0","id":112,"method":"ping","params":{"x":"\\ud800"}}', 112),
    ("lone trailing surrogate escape", b'{"jsonrpc":"2.0","id":113,"method":"ping","params":{"x":"\\udc00"}}', 113),
    ("reversed surrogate pair", b'{"jsonrpc":"2.0","id":114,"method":"ping","params":{"x":"\\udc00\\ud800"}}', 114),
    ("lone surrogate escape in a key", b'{"jsonrpc":"2.0","id":115,"method":"ping","params":{"\\ud800":1}}', 115),
    ("NUL byte inside a string", b'{"jsonrpc":"2.0","id":116,"method":"ping","params":{"x":"a\x00b"}}', 116),
    ("NUL bytes", b"\x00\x00\x00", None),
    ("empty line", b"", None),
    ("whitespace only", b" \t  ", None),
    ("a byte order mark only", b"\xef\xbb\xbf", None),
    ("cut-off JSON", b'{"jsonrpc":"2.0","id":117,"method":"ping"', 117),
]


def check_undecodable(raw: Raw, round: str) -> None:
    for n, (name, line, id) in enumerate(UNDECODABLE):
        raw.send_bytes(line)
        assert error_reply(raw.recv()) == (-32700, id), (round, name)
        raw.ping(f"{round}-{n}")


def test_undecodable_lines_get_parse_errors_and_the_server_keeps_serving(host: Host) -> None:
    raw = Raw(host)
    try:
        # Before the session, and within it.
        check_undecodable(raw, "before")
        raw.initialize("2025-11-25")
        check_undecodable(raw, "after")
        # A valid tools/call on the same connection still gets its answer.
        raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                  "params": {"name": "dynocap_ps", "arguments": {}}})
        reply = raw.recv()
        assert reply["id"] == 7 and reply["result"]["structuredContent"] == {"sandboxes": []}, reply
    finally:
        code = raw.close()
    assert code == 0
    log = host.server_log()
    assert "not valid UTF-8" in log and "surrogate" in log


def test_a_huge_line_gets_a_parse_error_and_the_server_keeps_serving(host: Host) -> None:
    raw = Raw(host)
    try:
        raw.initialize("2025-11-25")
        # Over the 16 MiB bound: refused from its head, which still names the id.
        filler = b"a" * (17 * 1024 * 1024)
        raw.send_bytes(b'{"jsonrpc":"2.0","id":201,"method":"tools/call","params":{"name":"dynocap_ps",'
                       b'"arguments":{"x":"' + filler + b'"}}}')
        reply = raw.recv()
        assert error_reply(reply) == (-32700, 201), reply
        assert "longer than" in reply["error"]["message"]
        raw.ping(1)
        # Long but under the bound, broken at its very end.
        raw.send_bytes(b'{"jsonrpc":"2.0","id":202,"method":"ping","params":{"x":"' + filler[:4 << 20] + b'\xff"}}')
        assert error_reply(raw.recv()) == (-32700, 202)
        raw.ping(2)
        # Long and valid: served (the tool refuses the unknown parameter, by its id).
        raw.send_bytes(b'{"jsonrpc":"2.0","id":203,"method":"tools/call","params":{"name":"dynocap_ps",'
                       b'"arguments":{"x":"' + filler[:4 << 20] + b'"}}}')
        reply = raw.recv()
        assert reply["id"] == 203 and reply["result"]["isError"] is True, str(reply)[:300]
    finally:
        assert raw.close() == 0


# Requests (or what may have been one) that the server cannot serve: the JSON-RPC error and
# the id of its reply, the request's whenever it can be read, else null.
REFUSED: list[tuple[Any, int, int | str | None]] = [
    # Parameters that do not fit the method: invalid params, never "method not found".
    ({"jsonrpc": "2.0", "id": 1, "method": "tools/call"}, -32602, 1),
    ({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": None}, -32602, 2),
    ({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {}}, -32602, 3),
    ({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "dynocap_ps", "arguments": []}}, -32602, 4),
    ({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "dynocap_ps", "arguments": "{}"}}, -32602, 5),
    ({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "dynocap_ps", "arguments": 0}}, -32602, 6),
    ({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "dynocap_ps", "arguments": True}}, -32602, 7),
    ({"jsonrpc": "2.0", "id": "s", "method": "tools/call", "params": {"name": 5, "arguments": {}}}, -32602, "s"),
    ({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": ["dynocap_ps", {}]}, -32602, 8),
    ({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "dynocap_ps", "_meta": 1}}, -32602, 9),
    ({"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": [1]}, -32602, 10),
    ({"jsonrpc": "2.0", "id": 11, "method": "initialize", "params": {}}, -32602, 11),
    # Not a request object.
    ({"jsonrpc": "2.0", "id": 20, "method": "tools/call", "params": "dynocap_ps"}, -32600, 20),
    ({"jsonrpc": "2.0", "id": 21, "method": "tools/list", "params": 7}, -32600, 21),
    ({"jsonrpc": "2.0", "id": 22, "method": 5}, -32600, 22),
    ({"jsonrpc": "2.0", "id": 23, "method": None}, -32600, 23),
    ({"jsonrpc": "2.0", "id": 24, "method": ["tools/list"]}, -32600, 24),
    ({"jsonrpc": "2.0", "method": 1, "params": "bar"}, -32600, None),
    ({"jsonrpc": "2.0", "id": 25}, -32600, 25),
    ({"id": 26, "method": "ping"}, -32600, 26),
    ({"jsonrpc": "1.0", "id": 27, "method": "ping"}, -32600, 27),
    ({"jsonrpc": 2.0, "id": 28, "method": "ping"}, -32600, 28),
    ({"jsonrpc": "2.0", "id": 29, "method": "ping", "result": {}}, -32600, 29),
    ({"foo": "bar"}, -32600, None),
    ({}, -32600, None),
    # Batches (MCP has none), and JSON that is no object at all.
    ([], -32600, None),
    ([{"jsonrpc": "2.0", "id": 30, "method": "ping"}], -32600, None),
    ([1, 2, 3], -32600, None),
    (42, -32600, None),
    ("ping", -32600, None),
    (None, -32600, None),
    (True, -32600, None),
    # Ids of a type that cannot be one: the reply cannot name them.
    ({"jsonrpc": "2.0", "id": None, "method": "ping"}, -32600, None),
    ({"jsonrpc": "2.0", "id": True, "method": "ping"}, -32600, None),
    ({"jsonrpc": "2.0", "id": {"n": 1}, "method": "ping"}, -32600, None),
    ({"jsonrpc": "2.0", "id": [1], "method": "ping"}, -32600, None),
    ({"jsonrpc": "2.0", "id": 1.5, "method": "ping"}, -32600, None),
    ({"jsonrpc": "2.0", "id": 2**64, "method": "ping"}, -32600, None),
    # Methods the server does not have.
    ({"jsonrpc": "2.0", "id": 40, "method": "no/such/method"}, -32601, 40),
    ({"jsonrpc": "2.0", "id": 41, "method": "no/such/method", "params": [1]}, -32601, 41),
    ({"jsonrpc": "2.0", "id": "", "method": ""}, -32601, ""),
]

# Notifications and responses are never answered, however malformed.
UNANSWERED: list[Any] = [
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": "x"},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": [1]},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": 3},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": []}},
    {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 12345}},
    {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": {}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized", "params": 5},
    {"jsonrpc": "2.0", "method": "notifications/initialized", "params": {"_meta": 1}},
    {"jsonrpc": "2.0", "method": "notifications/no-such"},
    {"jsonrpc": "2.0", "method": "no/such", "params": {}},
    {"jsonrpc": "2.0", "id": 999, "result": {}},
    {"jsonrpc": "2.0", "id": 998, "error": {"code": -32000, "message": "no"}},
    {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "Parse error"}},
    {"jsonrpc": "2.0", "result": {}},
    {"jsonrpc": "2.0", "id": 997, "result": {}, "error": {"code": 1, "message": "m"}},
    {"jsonrpc": "2.0", "id": [], "result": {}},
    {"id": 996, "result": {}},
]


def check_unanswered(raw: Raw, round: str) -> None:
    for n, message in enumerate(UNANSWERED):
        raw.send(message)
        raw.ping(f"{round}-quiet-{n}")


def test_every_malformed_request_gets_the_right_error_with_an_id_member(host: Host) -> None:
    raw = Raw(host)
    try:
        # Before the session: nothing ends it, and notifications or responses get no reply.
        check_unanswered(raw, "before")
        raw.initialize("2025-11-25")
        check_unanswered(raw, "after")
        for message, code, id in REFUSED:
            raw.send_bytes(json.dumps(message).encode())
            reply = raw.recv()
            assert error_reply(reply) == (code, id), (message, reply)
            if code == -32602:
                assert "params" in reply["error"]["message"], reply
        raw.ping("last")
        raw.send({"jsonrpc": "2.0", "id": 50, "method": "tools/call",
                  "params": {"name": "dynocap_ps", "arguments": {}}})
        reply = raw.recv()
        assert reply["id"] == 50 and reply["result"]["structuredContent"] == {"sandboxes": []}, reply
    finally:
        assert raw.close() == 0
