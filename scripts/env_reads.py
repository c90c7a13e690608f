#!/usr/bin/env python3
"""Checks that the engine, the libraries below it and the modules of the `dynocap` binary read
no environment variable: every setting is read once, in crates/dynocap/src/config.rs (the
binary's edge), and passed down.

A read is a use of `env::var`, `env::var_os`, `env::vars` or `env::vars_os` (however the path
is spelt) or `getenv` in the src/ of the crates in LIBRARIES, outside test code (files named
tests.rs, files under a tests/ folder, and the item after a `#[cfg(test)]`) and EDGE. The
static client and the guest agent are programs of their own and read their own. A read that is not configuration
stays where the line right above it is a comment with `env-read-ok:` and the reason: the
environment handed on to a child process, and the test-only failpoints. Exits 1 naming each
other read.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = [
    "engine",
    "backend-jail",
    "backend-vm",
    "host",
    "cgroup",
    "netproxy",
    "review",
    "proto",
    "dynocap",
]
# Where the settings are read.
EDGE = ROOT / "crates" / "dynocap" / "src" / "config.rs"
READ = re.compile(r"\benv::(var|var_os|vars|vars_os)\b|\bgetenv\b")
MARK = "env-read-ok:"


def code_lines(text):
    """(line number, line) of the lines outside `#[cfg(test)]` items."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            # Skip the item: up to its closing brace, or its `;`.
            depth = 0
            opened = False
            i += 1
            while i < len(lines):
                line = lines[i].split("//", 1)[0]
                depth += line.count("{") - line.count("}")
                opened = opened or "{" in line
                i += 1
                if (opened and depth <= 0) or (not opened and line.rstrip().endswith(";")):
                    break
            continue
        yield i + 1, lines[i]
        i += 1


def is_test_file(src, path):
    rel = path.relative_to(src)
    return path.name == "tests.rs" or "tests" in rel.parts[:-1]


def main():
    found = []
    sources = [ROOT / "crates" / name / "src" for name in LIBRARIES]
    for src, path in sorted((src, path) for src in sources for path in src.rglob("*.rs")):
        if is_test_file(src, path) or path == EDGE:
            continue
        lines = path.read_text().splitlines()
        for number, line in code_lines(path.read_text()):
            code = line.split("//", 1)[0]
            if not READ.search(code):
                continue
            above = lines[number - 2].strip() if number >= 2 else ""
            if above.startswith("//") and MARK in above:
                continue
            found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    if found:
        print(
            "a library reads the environment; take the setting from the engine's Config (built in "
            "crates/dynocap/src/config.rs), or, for what is not configuration (a child's "
            f"environment), say why in a `// {MARK}` comment on the line above:",
            file=sys.stderr,
        )
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
