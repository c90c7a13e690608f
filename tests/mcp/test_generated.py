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


async def test_a_real_test_run_leaves_bytecode_out_of_the_diff_and_the_commit(host: Host) -> None:
    """The issue's case: a Python project without a .gitignore runs its tests in the task
    (real bytecode, tens of KB of it, in two __pycache__/ directories). The edits are shown
    whole in dynocap_diff, the bytecode is a generated group, and neither the finished patch
    nor `task apply`'s commit holds it; both say what they left out."""
    modules = {f"idna/table{i}.py": "".join(f"def f{j}(x):\n    return x * {j} + {i}\n"
                                              for j in range(60)) for i in range(30)}
    files = {
        "idna/__init__.py": "".join(f"from . import table{i}\n" for i in range(30)),
        "idna/cli.py": "def main(argv):\n    return argv[0].encode('ascii')\n",
        "tests/__init__.py": "",
        "tests/test_idna_cli.py": ("import unittest\nfrom idna.cli import main\n\n"
                                   "class T(unittest.TestCase):\n    def test_main(self):\n"
                                   "        self.assertEqual(main(['a']), b'a')\n"),
        **modules,
    }
    project = host.project("idna", files=files)
    async with connect(host) as s:
        ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "idna"}))
        out = ok(await s.call_tool("dynocap_task_exec", {"name": "idna", "command": (
            "set -e; sed -i \"s/argv\\[0\\]/argv[0].lower()/\" idna/cli.py; "
            "printf '    def test_lower(self):\\n        self.assertEqual(main([\"A\"]), b\"a\")\\n'"
            " >> tests/test_idna_cli.py; "
            "python3 -m unittest discover -s tests -t . 2>&1; "
            "find . -name '*.pyc' | wc -l")}))
        assert out["exitCode"] == 0, out
        assert "OK" in out["stdout"], out
        pyc_count = int(out["stdout"].strip().splitlines()[-1])
        assert pyc_count >= 32, out["stdout"]

        diff = await diff_of(s, "idna")
        assert sorted(c["path"] for c in diff["changes"]) == ["idna/cli.py",
                                                              "tests/test_idna_cli.py"], diff
        assert diff["omittedFiles"] == [], diff["omittedFiles"]
        assert "argv[0].lower()" in diff["patch"] and "test_lower" in diff["patch"]
        assert "__pycache__" not in diff["patch"] and "GIT binary patch" not in diff["patch"]
        groups = {(g["pattern"], g["under"]): g for g in diff["generated"]}
        assert set(groups) == {("__pycache__/", "idna"), ("__pycache__/", "tests")}, groups
        assert sum(g["files"] for g in groups.values()) == pyc_count
        assert groups[("__pycache__/", "idna")]["patchBytes"] > 50_000, groups

        finished = ok(await s.call_tool("dynocap_task_finish", {"id": "idna"}))
        assert finished["verified"] is True and finished["files"] == 2, finished
        assert "__pycache__" not in Path(finished["patchPath"]).read_text(errors="replace")
        assert "__pycache__" in Path(finished["generatedPatchPath"]).read_text(errors="replace")
    applied = host.cli("task", "apply", "idna", "--branch", "agent")
    assert applied["files"] == ["idna/cli.py", "tests/test_idna_cli.py"], applied
    assert sum(g["files"] for g in applied["generated"]) == pyc_count, applied
    assert applied["generatedPatchPath"] == finished["generatedPatchPath"]
