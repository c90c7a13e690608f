"""What an MCP caller may choose beyond resources, within what the server's host allows:

- `image` on `dynocap_run` and `dynocap_task_start`, within `DYNOCAP_MCP_IMAGES` (unset: the
  images already on the host; `host` is always there). A refusal is `policy_denied` naming the
  variable; a registry reference the variable allows but the host has not got is pulled (only
  from `DYNOCAP_REGISTRIES`: test_pull.py);
- `allowHosts` with `network: "filtered"`, within `DYNOCAP_MCP_EGRESS_ALLOW` (unset: none),
  named registries (`@pypi`) compared by their hosts; the result's `egressAllowlist` shows
  them, and the sandbox reaches an added host (the loopback fixture of netfix.py) where one
  without it is refused.

Traffic stays on loopback (every name resolves through DYNOCAP_RESOLVE). Needs root."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import DYNOCAP, REPO, Host, connect, err, need, ok
from netfix import NPM_HOST, OTHER_HOST, NetFix

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

IMAGE_CACHE = Path(os.environ.get("DYNOCAP_TEST_IMAGE_CACHE") or "/var/cache/dynocap-test-images")
# The agent a built image's guest runs: the static build, which needs no libc of the image's.
STATIC_AGENT = Path(os.environ.get("DYNOCAP_AGENT")
                    or REPO / "target" / "x86_64-unknown-linux-musl" / "debug" / "dynocap-agent")
PYPI_HOSTS = ["pypi.org", "files.pythonhosted.org"]


async def no_sandboxes(s: Any) -> None:
    """A refused start left nothing behind."""
    assert ok(await s.call_tool("dynocap_ps", {})) == {"sandboxes": []}
    assert ok(await s.call_tool("dynocap_ls", {}))["tasks"] == []


async def test_image_defaults_to_the_images_on_the_host(host: Host) -> None:
    """Unset DYNOCAP_MCP_IMAGES: `host` boots; an image that is not on the host, built-able
    or a registry's, is refused naming the variable; a malformed one is invalid."""
    project = host.project()
    async with connect(host) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "plain", "image": "host"}))
        assert box["image"] == "host" and "imageId" not in box, box
        ok(await s.call_tool("dynocap_destroy", {"name": "plain"}))
        for image in ("debian", "registry.example/team/app:1"):
            text = err(await s.call_tool("dynocap_run", {"name": "x", "image": image}), "policy_denied")
            assert "DYNOCAP_MCP_IMAGES" in text and "(host)" in text, text
            text = err(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "image": image}),
                       "policy_denied")
            assert "DYNOCAP_MCP_IMAGES" in text, text
        for bad in ("../debian", "registry.example/team/../../x", "a b", ""):
            err(await s.call_tool("dynocap_run", {"name": "x", "image": bad}), "invalid_argument")
        await no_sandboxes(s)
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "t",
                                                           "image": "host"}))
        assert task["image"] == "host", task
        ok(await s.call_tool("dynocap_rm", {"target": "t", "force": True, "purge": True}))
    assert "policy refused dynocap_run: policy_denied [rule image.not-on-host]" in host.server_log()


async def test_the_images_variable_names_what_a_caller_may_boot(host: Host) -> None:
    """Set, only its entries: `host` is refused when not listed, a listed name that is not built
    gets the engine's build hint, a reference under an allowed registry prefix is pulled (here
    refused by DYNOCAP_REGISTRIES, which is unset), and one under another prefix is
    policy_denied."""
    env = {"DYNOCAP_MCP_IMAGES": "debian,registry.example/team/"}
    async with connect(host, env=env) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": "host"}), "policy_denied")
        assert "DYNOCAP_MCP_IMAGES=debian,registry.example/team/" in text, text
        # Left out, the image is the server's default, whatever the list says.
        box = ok(await s.call_tool("dynocap_run", {"name": "plain"}))
        assert box["image"] == "host", box
        ok(await s.call_tool("dynocap_destroy", {"name": "plain"}))
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": "debian"}), "invalid_argument")
        assert "dynocap image build debian" in text, text
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": "registry.example/team/app:1"}),
                   "invalid_argument")
        assert "DYNOCAP_REGISTRIES" in text and "registry.example" in text, text
        for outside in ("registry.example/other/app:1", "registry.example/teamx/app:1"):
            text = err(await s.call_tool("dynocap_run", {"name": "x", "image": outside}), "policy_denied")
            assert "DYNOCAP_MCP_IMAGES" in text, text
        await no_sandboxes(s)
    log = host.server_log()
    assert "images=debian,registry.example/team/" in log, log


def build_debian_from_cache(host: Host) -> dict[str, str]:
    """Builds the debian image into `host`'s state from the shared test cache, with no network
    at all (a new network namespace), so a cache that lacks this recipe skips rather than
    downloads. Returns the server environment for booting it in the jail."""
    need(shutil.which("mmdebstrap") is not None, "mmdebstrap is not installed (scripts/install-deps.sh)")
    need(shutil.which("unshare") is not None, "unshare (util-linux) is missing")
    need(STATIC_AGENT.is_file(),
         f"{STATIC_AGENT} is missing: cargo build --target x86_64-unknown-linux-musl -p dynocap-agent")
    env = host.env({"DYNOCAP_IMAGE_CACHE": str(IMAGE_CACHE)})
    built = subprocess.run(["unshare", "--net", str(DYNOCAP), "--json", "image", "build", "debian"],
                           env=env, capture_output=True, text=True, timeout=900)
    need(built.returncode == 0,
         f"the debian image is not in {IMAGE_CACHE} for this recipe (building it needs the network): "
         f"{built.stderr.strip()[-300:]}")
    return {"DYNOCAP_AGENT": str(STATIC_AGENT), "DYNOCAP_BACKEND": "jail"}


async def test_a_built_image_is_offered_by_default_and_by_at_built(host: Host) -> None:
    env = build_debian_from_cache(host)
    async with connect(host, env=env) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "deb", "image": "debian"}))
        assert box["image"] == "debian" and box.get("imageId"), box
        out = ok(await s.call_tool("dynocap_exec", {"name": "deb", "command": ". /etc/os-release; echo $ID"}))
        assert out["stdout"].strip() == "debian", out
        ok(await s.call_tool("dynocap_destroy", {"name": "deb"}))
    async with connect(host, env={**env, "DYNOCAP_MCP_IMAGES": "@built"}) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "deb", "image": "debian"}))
        assert box["image"] == "debian", box
        ok(await s.call_tool("dynocap_destroy", {"name": "deb"}))
        # `host` is made from the host, not built.
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": "host"}), "policy_denied")
        assert "DYNOCAP_MCP_IMAGES=@built" in text, text
        await no_sandboxes(s)


async def test_allow_hosts_lie_within_the_hosts_variable(host: Host) -> None:
    """Without DYNOCAP_MCP_EGRESS_ALLOW nothing may be added; with it, entries within it (a
    named registry by its hosts) are added and shown, others refused; allowHosts with another
    network than filtered is a malformed request."""
    project = host.project()
    flags = {"DYNOCAP_MCP_ALLOW_FILTERED": "1"}
    async with connect(host, env=flags) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "x", "network": "filtered",
                                                     "allowHosts": [OTHER_HOST]}), "policy_denied")
        assert "DYNOCAP_MCP_EGRESS_ALLOW" in text, text
        # An empty list adds nothing and needs nothing.
        box = ok(await s.call_tool("dynocap_run", {"name": "empty", "network": "filtered", "allowHosts": []}))
        assert box["egressAllowlist"] == [NPM_HOST], box
        ok(await s.call_tool("dynocap_destroy", {"name": "empty"}))
        await no_sandboxes(s)

    async with connect(host, env={**flags, "DYNOCAP_MCP_EGRESS_ALLOW": f"{OTHER_HOST},@pypi,*.cdn.test"}) as s:
        box = ok(await s.call_tool("dynocap_run", {"name": "added", "network": "filtered",
                                                   "allowHosts": [OTHER_HOST, "@PyPI", "a.cdn.test"]}))
        assert sorted(box["egressAllowlist"]) == sorted([NPM_HOST, OTHER_HOST, *PYPI_HOSTS, "a.cdn.test"]), box
        listed = ok(await s.call_tool("dynocap_ps", {}))["sandboxes"]
        assert sorted(listed[0]["egressAllowlist"]) == sorted(box["egressAllowlist"]), listed
        ok(await s.call_tool("dynocap_destroy", {"name": "added"}))

        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "t",
                                                           "network": "filtered", "allowHosts": ["pypi.org"]}))
        assert sorted(task["egressAllowlist"]) == sorted([NPM_HOST, "pypi.org"]), task
        ok(await s.call_tool("dynocap_rm", {"target": "t", "force": True, "purge": True}))

        for outside in ("evil.test", "cdn.test", "*.other.test", "@npm"):
            text = err(await s.call_tool("dynocap_run", {"name": "x", "network": "filtered",
                                                         "allowHosts": [outside]}), "policy_denied")
            assert f"not within DYNOCAP_MCP_EGRESS_ALLOW ({OTHER_HOST},@pypi,*.cdn.test)" in text, text
        for network in ("none", "nat"):
            text = err(await s.call_tool("dynocap_run", {"name": "x", "network": network,
                                                         "allowHosts": [OTHER_HOST]}), "invalid_argument")
            assert 'allowHosts only applies to network "filtered"' in text, text
        text = err(await s.call_tool("dynocap_task_start", {"projectPath": str(project),
                                                            "allowHosts": [OTHER_HOST]}), "invalid_argument")
        assert '"filtered"' in text, text
        for bad in ("https://other.test/", "@nope", "10.0.0.1"):
            err(await s.call_tool("dynocap_run", {"name": "x", "network": "filtered", "allowHosts": [bad]}),
                "invalid_argument")
        await no_sandboxes(s)
    assert "egress_allow=other.test,@pypi,*.cdn.test" in host.server_log()


async def test_an_added_host_is_reached_and_others_are_not(host: Host, fix: NetFix) -> None:
    """The proxy enforces what allowHosts added: the sandbox that asked for other.test reaches
    the fixture by that name; one that did not is refused at the CONNECT."""
    env = {**fix.product_env(host.env()["DYNOCAP_RESOLVE"]), "DYNOCAP_MCP_ALLOW_FILTERED": "1",
           "DYNOCAP_MCP_EGRESS_ALLOW": OTHER_HOST}
    curl = f"curl -sS --max-time 20 -o /dev/null -w '%{{http_connect}} %{{http_code}}' https://{OTHER_HOST}/"
    async with connect(host, env=env) as s:
        ok(await s.call_tool("dynocap_run", {"name": "with", "network": "filtered", "allowHosts": [OTHER_HOST]}))
        ok(await s.call_tool("dynocap_run", {"name": "without", "network": "filtered"}))

        before = len(fix.https_entries())
        refused = ok(await s.call_tool("dynocap_exec", {"name": "without", "command": curl, "timeoutSeconds": 60}))
        assert refused["exitCode"] != 0 and refused["stdout"].startswith("403"), refused
        assert OTHER_HOST in {r["host"] for r in refused.get("networkRefusals", [])}, refused
        assert fix.https_entries()[before:] == []

        reached = ok(await s.call_tool("dynocap_exec", {"name": "with", "command": curl, "timeoutSeconds": 60}))
        assert reached["exitCode"] == 0, reached
        connect_code, http_code = reached["stdout"].split()
        assert connect_code == "200" and http_code != "000", reached
        assert "networkRefusals" not in reached, reached
        served = [e for e in fix.https_entries()[before:] if "path" in e]
        assert [(e["sni"], e["host"]) for e in served] == [(OTHER_HOST, OTHER_HOST)], served
        for name in ("with", "without"):
            ok(await s.call_tool("dynocap_destroy", {"name": name}))
