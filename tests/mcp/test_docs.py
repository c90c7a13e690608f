"""docs/mcp.md against the server: the tools it documents are the tools `dynocap mcp` serves,
and each tool's parameter table (names, types, defaults, ranges, which are required) is the
tool's `inputSchema`. A tool added to the server and not to the page, one the page keeps after
the server dropped it, a parameter renamed, or a default or range changed on one side only
fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Host, connect

pytestmark = pytest.mark.anyio

DOC = REPO / "docs" / "mcp.md"

# A tool's section: `### `dynocap_…``, up to the next heading of level 2 or 3.
TOOL_HEADING = re.compile(r"^### `(dynocap_[a-z_]+)`\s*$")
SECTION_END = re.compile(r"^#{2,3} ")
TABLE_HEADER = "| parameter | type | default | range | meaning |"


def cells(row: str) -> list[str]:
    """The cells of one markdown table row (no cell of these tables holds a `|`)."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def documented_tools(text: str) -> dict[str, list[list[str]]]:
    """Every tool section of the page with the rows of its parameter table, in page order.
    A section without a table documents a tool without parameters."""
    tools: dict[str, list[list[str]]] = {}
    current: str | None = None
    in_table = False
    for line in text.splitlines():
        heading = TOOL_HEADING.match(line)
        if heading:
            current = heading.group(1)
            assert current not in tools, f"docs/mcp.md documents {current} twice"
            tools[current] = []
            in_table = False
        elif SECTION_END.match(line):
            current, in_table = None, False
        elif current is None:
            continue
        elif line.strip() == TABLE_HEADER:
            assert not tools[current], f"{current}: two parameter tables"
            in_table = True
        elif in_table and line.startswith("|"):
            if not set(line) <= set("|-: "):
                tools[current].append(cells(line))
        else:
            in_table = False
    return tools


def expected_row(name: str, prop: dict[str, Any], required: bool) -> list[str]:
    """The first four cells a parameter's row must have, rendered from its schema."""
    default = "required" if required else (
        f"`{json.dumps(prop['default'])}`" if "default" in prop else "—")
    if "enum" in prop:
        bounds = ", ".join(f"`{v}`" for v in prop["enum"])
    elif "minimum" in prop or "maximum" in prop:
        bounds = f"{prop['minimum']}–{prop['maximum']}"
    else:
        bounds = "—"
    return [f"`{name}`", prop["type"], default, bounds]


def compare(served: list[Any], text: str) -> list[str]:
    """What differs between the tools the server lists and the page; empty when they agree."""
    documented = documented_tools(text)
    problems = []
    names = [tool.name for tool in served]
    for name in names:
        if name not in documented:
            problems.append(f"the server serves {name}, which docs/mcp.md does not document")
    for name in documented:
        if name not in names:
            problems.append(f"docs/mcp.md documents {name}, which the server does not serve")
    for tool in served:
        rows = documented.get(tool.name)
        if rows is None:
            continue
        schema = tool.input_schema
        props: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        by_name = {row[0]: row for row in rows}
        if len(by_name) != len(rows):
            problems.append(f"{tool.name}: a parameter is documented twice")
        for param, prop in props.items():
            row = by_name.get(f"`{param}`")
            if row is None:
                problems.append(f"{tool.name}: parameter {param} is not documented")
                continue
            want = expected_row(param, prop, param in required)
            if row[:4] != want:
                problems.append(f"{tool.name}: {param} is documented as {row[:4]}, served as {want}")
            if len(row) < 5 or not row[4]:
                problems.append(f"{tool.name}: {param} has no meaning documented")
        for documented_param in by_name:
            if documented_param.strip("`") not in props:
                problems.append(f"{tool.name}: docs/mcp.md documents {documented_param}, "
                                "which the tool does not take")
    return problems


async def test_docs_mcp_documents_every_served_tool_and_parameter(host: Host) -> None:
    """The page and the live `tools/list` agree on every tool and every parameter."""
    async with connect(host) as session:
        listing = await session.list_tools()
    problems = compare(listing.tools, DOC.read_text())
    assert not problems, "docs/mcp.md and the server disagree:\n" + "\n".join(problems)


async def test_docs_check_fails_on_a_missing_extra_or_changed_tool(host: Host) -> None:
    """The comparison catches each shape of drift: a served tool the page lacks, a documented
    tool the server lacks, a parameter gone from the page, one the tool does not take, and a
    default that differs. Each is made by editing a copy of the real page."""
    async with connect(host) as session:
        listing = await session.list_tools()
    text = DOC.read_text()
    assert compare(listing.tools, text) == []

    # A served tool whose section is gone from the page.
    without_ps = re.sub(r"### `dynocap_ps`\n.*?(?=\n### )", "", text, flags=re.S)
    assert "### `dynocap_ps`" not in without_ps
    assert any("serves dynocap_ps" in p for p in compare(listing.tools, without_ps))

    # A documented tool the server does not serve.
    extra = text + "\n### `dynocap_task_apply`\n\nApplies the patch.\n"
    assert any("documents dynocap_task_apply" in p for p in compare(listing.tools, extra))

    # A parameter dropped from a table.
    no_stat = "\n".join(line for line in text.splitlines() if not line.startswith("| `stat` |"))
    assert any("dynocap_diff: parameter stat" in p for p in compare(listing.tools, no_stat))

    # A parameter the tool does not take.
    bogus = text.replace("| `purge` | boolean |", "| `wipe` | boolean | `false` | — | x |\n"
                         "| `purge` | boolean |", 1)
    assert any("documents `wipe`" in p for p in compare(listing.tools, bogus))

    # A default that differs from the served one.
    wrong = text.replace("| `cpus` | integer | `1` | 1–64 |", "| `cpus` | integer | `2` | 1–64 |", 1)
    assert wrong != text
    assert any("dynocap_run: cpus" in p for p in compare(listing.tools, wrong))
