"""The server's allowlist and trust settings as an MCP client sees them, against the loopback
fixture of netfix.py:

- `DYNOCAP_EGRESS_ALLOW` in the server's environment may name a registry (`@pypi`): a
  `filtered` task's `egressAllowlist` shows the hosts it stands for, and an unknown name is
  refused with the names that exist;
- the CA the server's `DYNOCAP_EXTRA_CA` names is in the guest's system CA bundle: curl and
  git in the task trust the fixture with no CA variable set.

Traffic stays on loopback (every name resolves through DYNOCAP_RESOLVE). Needs root."""

from __future__ import annotations


import pytest

from conftest import Host, connect, err, need, ok
from netfix import GIT_HOST, NPM_HOST, REPO, NetFix

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

# Every variable that names a CA bundle for one tool: unset, only the system store decides.
NO_CA_VARIABLES = ("env -u SSL_CERT_FILE -u SSL_CERT_DIR -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE "
                   "-u PIP_CERT -u GIT_SSL_CAINFO -u NODE_EXTRA_CA_CERTS -u CARGO_HTTP_CAINFO "
                   "-u npm_config_cafile")


def server_env(host: Host, fix: NetFix, allow: str) -> dict[str, str]:
    return {**fix.product_env(host.env()["DYNOCAP_RESOLVE"]), "DYNOCAP_MCP_GIT_HOSTS": GIT_HOST,
            "DYNOCAP_MCP_ALLOW_FILTERED": "1", "DYNOCAP_EGRESS_ALLOW": allow}


async def test_a_named_registry_shows_as_its_hosts_and_the_extra_ca_is_trusted(host: Host, fix: NetFix) -> None:
    url = fix.https_repo_url()
    async with connect(host, env=server_env(host, fix, "@PyPI")) as s:
        task = ok(await s.call_tool("dynocap_task_start",
                                    {"repositoryUrl": url, "name": "reg", "network": "filtered"}))
        assert sorted(task["egressAllowlist"]) == sorted(
            [GIT_HOST, NPM_HOST, "pypi.org", "files.pythonhosted.org"]), task
        listed = ok(await s.call_tool("dynocap_ls", {}))
        shown = [t for t in listed["tasks"] if t["name"] == "reg"]
        assert shown and sorted(shown[0]["egressAllowlist"]) == sorted(task["egressAllowlist"]), listed

        # No CA variable: the guest's system bundle holds the server's DYNOCAP_EXTRA_CA.
        info_refs = f"https://{GIT_HOST}/{REPO}/info/refs?service=git-upload-pack"
        curl = ok(await s.call_tool("dynocap_task_exec", {
            "name": "reg", "timeoutSeconds": 60,
            "command": f"{NO_CA_VARIABLES} curl -sS -o /dev/null -w '%{{http_code}}' '{info_refs}'"}))
        assert curl["exitCode"] == 0 and curl["stdout"] == "200", curl
        git = ok(await s.call_tool("dynocap_task_exec", {
            "name": "reg", "timeoutSeconds": 60, "command": f"{NO_CA_VARIABLES} git ls-remote {url}"}))
        assert git["exitCode"] == 0 and f"{fix.head}\trefs/heads/main" in git["stdout"], git


async def test_an_unknown_registry_is_refused_with_the_known_names(host: Host, fix: NetFix) -> None:
    async with connect(host, env=server_env(host, fix, "@pip")) as s:
        text = err(await s.call_tool("dynocap_task_start", {
            "repositoryUrl": fix.https_repo_url(), "name": "bad", "network": "filtered"}),
            "invalid_argument")
        assert ('allowlist entry "@pip": there is no registry named @pip; the named registries '
                "are @npm, @pypi, @crates, @go, @debian, @rubygems, @maven") in text, text
