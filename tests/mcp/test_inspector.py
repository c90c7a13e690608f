"""The MCP Inspector CLI (`npx @modelcontextprotocol/inspector --cli`), pinned in
package.json, as a second independent client: it lists the tools (with its --strict schema
portability check) and calls them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import DYNOCAP, SNAPSHOTS, Host, is_root, need

HERE = Path(__file__).resolve().parent
BIN = HERE / "node_modules" / ".bin"


def inspector(host: Host, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    need((BIN / "mcp-inspector").exists() and (BIN / "node").exists(),
         "the MCP Inspector is not installed: run scripts/install-deps.sh (npm ci in tests/mcp)")
    server_env: list[str] = []
    for key, value in host.env(env).items():
        server_env += ["-e", f"{key}={value}"]
    command = ["npx", "--no-install", "@modelcontextprotocol/inspector", "--cli",
               "--cwd", str(host.root), *server_env, str(DYNOCAP), "mcp", *args]
    # The Node.js the Inspector needs (>= 22.19) comes from node_modules, first on PATH.
    run_env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                   NO_UPDATE_NOTIFIER="1", npm_config_update_notifier="false")
    return subprocess.run(command, cwd=HERE, env=run_env, capture_output=True, text=True, timeout=120)


def answer(proc: subprocess.CompletedProcess[str]) -> Any:
    try:
        return json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from the inspector (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")


def test_inspector_lists_the_tools_strictly(host: Host) -> None:
    proc = inspector(host, "--strict", "--method", "tools/list")
    assert proc.returncode == 0, proc.stderr
    listing = answer(proc)
    expected = json.loads((SNAPSHOTS / "tools_list.json").read_text())
    assert [t["name"] for t in listing["tools"]] == [t["name"] for t in expected["tools"]]
    for tool, want in zip(listing["tools"], expected["tools"]):
        assert tool["inputSchema"] == want["inputSchema"]
        assert tool["outputSchema"] == want["outputSchema"]
    # --strict reports every schema portability finding (type unions, $ref, ...) on stderr.
    assert "Warning: tool" not in proc.stderr and "Error: tool" not in proc.stderr, proc.stderr


def test_inspector_calls_tools(host: Host) -> None:
    need(is_root(), "needs root (boots a sandbox)")
    box = answer(inspector(host, "--method", "tools/call", "--tool-name", "dynocap_run",
                           "--tool-arg", "name=insp", "ttlSeconds=60", "memoryMB=256"))
    assert box["isError"] is False
    assert box["structuredContent"]["ttlSeconds"] == 60 and box["structuredContent"]["memoryMB"] == 256
    out = answer(inspector(host, "--method", "tools/call", "--tool-name", "dynocap_exec",
                           "--tool-arg", "name=insp", "command=echo from-inspector; pwd"))
    assert out["structuredContent"]["stdout"] == "from-inspector\n/\n"
    proc = inspector(host, "--method", "tools/call", "--tool-name", "dynocap_run",
                     "--tool-arg", "name=insp2", "ttlSeconds=29")
    refused = answer(proc)
    assert proc.returncode != 0 and refused["isError"] is True
    assert refused["content"][0]["text"].startswith("invalid_argument: ttlSeconds 29")
    proc = inspector(host, "--method", "tools/call", "--tool-name", "dynocap_run",
                     "--tool-arg", "name=insp3", "network=nat")
    assert answer(proc)["content"][0]["text"].startswith("policy_denied: ")
    gone = answer(inspector(host, "--method", "tools/call", "--tool-name", "dynocap_destroy",
                            "--tool-arg", "name=insp"))
    assert gone["structuredContent"] == {"destroyed": "insp"}
