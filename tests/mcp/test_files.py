"""The file tools over MCP with the official SDK, against real sandboxes: binary content written
and read back in base64, a 50 MB file read in pieces from offsets, edits refused when oldText is
absent or ambiguous, listings with depth and a long one read page by page, a guest symlink to /etc/shadow refused by the guest's
own permissions (the tools act as the sandbox user, and the agent's own /proc entries are as closed
to them as to that user's commands), and a task's relative paths and log."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from conftest import Host, connect, err, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]


async def sh(s, name: str, command: str) -> str:
    result = ok(await s.call_tool("dynocap_exec", {"name": name, "command": command,
                                                   "timeoutSeconds": 120}))
    assert result["exitCode"] == 0, result
    return result["stdout"]


async def test_files_binary_round_trip_big_read_edit_and_list(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "f"}))
        home = (await sh(s, "f", "echo $HOME")).strip()
        blob = bytes(range(256)) + b'"quotes" \\back\\slashes\n\x00'
        wrote = ok(await s.call_tool("dynocap_write_file", {
            "name": "f", "path": f"{home}/sub/dir/blob.bin", "createDirs": True,
            "content": base64.b64encode(blob).decode(), "encoding": "base64"}))
        assert wrote == {"path": f"{home}/sub/dir/blob.bin", "bytes": len(blob),
                         "created": True, "mode": "644"}
        # The file belongs to the sandbox user, as one its commands wrote would.
        assert (await sh(s, "f", f"stat -c '%U %a' {home}/sub/dir/blob.bin; id -un")).split() \
            == [(await sh(s, "f", "id -un")).strip(), "644", (await sh(s, "f", "id -un")).strip()]
        back = ok(await s.call_tool("dynocap_read_file", {
            "name": "f", "path": f"{home}/sub/dir/blob.bin", "encoding": "base64"}))
        assert base64.b64decode(back["content"]) == blob
        assert (back["totalSize"], back["more"], back["nextOffset"]) == (len(blob), False, len(blob))
        text = err(await s.call_tool("dynocap_read_file", {
            "name": "f", "path": f"{home}/sub/dir/blob.bin"}), "invalid_argument")
        assert "base64" in text
        # A mode asked for is the mode the file gets, whatever the umask.
        script = ok(await s.call_tool("dynocap_write_file", {
            "name": "f", "path": f"{home}/run.sh", "content": "#!/bin/sh\necho 'it ran'\n",
            "mode": "755"}))
        assert script["mode"] == "755"
        assert await sh(s, "f", f"{home}/run.sh") == "it ran\n"
        # Or the bits' value as a number (493 = 0755); 755 as a number is refused, not octal 1363.
        again = ok(await s.call_tool("dynocap_write_file", {
            "name": "f", "path": f"{home}/run.sh", "content": "#!/bin/sh\n", "mode": 488}))
        assert again["mode"] == "750"
        text = err(await s.call_tool("dynocap_write_file", {
            "name": "f", "path": f"{home}/run.sh", "mode": 755}), "invalid_argument")
        assert '"755", or the number 493' in text
        assert (await sh(s, "f", f"stat -c %a {home}/run.sh")).strip() == "750"

        # 50 MB read in pieces from offsets, checked against the guest's own sha256.
        await sh(s, "f", f"head -c 50000000 /dev/urandom > {home}/big")
        want = (await sh(s, "f", f"sha256sum {home}/big")).split()[0]
        digest, offset, calls = hashlib.sha256(), 0, 0
        while True:
            piece = ok(await s.call_tool("dynocap_read_file", {
                "name": "f", "path": f"{home}/big", "offset": offset, "length": 524288,
                "encoding": "base64"}))
            data = base64.b64decode(piece["content"])
            assert piece["offset"] == offset and piece["length"] == len(data) <= 524288
            assert piece["totalSize"] == 50000000
            digest.update(data)
            offset, calls = piece["nextOffset"], calls + 1
            if not piece["more"]:
                break
        assert offset == 50000000 and digest.hexdigest() == want and calls == 96
        # The default window is 64 KiB; past the end is an empty read.
        first = ok(await s.call_tool("dynocap_read_file", {
            "name": "f", "path": f"{home}/big", "encoding": "base64"}))
        assert first["length"] == 65536 and first["more"] is True
        end = ok(await s.call_tool("dynocap_read_file", {
            "name": "f", "path": f"{home}/big", "offset": 60000000, "encoding": "base64"}))
        assert (end["length"], end["content"], end["more"]) == (0, "", False)

        # Edits: absent and ambiguous oldText are refused and change nothing; unique works.
        ok(await s.call_tool("dynocap_write_file", {
            "name": "f", "path": f"{home}/code.py", "content": "x = 1\ny = 1\nprint(x)\n"}))
        text = err(await s.call_tool("dynocap_edit_file", {
            "name": "f", "path": f"{home}/code.py", "oldText": "z = 1", "newText": "z = 2"}),
            "invalid_argument")
        assert "not found" in text
        text = err(await s.call_tool("dynocap_edit_file", {
            "name": "f", "path": f"{home}/code.py", "oldText": " = 1", "newText": " = 2"}),
            "invalid_argument")
        assert "occurs 2 times" in text
        assert await sh(s, "f", f"cat {home}/code.py") == "x = 1\ny = 1\nprint(x)\n"
        edited = ok(await s.call_tool("dynocap_edit_file", {
            "name": "f", "path": f"{home}/code.py", "oldText": "y = 1", "newText": "y = \"two\""}))
        assert edited["replacements"] == 1
        every = ok(await s.call_tool("dynocap_edit_file", {
            "name": "f", "path": f"{home}/code.py", "oldText": "x", "newText": "ex",
            "replaceAll": True}))
        assert every["replacements"] == 2
        assert await sh(s, "f", f"cat {home}/code.py") == "ex = 1\ny = \"two\"\nprint(ex)\n"

        # Listings: depth, types, sizes, modes and a symlink's target, never followed.
        await sh(s, "f", f"ln -s /etc {home}/sub/etc-link")
        one = ok(await s.call_tool("dynocap_list_files", {"name": "f", "path": f"{home}/sub"}))
        assert [(e["name"], e["type"]) for e in one["entries"]] == [("dir", "dir"), ("etc-link", "symlink")]
        assert one["entries"][1]["target"] == "/etc" and one["leftOff"] == 0
        two = ok(await s.call_tool("dynocap_list_files", {"name": "f", "path": f"{home}/sub",
                                                         "depth": 2}))
        assert [(e["name"], e["type"], e["size"], e["mode"]) for e in two["entries"]] == [
            ("dir", "dir", two["entries"][0]["size"], "755"),
            ("dir/blob.bin", "file", len(blob), "644"),
            ("etc-link", "symlink", 4, "777"),
        ]
        err(await s.call_tool("dynocap_list_files", {"name": "f", "path": f"{home}/sub",
                                                    "depth": 9}), "invalid_argument")
        assert (one["nextOffset"], two["nextOffset"]) == (2, 3)
        # Past the bound of 2000 entries a call, the rest is listed page by page from
        # nextOffset: every name once, in order.
        await sh(s, "f", f"mkdir {home}/many && cd {home}/many && seq -w 1 2345 | xargs touch")
        names, offset = [], 0
        while True:
            page = ok(await s.call_tool("dynocap_list_files", {
                "name": "f", "path": f"{home}/many", "offset": offset}))
            assert page["nextOffset"] == offset + len(page["entries"]) and page["entries"]
            names += [e["name"] for e in page["entries"]]
            assert page["leftOff"] == 2345 - len(names)
            offset = page["nextOffset"]
            if not page["leftOff"]:
                break
        assert names == [f"{i:04}" for i in range(1, 2346)] and offset == 2345


async def test_files_edge_cases_a_caller_meets(host: Host) -> None:
    """Set-id bits asked for are kept though the write clears them; a /proc file (size 0 until
    read) reads as cat shows it; an edit that changes nothing, a window that starts inside a
    character and malformed base64 are refused saying what to send instead."""
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "e", "diskMB": 256}))
        home = (await sh(s, "e", "echo $HOME")).strip()
        tool = ok(await s.call_tool("dynocap_write_file", {
            "name": "e", "path": f"{home}/tool", "content": "#!/bin/sh\n", "mode": "4755"}))
        assert tool["mode"] == "4755", tool
        assert (await sh(s, "e", f"stat -c %a {home}/tool")).strip() == "4755"
        # /proc/version says its size is 0; its text comes whole, and in windows.
        shown = await sh(s, "e", "cat /proc/version")
        whole = ok(await s.call_tool("dynocap_read_file", {"name": "e", "path": "/proc/version"}))
        assert (whole["content"], whole["totalSize"], whole["more"]) == (shown, len(shown), False)
        part = ok(await s.call_tool("dynocap_read_file", {
            "name": "e", "path": "/proc/version", "offset": 2, "length": 5}))
        assert (part["content"], part["nextOffset"], part["more"]) == (shown[2:7], 7, True)
        await s.call_tool("dynocap_write_file", {"name": "e", "path": f"{home}/t.txt",
                                                 "content": "héllo\n"})
        text = err(await s.call_tool("dynocap_edit_file", {
            "name": "e", "path": f"{home}/t.txt", "oldText": "llo", "newText": "llo"}),
            "invalid_argument")
        assert "would change nothing" in text, text
        text = err(await s.call_tool("dynocap_read_file", {
            "name": "e", "path": f"{home}/t.txt", "offset": 2}), "invalid_argument")
        assert "falls inside a UTF-8 character" in text, text
        text = err(await s.call_tool("dynocap_write_file", {
            "name": "e", "path": f"{home}/b.bin", "content": "aGk gdGhlcmU=",
            "encoding": "base64"}), "invalid_argument")
        assert "standard base64" in text, text
        assert ok(await s.call_tool("dynocap_exec", {
            "name": "e", "command": f"test -e {home}/b.bin"}))["exitCode"] == 1
        # Mode 0 (a number) leaves a file its owner cannot open; a write without a mode is
        # refused as `>` would be, one with a mode sets it first and writes.
        ro = f"{home}/ro.txt"
        assert ok(await s.call_tool("dynocap_write_file", {
            "name": "e", "path": ro, "content": "one", "mode": 0}))["mode"] == "0"
        err(await s.call_tool("dynocap_write_file", {"name": "e", "path": ro, "content": "two"}),
            "invalid_argument")
        for content, mode in (("three", "644"), ("four", "444")):
            assert ok(await s.call_tool("dynocap_write_file", {
                "name": "e", "path": ro, "content": content, "mode": mode}))["mode"] == mode
            assert await sh(s, "e", f"stat -c %a {ro}; cat {ro}") == f"{mode}\n{content}"


async def test_files_act_as_the_sandbox_user(host: Host) -> None:
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_run", {"name": "u"}))
        home = (await sh(s, "u", "echo $HOME")).strip()
        # The guest's root-only file, reached through a symlink the sandbox user made: its
        # /etc/shadow, or (the host image has none) the environment of the agent, which runs
        # as the guest's root.
        secret = (await sh(s, "u", "test -e /etc/shadow && echo /etc/shadow || echo /proc/1/environ")).strip()
        await sh(s, "u", f"ln -s {secret} {home}/shadow")
        denied = ok(await s.call_tool("dynocap_exec", {"name": "u", "command": f"cat {secret}"}))
        assert denied["exitCode"] != 0, f"the sandbox user must not read {secret} here"
        text = err(await s.call_tool("dynocap_read_file", {"name": "u", "path": f"{home}/shadow"}),
                   "invalid_argument")
        assert "Permission denied" in text, text
        err(await s.call_tool("dynocap_read_file", {"name": "u", "path": secret}),
            "invalid_argument")
        # Nor can it write where that user may not.
        text = err(await s.call_tool("dynocap_write_file", {
            "name": "u", "path": "/etc/dynocap-test", "content": "x"}), "invalid_argument")
        assert "Permission denied" in text, text
        assert ok(await s.call_tool("dynocap_exec", {
            "name": "u", "command": "test -e /etc/dynocap-test"}))["exitCode"] == 1
        text = err(await s.call_tool("dynocap_edit_file", {
            "name": "u", "path": "/etc/passwd", "oldText": "root", "newText": "toor",
            "replaceAll": True}), "invalid_argument")
        assert "Permission denied" in text, text
        # The agent's own /proc entries (PID 1: its descriptors, one of them its cgroup's
        # directory outside the guest's tree; its root; its memory map) are refused as they
        # are to the sandbox user's commands, and /proc/self is the operation's own.
        for path, tool, command in [("/proc/1/fd", "dynocap_list_files", "ls"),
                                    ("/proc/1/fd/4", "dynocap_list_files", "ls"),
                                    ("/proc/1/root", "dynocap_list_files", "ls"),
                                    ("/proc/1/maps", "dynocap_read_file", "cat")]:
            refused = ok(await s.call_tool("dynocap_exec", {
                "name": "u", "command": f"{command} {path}"}))
            assert refused["exitCode"] != 0, refused
            text = err(await s.call_tool(tool, {"name": "u", "path": path}), "invalid_argument")
            assert "Permission denied" in text, (path, text)
        status = ok(await s.call_tool("dynocap_read_file", {
            "name": "u", "path": "/proc/self/status"}))["content"]
        assert "\nPid:\t" in status and "\nPid:\t1\n" not in status, status
        # A name that is no sandbox is not_found.
        err(await s.call_tool("dynocap_read_file", {"name": "nope", "path": "/etc/hostname"}),
            "not_found")


async def test_files_in_a_task_are_relative_to_the_workspace_and_logged(host: Host) -> None:
    project = host.project("filesapp")
    async with connect(host) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project),
                                                           "name": "ft"}))
        readme = ok(await s.call_tool("dynocap_read_file", {"name": "ft", "path": "README.md"}))
        assert (readme["path"], readme["content"]) == ("/workspace/README.md", "hello\n")
        ok(await s.call_tool("dynocap_edit_file", {"name": "ft", "path": "README.md",
                                                   "oldText": "hello", "newText": "hello files"}))
        ok(await s.call_tool("dynocap_write_file", {"name": "ft", "path": "new/notes.txt",
                                                    "content": "note\n", "createDirs": True}))
        listed = ok(await s.call_tool("dynocap_list_files", {"name": "ft", "path": ".",
                                                            "depth": 2}))
        names = [e["name"] for e in listed["entries"]]
        assert "README.md" in names and "new/notes.txt" in names and "src/main.c" in names
        diff = (await s.call_tool("dynocap_diff", {"target": "ft"})).structured_content
        assert "+hello files" in diff["patch"] and "+note" in diff["patch"]
        log = host.state / "results" / task["id"] / "exec.jsonl"
        if not log.exists():
            log = next(host.state.rglob("exec.jsonl"))
        entries = [json.loads(line) for line in log.read_text().splitlines()]
        files = [(e["file"], e["path"]) for e in entries if "file" in e]
        assert files == [("read", "README.md"), ("edit", "README.md"),
                         ("write", "new/notes.txt"), ("list", ".")], entries
        assert all("content" not in e for e in entries)
