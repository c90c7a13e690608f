"""Generated files over MCP: a Python project without a .gitignore leaves bytecode in
pkg/__pycache__/ beside real edits and a large binary asset. dynocap_diff shows the edits
first within its bound and lists the bytecode as a generated group; dynocap_task_finish
leaves it out of the patch (kept in generatedPatchPath) unless includeGenerated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession

from conftest import Host, connect, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

FILES = {
    "pkg/__init__.py": "",
    "pkg/cli.py": "def main():\n    return 1\n",
    "tests/test_cli.py": "from pkg.cli import main\n\ndef test_main():\n    assert main() == 1\n",
}

# The edits, a new text file, a 60 KB binary asset (before pkg/ in patch order, so it alone
# would fill the 64 KiB bound) and 60 KB of bytecode.
AGENT = (
    "set -e; printf 'def main():\\n    return 2\\n' > pkg/cli.py; "
    "sed -i 's/== 1/== 2/' tests/test_cli.py; "
    "printf 'def helper():\\n    return 1\\n' > pkg/helpers.py; "
    "mkdir -p assets pkg/__pycache__; "
    "head -c 60000 /dev/urandom > assets/logo.png; "
    "head -c 60000 /dev/urandom > pkg/__pycache__/cli.cpython-311.pyc"
)

PYC = "pkg/__pycache__/cli.cpython-311.pyc"


async def start_and_work(s: ClientSession, project: Path, name: str) -> None:
    ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": name}))
    out = ok(await s.call_tool("dynocap_task_exec", {"name": name, "command": AGENT}))
    assert out["exitCode"] == 0, out


async def diff_of(s: ClientSession, target: str) -> dict[str, Any]:
    """The Diff object (its text is a header line and the patch, not one JSON value)."""
    result = await s.call_tool("dynocap_diff", {"target": target})
    assert not result.is_error, result.content[0].text
    return result.structured_content


def group_counts(result: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(g["pattern"], g["under"], g["files"]) for g in result.get("generated", [])]


async def test_generated_files_are_grouped_and_left_out_unless_asked(host: Host) -> None:
    project = host.project("py", files=FILES)
    async with connect(host) as s:
        await start_and_work(s, project, "gen")
        diff = await diff_of(s, "gen")
        assert group_counts(diff) == [("__pycache__/", "pkg", 1)], diff["generated"]
        assert diff["generated"][0]["patchBytes"] > 60000
        paths = [c["path"] for c in diff["changes"]]
        assert sorted(paths) == ["assets/logo.png", "pkg/cli.py", "pkg/helpers.py",
                                 "tests/test_cli.py"], paths
        assert diff["files"] == 4
        patch = diff["patch"]
        # The tracked edits first, then the new text file; the asset past the bound.
        assert patch.index("b/pkg/cli.py") < patch.index("b/tests/test_cli.py") < patch.index(
            "b/pkg/helpers.py"), patch
        assert "__pycache__" not in patch and "GIT binary patch" not in patch
        assert diff["omittedFiles"] == ["assets/logo.png"]

        finished = ok(await s.call_tool("dynocap_task_finish", {"id": "gen"}))
        assert finished["verified"] is True, finished
        assert group_counts(finished) == [("__pycache__/", "pkg", 1)]
        assert "generatedIncluded" not in finished
        assert finished["files"] == 4
        assert "__pycache__" not in Path(finished["patchPath"]).read_text(errors="replace")
        left_out = Path(finished["generatedPatchPath"]).read_text(errors="replace")
        assert f"b/{PYC}" in left_out

        await start_and_work(s, project, "gen2")
        kept = ok(await s.call_tool("dynocap_task_finish", {"id": "gen2", "includeGenerated": True}))
        assert kept["verified"] is True, kept
        assert kept["generatedIncluded"] is True
        assert group_counts(kept) == [("__pycache__/", "pkg", 1)]
        assert "generatedPatchPath" not in kept
        assert kept["files"] == 5
        assert f"b/{PYC}" in Path(kept["patchPath"]).read_text(errors="replace")


async def test_a_project_without_generated_files_has_no_group(host: Host) -> None:
    project = host.project("plain", files=FILES)
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "plain"}))
        out = ok(await s.call_tool("dynocap_task_exec",
                                   {"name": "plain", "command": "echo x >> pkg/cli.py"}))
        assert out["exitCode"] == 0
        diff = await diff_of(s, "plain")
        assert "generated" not in diff and diff["files"] == 1
        finished = ok(await s.call_tool("dynocap_task_finish", {"id": "plain"}))
        assert "generated" not in finished and "generatedPatchPath" not in finished


async def test_a_regenerated_lock_file_does_not_hide_the_edits(host: Host) -> None:
    """A tracked lock file rewritten past the bound sorts before the source edit: the edit is
    shown whole, the lock file is named in omittedFiles."""
    lock = "".join(f'    "dep-{i}": "1.0.{i}",\n' for i in range(3000))
    project = host.project("node", files={
        "package-lock.json": "{\n" + lock + "}\n",
        "src/index.js": "module.exports = 1;\n",
    })
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "lock"}))
        out = ok(await s.call_tool("dynocap_task_exec", {"name": "lock", "command": (
            "set -e; sed -i 's/1\\.0\\./2.0./' package-lock.json; "
            "echo 'module.exports = 2;' > src/index.js")}))
        assert out["exitCode"] == 0, out
        diff = await diff_of(s, "lock")
        assert sorted(c["path"] for c in diff["changes"]) == ["package-lock.json", "src/index.js"]
        assert diff["omittedFiles"] == ["package-lock.json"], diff["omittedFiles"]
        assert "b/src/index.js" in diff["patch"] and "+module.exports = 2;" in diff["patch"]
        assert "package-lock.json" not in diff["patch"]
        # Asked for alone, the lock file's entry is shown (up to the bound).
        alone = await s.call_tool("dynocap_diff", {"target": "lock", "paths": ["package-lock.json"]})
        assert "b/package-lock.json" in alone.structured_content["patch"]
