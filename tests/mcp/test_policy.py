"""The host security policy, enforced by the server whatever the caller says:
DYNOCAP_MCP_ROOTS (and the always-refused home set), DYNOCAP_MCP_GIT_HOSTS and the URL rules,
DYNOCAP_MCP_ALLOW_FILTERED / _NAT, DYNOCAP_MCP_ALLOW_SSH_KEY. Every refusal is a
`policy_denied` result naming the variable or rule, and a stderr line naming the rule.

Refusals happen before the engine is called, so those tests run without root. Requests the
policy allows reach the engine, which boots a sandbox: those need root."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp.client.session import ClientSession

from conftest import Host, connect, err, is_root, need, ok

pytestmark = pytest.mark.anyio


async def start(s: ClientSession, **args: Any) -> Any:
    return await s.call_tool("dynocap_task_start", args)


def refused(result: Any, *needles: str) -> str:
    text = err(result, "policy_denied")
    for needle in needles:
        assert needle in text, (needle, text)
    return text


async def allowed(s: ClientSession, result: Any) -> None:
    """The policy let it through: the task started, or the engine (not the policy) failed."""
    if result.is_error:
        text = result.content[0].text
        assert not text.startswith(("policy_denied", "invalid_argument")), text
        return
    task = ok(result)
    ok(await s.call_tool("dynocap_rm", {"target": task["id"], "force": True, "purge": True}))


def needs_root_for_allowed() -> None:
    need(is_root(), "requests the policy allows boot a sandbox, which needs root")


async def test_default_root_is_the_working_directory(host: Host) -> None:
    app = host.project("app", git=False)
    async with connect(host) as s:
        text = refused(await start(s, projectPath=str(host.outside)), "DYNOCAP_MCP_ROOTS", str(host.root))
        assert "outside the directories" in text
        err(await start(s, projectPath="relative/path"), "invalid_argument")
        if is_root():
            await allowed(s, await start(s, projectPath=str(app)))
    assert "[rule roots.outside]" in host.server_log()


async def test_roots_compare_whole_components(host: Host) -> None:
    app = host.project("app", git=False)
    app2 = host.project("app2", git=False)
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": str(app)}) as s:
        refused(await start(s, projectPath=str(app2)), "DYNOCAP_MCP_ROOTS")
        refused(await start(s, projectPath=str(host.root)))
        if is_root():
            await allowed(s, await start(s, projectPath=str(app / "src")))


async def test_dot_dot_is_resolved_before_the_check(host: Host) -> None:
    app = host.project("app", git=False)
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": str(app)}) as s:
        refused(await start(s, projectPath=f"{app}/../app2"))
        refused(await start(s, projectPath=f"{app}/../../outside"))
        refused(await start(s, projectPath=f"{app}/src/../../../home/.ssh"), ".ssh")
        if is_root():
            await allowed(s, await start(s, projectPath=f"{app}/src/.."))


async def test_symlinks_inside_a_root_are_followed_then_judged(host: Host) -> None:
    app = host.project("app", git=False)
    (host.root / "keys").symlink_to(host.home / ".ssh")
    (host.root / "escape").symlink_to(host.outside)
    (host.root / "alias").symlink_to(app)
    async with connect(host) as s:
        text = refused(await start(s, projectPath=str(host.root / "keys")), ".ssh", "never imported")
        assert str(host.home / ".ssh") in text  # the resolved target is named
        refused(await start(s, projectPath=str(host.root / "escape")), "outside the directories")
        if is_root():
            await allowed(s, await start(s, projectPath=str(host.root / "alias")))
    assert "[rule roots.refused-home]" in host.server_log()


async def test_a_root_that_is_a_symlink(host: Host) -> None:
    app = host.project("app", git=False)
    link = host.outside / "link"
    link.symlink_to(app)
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": str(link)}) as s:
        refused(await start(s, projectPath=str(host.root)))
        refused(await start(s, projectPath=str(host.outside)))
        if is_root():
            await allowed(s, await start(s, projectPath=str(link)))
            await allowed(s, await start(s, projectPath=str(app / "src")))


async def test_home_its_ancestors_and_dot_dirs_are_always_refused(host: Host) -> None:
    work = host.home / "work" / "proj"
    work.mkdir(parents=True)
    roots = ":".join(["/", str(host.home), str(host.base), str(host.home / ".aws"), str(host.home / "work")])
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": roots}) as s:
        for path, why in ((host.home, "is the home directory"),
                          (host.base, "ancestor of the home directory"),
                          (Path("/"), "is the filesystem root"),
                          (host.home / ".ssh", "dot directory"),
                          (host.home / ".aws", "dot directory"),
                          (host.home / ".config" / "nope", "dot directory")):
            refused(await start(s, projectPath=str(path)), why)
        if is_root() and Path("/root").is_dir():
            # The passwd entry's home of the server's user, whatever HOME says.
            refused(await start(s, projectPath="/root"), "home directory")
        if is_root():
            await allowed(s, await start(s, projectPath=str(work)))
    log = host.server_log()
    # Each refused root was ignored with a warning naming it.
    for root in ("/", str(host.home), str(host.base), str(host.home / ".aws")):
        assert f"ignoring {root}: it " in log, root


@pytest.mark.parametrize("where", ["slash", "home", "home-ancestor", "home-dotdir"])
async def test_started_from_slash_or_home_has_no_default_root(host: Host, where: str) -> None:
    cwd = {"slash": Path("/"), "home": host.home, "home-ancestor": host.base,
           "home-dotdir": host.home / ".aws"}[where]
    app = host.project("app", git=False)
    async with connect(host, cwd=cwd) as s:
        for path in (app, host.home / "work", cwd):
            text = refused(await start(s, projectPath=str(path)), "DYNOCAP_MCP_ROOTS", "no default root")
            assert f"started from {cwd}" in text
    assert "[rule roots.none]" in host.server_log()
    if is_root():
        async with connect(host, cwd=cwd, env={"DYNOCAP_MCP_ROOTS": str(host.root)}) as s:
            await allowed(s, await start(s, projectPath=str(app)))


async def test_an_empty_roots_variable_refuses_everything(host: Host) -> None:
    app = host.project("app", git=False)
    async with connect(host, env={"DYNOCAP_MCP_ROOTS": ""}) as s:
        refused(await start(s, projectPath=str(app)), "DYNOCAP_MCP_ROOTS", "it is empty")


async def test_missing_paths_and_files(host: Host) -> None:
    (host.root / "file.txt").write_text("x")
    async with connect(host) as s:
        text = err(await start(s, projectPath=str(host.root / "missing")), "invalid_argument")
        assert "cannot be opened" in text
        # Outside the roots, a missing path is refused like any other: no existence oracle.
        refused(await start(s, projectPath=str(host.outside / "missing")))
        refused(await start(s, projectPath="/root/.ssh/id_rsa"))
        err(await start(s, projectPath=str(host.root / "file.txt")), "invalid_argument")


async def test_project_path_and_repository_url_together_or_neither(host: Host) -> None:
    async with connect(host) as s:
        text = err(await start(s, projectPath=str(host.root), repositoryUrl="https://github.com/o/r"),
                   "invalid_argument")
        assert "not both" in text
        err(await start(s), "invalid_argument")
        err(await start(s, history="head"), "invalid_argument")


BAD_URLS = [
    ("http://github.com/o/r.git", "git.transport"),
    ("git://github.com/o/r.git", "git.transport"),
    ("file:///etc/passwd", "git.transport"),
    ("ext::sh -c touch% /tmp/pwned", "git.characters"),
    ("ext::sh", "git.transport"),
    ("fd::17", "git.transport"),
    ("/srv/repos/app.git", "git.local"),
    ("../app", "git.local"),
    ("app", "git.local"),
    ("-uhttps://github.com/o/r", "git.option"),
    ("--upload-pack=touch", "git.option"),
    ("https://github.com@evil.example/o/r", "git.userinfo"),
    ("https://token:x-oauth@github.com/o/r", "git.userinfo"),
    ("https://user@github.com/o/r", "git.userinfo"),
    ("ssh://git@evil.example@github.com/o/r", "git.userinfo"),
    ("ssh://-oProxyCommand=touch@github.com/o/r", "git.userinfo"),
    ("https://evil.example/o/r", "git.host"),
    ("https://github.com.evil.example/o/r", "git.host"),
    ("https://github%2Ecom/o/r", "git.host"),
    ("https://githu%62.com/o/r", "git.host"),
    ("https://127.0.0.1/o/r", "git.host"),
    ("https://[::1]/o/r", "git.host"),
    ("https://2130706433/o/r", "git.host"),
    ("https://github.com", "git.shape"),
    ("https://github.com/", "git.shape"),
    ("https://github.com#@evil.example/o/r", "git.shape"),
    ("https://github.com?@evil.example/o/r", "git.shape"),
    ("https://github.com:0/o/r", "git.shape"),
    ("https://github.com\\@evil.example/o/r", "git.shape"),
    ("https://github.com/o/r\n--upload-pack=x", "git.characters"),
    ("https://github.com/o/r\t", "git.characters"),
    ("https://github.com/o r", "git.characters"),
    ("https://github.com/o/r\u0000", "git.characters"),
    ("https://github.com/o/r\u200b", "git.characters"),
    ("github.com:o/r.git", "git.shape"),
    ("git@github.com:-oProxyCommand=x", "git.shape"),
    ("git@evil.example:o/r.git", "git.host"),
    ("git:pw@github.com:o/r", "git.shape"),
    # The clone's proxy opens 443 for https and 22 for ssh, each in one spelling.
    ("https://github.com:8443/o/r", "git.port"),
    ("ssh://git@github.com:2222/o/r", "git.port"),
    ("https://github.com:0443/o/r", "git.shape"),
    ("https://github.com:+443/o/r", "git.shape"),
    ("https://[::1]:443/o/r", "git.host"),
    ("https://a@b@github.com/o/r", "git.userinfo"),
    ("https://@github.com/o/r", "git.userinfo"),
]

GOOD_URLS = [
    "https://github.com/octo/app.git",
    "HTTPS://GitHub.com/octo/app",
    "https://github.com./octo/app",
    "https://gitlab.com:443/group/sub/app.git",
    "ssh://git@github.com/octo/app.git",
    "ssh://git@bitbucket.org:22/octo/app.git",
    "git@github.com:octo/app.git",
]


async def test_bad_repository_urls_are_refused(host: Host) -> None:
    async with connect(host) as s:
        for url, rule in BAD_URLS:
            result = await start(s, repositoryUrl=url)
            text = result.content[0].text
            assert result.is_error, url
            assert text.startswith("policy_denied: "), (url, text)
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}
    log = host.server_log()
    for _, rule in BAD_URLS:
        assert f"[rule {rule}]" in log, rule


async def test_good_repository_urls_pass_the_policy(host: Host) -> None:
    needs_root_for_allowed()
    async with connect(host) as s:
        for url in GOOD_URLS:
            result = await start(s, repositoryUrl=url)
            # Allowed by the policy; the clone then fails (DYNOCAP_RESOLVE sends the host to a
            # loopback address where nothing listens).
            assert result.is_error
            text = result.content[0].text
            assert not text.startswith(("policy_denied", "invalid_argument")), (url, text)
        assert ok(await s.call_tool("dynocap_ls", {}))["tasks"] == []


async def test_git_hosts_variable(host: Host) -> None:
    env = {"DYNOCAP_MCP_GIT_HOSTS": "Git.Example.COM., bücher.example"}
    async with connect(host, env=env) as s:
        text = refused(await start(s, repositoryUrl="https://github.com/o/r"), "DYNOCAP_MCP_GIT_HOSTS")
        assert "git.example.com" in text and "xn--bcher-kva.example" in text
        if is_root():
            for url in ("https://git.example.com/o/r", "https://BÜCHER.example/o/r",
                        "git@git.example.com:o/r.git"):
                await allowed(s, await start(s, repositoryUrl=url))
    async with connect(host, env={"DYNOCAP_MCP_GIT_HOSTS": ""}) as s:
        refused(await start(s, repositoryUrl="https://github.com/o/r"), "DYNOCAP_MCP_GIT_HOSTS")


async def test_network_flags_for_task_start(host: Host) -> None:
    app = host.project("app", git=False)
    async with connect(host) as s:
        refused(await start(s, projectPath=str(app), network="filtered"), "DYNOCAP_MCP_ALLOW_FILTERED=1")
        refused(await start(s, projectPath=str(app), network="nat"), "DYNOCAP_MCP_ALLOW_NAT=1")
        refused(await start(s, repositoryUrl="https://github.com/o/r", network="nat"), "DYNOCAP_MCP_ALLOW_NAT")
        # Only one flag set: the other mode is still refused.
    async with connect(host, env={"DYNOCAP_MCP_ALLOW_NAT": "1"}) as s:
        refused(await start(s, projectPath=str(app), network="filtered"), "DYNOCAP_MCP_ALLOW_FILTERED")
    flags = {"DYNOCAP_MCP_ALLOW_FILTERED": "1", "DYNOCAP_MCP_ALLOW_NAT": "1"}
    if is_root():
        async with connect(host, env=flags) as s:
            task = ok(await start(s, projectPath=str(app), network="filtered"))
            assert task["network"] == "filtered"
            assert task["egressAllowlist"] == ["registry.npmjs.org"]
            out = ok(await s.call_tool("dynocap_task_exec", {"name": task["id"], "command": "echo $HTTPS_PROXY"}))
            assert out["stdout"].strip() == "http://127.0.0.1:3128"
            ok(await s.call_tool("dynocap_rm", {"target": task["id"], "force": True, "purge": True}))


def make_key(path: Path) -> Path:
    need(shutil.which("ssh-keygen") is not None, "ssh-keygen is missing (apt-get install openssh-client)")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(path)], check=True)
    return path


async def test_ssh_key_flag_and_file_checks(host: Host) -> None:
    key = make_key(host.home / ".ssh" / "id_ed25519")
    rsa = host.home / ".ssh" / "id_rsa_pem"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-f", str(rsa)],
                   check=True)
    secret = host.base / "notes.txt"
    secret.write_text("TOP-SECRET-4f1c9 do not leak\n")
    link = host.base / "key-link"
    link.symlink_to(key)
    url = "git@github.com:octo/app.git"
    async with connect(host) as s:
        refused(await start(s, repositoryUrl=url, sshKeyPath=str(key)), "DYNOCAP_MCP_ALLOW_SSH_KEY=1")
    async with connect(host, env={"DYNOCAP_MCP_ALLOW_SSH_KEY": "1"}) as s:
        for bad, why in ((secret, "does not parse"), (Path(f"{key}.pub"), "does not parse"),
                         (link, "symlink"), (host.home / ".ssh", "not a regular file"),
                         (host.base / "missing", "cannot be read")):
            text = refused(await start(s, repositoryUrl=url, sshKeyPath=str(bad)), why)
            assert "TOP-SECRET" not in text
        err(await start(s, repositoryUrl=url, sshKeyPath="id_ed25519"), "invalid_argument")
        text = err(await start(s, projectPath=str(host.root), sshKeyPath=str(key)), "invalid_argument")
        assert "repositoryUrl" in text
        if is_root():
            for good in (key, rsa):
                await allowed(s, await start(s, repositoryUrl=url, sshKeyPath=str(good)))
    log = host.server_log()
    assert "TOP-SECRET" not in log
    assert "PRIVATE KEY" not in log
    for rule in ("ssh-key.flag", "ssh-key.format", "ssh-key.file"):
        assert f"[rule {rule}]" in log, rule


async def test_refusals_create_nothing(host: Host) -> None:
    async with connect(host) as s:
        refused(await start(s, projectPath=str(host.home / ".ssh")))
        refused(await start(s, repositoryUrl="http://github.com/o/r"))
        refused(await s.call_tool("dynocap_run", {"name": "n", "network": "nat"}))
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}
    assert not any((host.state / "sandboxes").iterdir()) if (host.state / "sandboxes").exists() else True
    assert os.listdir(host.home / ".ssh") == ["config"]


# Host ceilings (DYNOCAP_MAX_*): the caller cannot ask for more than the host grants. The
# engine refuses before creating anything, so the per-request checks need no root.

CEILINGS = {"DYNOCAP_MAX_CPUS": "2", "DYNOCAP_MAX_MEMORY_MB": "2048",
            "DYNOCAP_MAX_TTL_SECONDS": "3600"}


async def test_requests_above_a_host_ceiling_are_refused(host: Host) -> None:
    project = host.project()
    async with connect(host, env=CEILINGS) as s:
        for args, needle in [
            ({"cpus": 64}, "DYNOCAP_MAX_CPUS=2"),
            ({"memoryMB": 1048576}, "DYNOCAP_MAX_MEMORY_MB=2048"),
            ({"ttlSeconds": 86400}, "DYNOCAP_MAX_TTL_SECONDS=3600"),
        ]:
            refused(await s.call_tool("dynocap_run", {"name": "big", **args}), needle)
            refused(await start(s, projectPath=str(project), **args), needle)
        assert ok(await s.call_tool("dynocap_ls", {})) == {"tasks": [], "sandboxes": []}


async def test_default_ceilings_come_from_the_host(host: Host) -> None:
    cpus = len(os.sched_getaffinity(0))
    async with connect(host) as s:
        # Half of RAM is always below the spec's 1 TiB maximum.
        refused(await s.call_tool("dynocap_run", {"name": "big", "memoryMB": 1048576}),
                "DYNOCAP_MAX_MEMORY_MB=")
        if cpus < 64:
            refused(await s.call_tool("dynocap_run", {"name": "big", "cpus": 64}),
                    f"DYNOCAP_MAX_CPUS={cpus}")


@pytest.mark.parametrize("value", ["0", "lots", "-5"])
def test_an_unusable_ceiling_stops_the_server_at_startup(host: Host, value: str) -> None:
    from conftest import DYNOCAP
    proc = subprocess.run([str(DYNOCAP), "mcp"], env=host.env({"DYNOCAP_MAX_MEMORY_MB": value}),
                          cwd=host.root, input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc
    assert "DYNOCAP_MAX_MEMORY_MB" in proc.stderr, proc.stderr
    assert proc.stdout == "", proc.stdout


async def test_tool_descriptions_mention_the_host_ceilings(host: Host) -> None:
    async with connect(host) as s:
        tools = {t.name: t for t in (await s.list_tools()).tools}
        for name in ("dynocap_run", "dynocap_task_start"):
            assert "DYNOCAP_MAX_MEMORY_MB" in (tools[name].description or ""), name


async def test_live_sandboxes_overcommit_memory_and_share_the_count_ceiling(host: Host,
                                                                           root_needed: None) -> None:
    # Each sandbox's memory limit is bounded by the ceiling; together they may pass it (the
    # kernel bounds what they use together, in the parent cgroup of all of them). The count
    # ceiling is shared.
    env = {"DYNOCAP_MAX_MEMORY_MB": "1000", "DYNOCAP_MAX_SANDBOXES": "2"}
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_run", {"name": "first", "memoryMB": 600}))
        ok(await s.call_tool("dynocap_run", {"name": "second", "memoryMB": 600}))
        refused(await s.call_tool("dynocap_run", {"name": "third", "memoryMB": 64}),
                "DYNOCAP_MAX_SANDBOXES=2")
        ok(await s.call_tool("dynocap_destroy", {"name": "first"}))
        refused(await s.call_tool("dynocap_run", {"name": "third", "memoryMB": 1001}),
                "DYNOCAP_MAX_MEMORY_MB=1000")
        ok(await s.call_tool("dynocap_run", {"name": "third", "memoryMB": 1000}))
        ok(await s.call_tool("dynocap_destroy", {"name": "second"}))
        ok(await s.call_tool("dynocap_destroy", {"name": "third"}))


def useradd(name: str, home: Path) -> None:
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/sh", name],
                   check=True, capture_output=True)


def userdel(name: str) -> None:
    subprocess.run(["userdel", name], check=False, capture_output=True)


async def test_every_users_home_is_refused_not_only_the_servers(host: Host) -> None:
    need(is_root() and shutil.which("useradd") is not None, "creating users needs root and useradd")
    users = host.base / "users"
    users.mkdir()
    name = f"dcm{os.getpid()}"
    alice = users / name
    useradd(name, alice)
    try:
        (alice / ".ssh").mkdir(exist_ok=True)
        (alice / ".ssh" / "id_ed25519").write_text("secret\n")
        (alice / "proj").mkdir()
        (alice / "proj" / "a.txt").write_text("a\n")
        shared = users / "shared" / "app"
        shared.mkdir(parents=True)
        (shared / "b.txt").write_text("b\n")
        async with connect(host, env={"DYNOCAP_MCP_ROOTS": f"{users}:{host.root}"}) as s:
            refused(await start(s, projectPath=str(alice)), "is the home directory", str(alice))
            refused(await start(s, projectPath=str(alice / ".ssh")), str(alice))
            refused(await start(s, projectPath=str(alice / "proj")), "home directory of another user")
            refused(await start(s, projectPath=str(users)), "ancestor of the home directory")
            refused(await start(s, projectPath="/root"), "home directory")
            # Elsewhere in the root that holds the home, projects still come.
            await allowed(s, await start(s, projectPath=str(shared)))
        # The root holding the home stays a root: only the paths in the home are refused.
        assert f"ignoring {users}" not in host.server_log()
    finally:
        userdel(name)


async def test_a_git_file_pointing_into_home_exports_nothing(host: Host) -> None:
    needs_root_for_allowed()
    # A repository in the user's home, whose history must never reach a guest.
    secret = host.home / "private-repo"
    git_env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    secret.mkdir()
    (secret / "diary.txt").write_text("private\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "private"]):
        subprocess.run(["git", *args], cwd=secret, env=git_env, check=True)
    pointer = host.project("pointer", git=False)
    (pointer / ".git").write_text(f"gitdir: {secret}/.git\n")
    common = host.project("common")
    (common / ".git" / "commondir").write_text(f"{secret}/.git\n")
    alternates = host.project("alternates")
    (alternates / ".git" / "objects" / "info" / "alternates").write_text(f"{secret}/.git/objects\n")
    async with connect(host) as s:
        for project, file, target in ((pointer, ".git", f"{secret}/.git"),
                                      (common, ".git/commondir", f"{secret}/.git"),
                                      (alternates, ".git/objects/info/alternates", "alternates")):
            for history in ("branches", "none"):
                text = err(await start(s, projectPath=str(project), history=history), "invalid_argument")
                assert f"{project}/{file}" in text and target in text, text
    assert (host.cli("ls") or {}).get("tasks", []) == []


RENAME_EXCHANGE = 2
AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Atomically swaps the names `a` and `b` (renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(AT_FDCWD, bytes(a), AT_FDCWD, bytes(b), RENAME_EXCHANGE) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


async def test_a_directory_swapped_for_a_symlink_never_imports_what_was_refused(host: Host) -> None:
    needs_root_for_allowed()
    secret = host.home / ".ssh"
    (secret / "id_secret").write_text("the key\n")
    project = host.project("proj", git=False, files={"mine.txt": "mine\n"})
    swap = host.root / "swap"
    swap.symlink_to(secret)
    stop = threading.Event()
    flips = 0

    def flip() -> None:
        nonlocal flips
        while not stop.is_set():
            exchange(project, swap)
            flips += 1

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    imported = 0
    try:
        async with connect(host) as s:
            for _ in range(30):
                result = await start(s, projectPath=str(project), history="none")
                if result.is_error:
                    # The path was the symlink when the server opened it: refused.
                    refused(result, ".ssh")
                    continue
                task = ok(result)
                imported += 1
                assert ".ssh" not in task["source"]["projectPath"], task
                listing = ok(await s.call_tool("dynocap_task_exec", {
                    "name": task["id"], "command": "ls -A /workspace"}))["stdout"]
                # The guest's own .git holds the baseline; nothing of the secret directory.
                assert [n for n in listing.split() if n != ".git"] == ["mine.txt"], listing
                ok(await s.call_tool("dynocap_rm", {"target": task["id"], "force": True, "purge": True}))
    finally:
        stop.set()
        flipper.join()
    assert flips > 0
    assert imported > 0, "every start was refused: the race was never run"
