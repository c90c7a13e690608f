"""Shared fixtures for the MCP end-to-end tests.

Every test drives the real `target/debug/dynocap mcp` over stdio with a client nobody here
wrote: the official Python SDK (`mcp.client.stdio.stdio_client` + `ClientSession`), or raw
JSON lines through a pipe where the SDK would refuse to send what we want to test. Each
server gets a private world: its own DYNOCAP_HOME, a fake HOME (with ~/.ssh and ~/.aws) so the
real home directory is never touched, a working directory and the DYNOCAP_MCP_* variables the
test chooses.

Tests that boot sandboxes need root. Outside CI a missing requirement skips with the reason;
under CI=true it fails, because CI runs as root and nothing may be silently skipped there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession

from netfix import SSHD, NetFix
from mcp.client.stdio import StdioServerParameters, stdio_client

REPO = Path(__file__).resolve().parents[2]
DYNOCAP = Path(os.environ.get("DYNOCAP_MCP_TEST_BIN") or REPO / "target" / "debug" / "dynocap")
SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
UPDATE_SNAPSHOTS = os.environ.get("DYNOCAP_UPDATE_SNAPSHOTS") == "1"

# The variables the server reads; cleared for every test so the outer environment never leaks.
POLICY_VARS = (
    "DYNOCAP_MCP_ROOTS",
    "DYNOCAP_MCP_GIT_HOSTS",
    "DYNOCAP_MCP_ALLOW_FILTERED",
    "DYNOCAP_MCP_ALLOW_NAT",
    "DYNOCAP_MCP_ALLOW_SSH_KEY",
    "DYNOCAP_MCP_LOG",
)


# Every git host a test names in a repositoryUrl.
TEST_GIT_HOSTS = ("github.com", "gitlab.com", "bitbucket.org", "git.example.com", "xn--bcher-kva.example",
                  "evil.example")


def need(ok: bool, reason: str) -> None:
    """Skips (outside CI) or fails (in CI) the current test unless `ok`."""
    if ok:
        return
    if IN_CI:
        pytest.fail(f"{reason}; CI must run everything")
    pytest.skip(reason)


def is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fix() -> Iterator[NetFix]:
    """The loopback network fixture (HTTPS, git and ssh servers under test names; see
    netfix.py), for the tests of filtered networking."""
    for tool in ("openssl", "ssh-keygen", "git"):
        need(shutil.which(tool) is not None, f"{tool} is missing (scripts/install-deps.sh)")
    need(SSHD.is_file(), f"{SSHD} is missing: install openssh-server (scripts/install-deps.sh)")
    f = NetFix()
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def root_needed() -> None:
    """For tests that boot sandboxes."""
    need(is_root(), "needs root (sandboxes map user namespaces to a host uid range, cgroups)")


class Host:
    """A private world for one server: state dir, fake home, a root with projects."""

    def __init__(self) -> None:
        need(DYNOCAP.is_file(), f"{DYNOCAP} is missing: run `cargo build --workspace` first")
        # Short and resolved: control sockets live under the state dir (unix paths are short),
        # and the policy compares resolved paths.
        self.base = Path(tempfile.mkdtemp(prefix="dcm", dir="/tmp")).resolve()
        self.state = self.base / "s"
        self.home = self.base / "home"
        self.root = self.base / "root"
        self.outside = self.base / "outside"
        for d in (self.state, self.home / ".ssh", self.home / ".aws", self.home / "work",
                  self.root, self.outside):
            d.mkdir(parents=True, exist_ok=True)
        (self.home / ".ssh" / "config").write_text("Host *\n")
        self.log = self.base / "server.log"

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {
            "DYNOCAP_HOME": str(self.state),
            "HOME": str(self.home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            # Clones the policy lets through go through the egress proxy, which would resolve
            # these names on the host: send them to a loopback address nothing listens on, so
            # no test ever sends a DNS query or a packet anywhere else.
            "DYNOCAP_RESOLVE": ",".join(f"{h}:{p}:127.0.0.9" for h in TEST_GIT_HOSTS for p in (443, 22)),
            # A project's package cache sets its whole size aside on the host when made (2 GB
            # by default): the tests make many projects, and none fills more than this.
            "DYNOCAP_CACHE_MB": "256",
        }
        env.update(extra or {})
        return env

    def project(self, name: str = "app", git: bool = True, files: dict[str, str] | None = None) -> Path:
        """A project directory under the root, a git repository with one commit by default."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        for rel, text in (files or {"README.md": "hello\n", "src/main.c": "int main(void) { return 0; }\n"}).items():
            target = path / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        if git:
            git_env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1",
                           HOME=str(self.home))
            for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                         ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init"]):
                subprocess.run(["git", *args], cwd=path, env=git_env, check=True)
        return path

    def cli(self, *args: str) -> Any:
        """`dynocap --json ARGS` against this state dir; the parsed stdout (or None)."""
        out = subprocess.run([str(DYNOCAP), "--json", *args], env=self.env(), capture_output=True,
                             text=True, timeout=120)
        try:
            return json.loads(out.stdout)
        except ValueError:
            return None

    def server_log(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def cleanup(self) -> None:
        ps = self.cli("ps") or {}
        for sandbox in ps.get("sandboxes", []):
            self.cli("destroy", sandbox["name"])
        ls = self.cli("ls") or {}
        for task in ls.get("tasks", []):
            self.cli("rm", "--force", "--purge", task["id"])
        self.cli("pool", "--drain")  # a warm pool (DYNOCAP_WARM_POOL) is listed nowhere else
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def host() -> Any:
    h = Host()
    try:
        yield h
    finally:
        h.cleanup()


@contextlib.asynccontextmanager
async def connect(host: Host, *, cwd: Path | str | None = None, env: dict[str, str] | None = None,
                  args: tuple[str, ...] = (), modern: bool = False,
                  wrap: tuple[str, ...] = ()) -> AsyncIterator[ClientSession]:
    """Starts `dynocap mcp` for `host` and yields an initialized client session. `wrap` is a
    command the server runs under (e.g. one that enters a test network namespace)."""
    argv = [*wrap, str(DYNOCAP), "mcp", *args]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=host.env(env),
                                   cwd=str(cwd or host.root))
    with open(host.log, "a") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                if modern:
                    await session.discover()
                else:
                    await session.initialize()
                yield session


def text_of(result: Any) -> str:
    assert len(result.content) == 1, result
    assert result.content[0].type == "text", result
    return result.content[0].text


def ok(result: Any) -> dict[str, Any]:
    """A successful result's structuredContent; checks the text item is the same JSON."""
    text = text_of(result)
    assert not result.is_error, text
    assert isinstance(result.structured_content, dict), result
    assert json.loads(text) == result.structured_content
    return result.structured_content


def err(result: Any, code: str) -> str:
    """A refused result's text; checks it is an error starting with `code: `."""
    text = text_of(result)
    assert result.is_error, f"expected {code}, got success: {text}"
    assert text.startswith(code + ": "), text
    return text


def snapshot(name: str, value: Any) -> Any:
    """Compares `value` with snapshots/NAME (writes it when DYNOCAP_UPDATE_SNAPSHOTS=1)."""
    path = SNAPSHOTS / name
    rendered = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if UPDATE_SNAPSHOTS:
        path.write_text(rendered)
    need(path.exists(), f"{path} is missing: run with DYNOCAP_UPDATE_SNAPSHOTS=1 to create it")
    expected = json.loads(path.read_text())
    assert value == expected, (
        f"{name} changed; if intended, rerun with DYNOCAP_UPDATE_SNAPSHOTS=1 and commit the file"
    )
    return expected
