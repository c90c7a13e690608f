"""`image` over MCP naming a registry reference the host has not got: pulled on demand when
`DYNOCAP_MCP_IMAGES` allows its prefix and `DYNOCAP_REGISTRIES` its registry, then booted.

The registry is Debian's `docker-registry` on a fresh 127.X address with TLS from a throwaway
CA, holding a busybox image this test makes and pushes with `skopeo`. Loopback only; needs
root."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import REPO, Host, connect, err, need, ok

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("root_needed")]

NAME = "registry.test"
PORT = 5000
# A container image has no libc of DynoCap's: its guests run the static agent.
STATIC_AGENT = Path(os.environ.get("DYNOCAP_AGENT")
                    or REPO / "target" / "x86_64-unknown-linux-musl" / "debug" / "dynocap-agent")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def busybox_layer() -> bytes:
    busybox = next((p for p in (Path("/bin/busybox"), Path("/usr/bin/busybox")) if p.is_file()), None)
    need(busybox is not None, "busybox-static is not installed (scripts/install-deps.sh)")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for d in ("bin", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in ("sh", "cat", "echo"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, "busybox", 0o777
            tar.addfile(info)
        text = b"pulled over MCP\n"
        info = tarfile.TarInfo("hello.txt")
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))
    return buf.getvalue()


def write_layout(directory: Path, layers: list[bytes]) -> None:
    blobs = directory / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def put(data: bytes) -> str:
        (blobs / sha(data)).write_bytes(data)
        return "sha256:" + sha(data)

    descriptors = []
    for tar in layers:
        blob = gzip.compress(tar, compresslevel=1, mtime=0)
        descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": put(blob), "size": len(blob)})
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["PATH=/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": ["sha256:" + sha(t) for t in layers]}}).encode()
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                      "digest": put(config), "size": len(config)},
                           "layers": descriptors}).encode()
    (directory / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": put(manifest),
         "size": len(manifest)}]}))
    (directory / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')


@pytest.fixture
def registry() -> Iterator[dict[str, str]]:
    """A registry holding `team/tool:1`; yields the environment a server pulls from it with."""
    for tool in ("docker-registry", "skopeo", "openssl"):
        need(shutil.which(tool) is not None, f"{tool} is not installed (scripts/install-deps.sh)")
    work = Path(tempfile.mkdtemp(prefix="dcmreg", dir="/tmp"))
    addr = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    pki = work / "pki"
    pki.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    quiet = {"check": True, "capture_output": True}
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", pki / "ca.key", "-out", pki / "ca.pem",
                    "-days", "2", "-subj", "/CN=dynocap mcp pull test CA",
                    "-addext", "basicConstraints=critical,CA:TRUE",
                    "-addext", "keyUsage=critical,keyCertSign,cRLSign"], **quiet)
    subprocess.run(["openssl", "req", *ec, "-keyout", pki / "server.key", "-out", pki / "server.csr",
                    "-subj", f"/CN={NAME}"], **quiet)
    (pki / "server.ext").write_text(f"subjectAltName=DNS:{NAME},IP:{addr}\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "x509", "-req", "-in", pki / "server.csr", "-CA", pki / "ca.pem",
                    "-CAkey", pki / "ca.key", "-CAcreateserial", "-out", pki / "server.pem", "-days", "2",
                    "-extfile", pki / "server.ext"], **quiet)
    (pki / "certs").mkdir()
    shutil.copy(pki / "ca.pem", pki / "certs" / "ca.crt")
    (work / "config.yml").write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {work}/data\n"
        f"http:\n  addr: {addr}:{PORT}\n  tls:\n    certificate: {pki}/server.pem\n    key: {pki}/server.key\n")
    server = subprocess.Popen(["docker-registry", "serve", str(work / "config.yml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((addr, PORT), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the registry did not listen"
                time.sleep(0.05)
        write_layout(work / "layout", [busybox_layer()])
        subprocess.run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-cert-dir",
                        str(pki / "certs"), f"oci:{work / 'layout'}",
                        f"docker://{addr}:{PORT}/team/tool:1"], check=True)
        yield {"DYNOCAP_REGISTRIES": f"{NAME}:{PORT}", "DYNOCAP_RESOLVE": f"{NAME}:{PORT}:{addr}",
               "DYNOCAP_EXTRA_CA": str(pki / "ca.pem"), "DOCKER_CONFIG": "/nonexistent"}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)


async def test_an_allowed_reference_is_pulled_on_demand_and_boots(host: Host, registry: dict[str, str]) -> None:
    """`image` under an allowed prefix and not on the host: pulled, then the sandbox boots it;
    one outside the prefix is refused naming DYNOCAP_MCP_IMAGES, and one whose registry is not
    in DYNOCAP_REGISTRIES is refused naming that; `@built` does not admit the pulled image."""
    need(STATIC_AGENT.is_file(),
         f"{STATIC_AGENT} is missing: cargo build --target x86_64-unknown-linux-musl -p dynocap-agent")
    ref = f"{NAME}:{PORT}/team/tool:1"
    env = dict(registry, DYNOCAP_MCP_IMAGES=f"{NAME}:{PORT}/team/", DYNOCAP_AGENT=str(STATIC_AGENT))
    async with connect(host, env=env) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": f"{NAME}:{PORT}/other/tool:1"}),
                   "policy_denied")
        assert "DYNOCAP_MCP_IMAGES" in text, text
        box = ok(await s.call_tool("dynocap_run", {"name": "pulled", "image": ref}))
        assert box["image"] == ref, box
        out = ok(await s.call_tool("dynocap_exec", {"name": "pulled", "command": "cat /hello.txt"}))
        assert out["stdout"] == "pulled over MCP\n", out
        ok(await s.call_tool("dynocap_destroy", {"name": "pulled"}))
    images: Any = host.cli("image", "ls")
    assert [i["name"] for i in images["images"]] == [ref], images
    assert images["images"][0]["source"]["format"] == "registry", images

    # `@built` admits what `dynocap image build` made here, not an image pulled as it came.
    env = dict(registry, DYNOCAP_MCP_IMAGES="@built", DYNOCAP_AGENT=str(STATIC_AGENT))
    async with connect(host, env=env) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": ref}), "policy_denied")
        assert "DYNOCAP_MCP_IMAGES=@built" in text and "dynocap image build" in text, text

    env = dict(registry, DYNOCAP_MCP_IMAGES="elsewhere.test/team/", DYNOCAP_REGISTRIES="")
    async with connect(host, env=env) as s:
        text = err(await s.call_tool("dynocap_run", {"name": "x", "image": "elsewhere.test/team/tool:1"}),
                   "invalid_argument")
        assert "DYNOCAP_REGISTRIES" in text, text


async def test_a_project_image_without_git_leaves_the_task_on_the_default_image(
        host: Host, registry: dict[str, str]) -> None:
    """A task's baseline is a git commit in the guest: when the project's devcontainer.json
    names an image without git (the registry's busybox image, pulled on demand), the task
    starts on the server's default image and `imageNote` says why; the same image named in
    `image` is refused, naming git."""
    need(STATIC_AGENT.is_file(),
         f"{STATIC_AGENT} is missing: cargo build --target x86_64-unknown-linux-musl -p dynocap-agent")
    ref = f"{NAME}:{PORT}/team/tool:1"
    project = host.project("named", files={"README.md": "hi\n",
                                           ".devcontainer/devcontainer.json": json.dumps({"image": ref})})
    env = dict(registry, DYNOCAP_MCP_IMAGES=f"{NAME}:{PORT}/team/", DYNOCAP_AGENT=str(STATIC_AGENT))
    async with connect(host, env=env) as s:
        task = ok(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "dc"}))
        assert task["image"] == "host", task
        assert ref in task["imageNote"] and "no git" in task["imageNote"], task
        ok(await s.call_tool("dynocap_rm", {"target": "dc", "force": True, "purge": True}))
        text = err(await s.call_tool("dynocap_task_start", {"projectPath": str(project), "name": "named",
                                                            "image": ref}), "invalid_argument")
        assert "has no git" in text and "dynocap_run" in text, text
