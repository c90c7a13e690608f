"""Network fixtures for the MCP network tests: the Python twin of tests/support/netfix.rs.

On one fresh loopback address 127.X.Y.Z (so fixtures of parallel runs never collide) it
starts what the Rust e2e tests use, built the same way:

- a test CA and a server certificate (openssl CLI) for every test name and the address;
- the HTTPS server tests/support/netfix/https_server.py on :443 (static files written by
  content.py, git smart HTTP through `git http-backend`), which logs every request and every
  failed connection as a JSON line;
- an `sshd` on :22 that lets two client keys (one without a passphrase, one with) run git
  only (`git-shell`), serving the same bare repository.

Traffic rule: everything listens on loopback, and every name the tests use reaches it through
resolve overrides (`DYNOCAP_RESOLVE`, see `product_env`), never through DNS: this machine's
resolver is not on loopback. `NetFix.close` kills the daemons' process groups and removes the
files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "tests" / "support" / "netfix"

# The names and contents below are those of tests/support/netfix.rs; keep them in step.
NPM_HOST = "registry.npmjs.org"
GIT_HOST = "git.test"
PYPI_HOST = "pypi.test"
# Covered by the certificate, on no default allowlist.
OTHER_HOST = "other.test"
CERT_NAMES = (NPM_HOST, GIT_HOST, PYPI_HOST, OTHER_HOST)
NPM_PACKAGE = PYPI_PACKAGE = "dynocap-fixture"
PACKAGE_VERSION = "1.0.0"
REPO = "repo.git"
SSH_USER = "root"
KEY_PASSPHRASE = "correct horse battery staple"
SSHD = Path("/usr/sbin/sshd")
# `main`'s tip: what a clone's tree holds exactly.
REPO_FILES = {
    "README.md": "# served repo\n",
    "src/lib.rs": "pub fn served() -> u32 { 7 }\n",
    "notes/second.txt": "second commit\n",
}

# Fixture-building git runs with no configuration from this machine.
GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
    "GIT_ALLOW_PROTOCOL": "file",
}


class FixtureError(Exception):
    """A daemon did not come up (e.g. its address was taken); the caller retries elsewhere."""


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Runs a fixture-building command; raises with its output when it fails."""
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed ({out.returncode}):\nstdout: {out.stdout}\nstderr: {out.stderr}")
    return out.stdout


def git(cwd: Path, *args: str) -> str:
    return run(["git", *args], cwd=cwd, env=GIT_ENV)


def random_loopback() -> str:
    """127.X.Y.Z with X >= 1: never 127.0.0.1 (the guest proxy's address, and `localhost`)."""
    a, b, c = os.urandom(3)
    return f"127.{1 + a % 254}.{b}.{1 + c % 254}"


def listening(addr: str, port: int) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_until(seconds: float, pred: Callable[[], bool]) -> bool:
    """Polls `pred` until it holds or `seconds` pass (a bound for readiness, not a timing test)."""
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class Daemon:
    """A child in its own process group, which `kill` ends whole (sshd's sessions, the HTTPS
    server's `git http-backend` children)."""

    def __init__(self, name: str, argv: list[str], out: Path) -> None:
        self.name = name
        self.out = out
        with open(out, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         process_group=0)

    def output(self) -> str:
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def wait(self, what: str, pred: Callable[[], bool]) -> None:
        """Waits (30 s at most) until `pred` holds; raises if the daemon exits first."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise FixtureError(f"{self.name} exited ({self.proc.returncode}): {self.output()}")
            return pred()

        if not wait_until(30, ready):
            raise FixtureError(f"{self.name}: {what} after 30 s: {self.output()}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def make_ca(dir: Path, addr: str) -> dict[str, Path]:
    """A test CA and a server certificate for CERT_NAMES and `addr` (as netfix.rs's TestCa)."""
    dir.mkdir(parents=True, exist_ok=True)
    p = {name: dir / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem",
                                       "server.ext")}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", str(p["ca.key"]), "-out", str(p["ca.pem"]),
         "-days", "30", "-subj", "/CN=DynoCap network test CA",
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
    run(["openssl", "req", *ec, "-keyout", str(p["server.key"]), "-out", str(p["server.csr"]),
         "-subj", f"/CN={NPM_HOST}"])
    sans = ",".join([*(f"DNS:{n}" for n in CERT_NAMES), f"IP:{addr}"])
    p["server.ext"].write_text(
        f"subjectAltName={sans}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    run(["openssl", "x509", "-req", "-days", "30", "-set_serial", "2", "-in", str(p["server.csr"]),
         "-CA", str(p["ca.pem"]), "-CAkey", str(p["ca.key"]), "-extfile", str(p["server.ext"]),
         "-out", str(p["server.pem"])])
    return {"ca": p["ca.pem"], "cert": p["server.pem"], "key": p["server.key"]}


def make_repo(root: Path) -> str:
    """The bare repository root/REPO: `main` with two commits, `feature` with one of its own
    (as netfix.rs's TestRepo). Returns `main`'s commit."""
    work = root.with_suffix(".work")
    work.mkdir(parents=True)
    files = list(REPO_FILES.items())

    def write(rel: str, text: str) -> None:
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)

    git(work, "init", "-q", "-b", "main")
    for rel, text in files[:2]:
        write(rel, text)
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "first")
    git(work, "checkout", "-q", "-b", "feature")
    write("feature.txt", "feature branch\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "feature")
    git(work, "checkout", "-q", "main")
    write(*files[2])
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "second")
    head = git(work, "rev-parse", "HEAD").strip()
    root.mkdir(parents=True, exist_ok=True)
    git(root, "clone", "-q", "--bare", str(work), str(root / REPO))
    git(root / REPO, "update-server-info")
    shutil.rmtree(work)
    return head


def keygen(path: Path, passphrase: str, comment: str) -> Path:
    if not path.exists():
        run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", comment, "-f", str(path)])
    return path


def public_key(path: Path) -> str:
    """`ssh-ed25519 AAAA...` of the key at `path`, without its comment."""
    return " ".join(Path(f"{path}.pub").read_text().split()[:2])


class NetFix:
    """Everything the network tests need, on one fresh loopback address."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dcnet", dir="/tmp")).resolve()
        self.daemons: list[Daemon] = []
        try:
            self.git_root = self.dir / "git"
            self.head = make_repo(self.git_root)
            self.www = self.dir / "www"
            run(["python3", str(SCRIPTS / "content.py"), str(self.www), NPM_PACKAGE, PYPI_PACKAGE,
                 PACKAGE_VERSION])
            self._make_ssh_files()
            failures = []
            for _ in range(5):
                self.addr = random_loopback()
                try:
                    self.pki = make_ca(self.dir / "pki", self.addr)
                    self._start_https()
                    self._start_sshd()
                    return
                except FixtureError as e:
                    failures.append(str(e))
                    self._kill_daemons()
            raise RuntimeError(f"no network fixture could start: {failures}")
        except BaseException:
            self.close()
            raise

    # --- the HTTPS server -------------------------------------------------------------------

    def _start_https(self) -> None:
        self.https_log = self.dir / "https.jsonl"
        self.https_log.unlink(missing_ok=True)
        https = Daemon("https server", [
            "python3", str(SCRIPTS / "https_server.py"), "--addr", self.addr,
            "--cert", str(self.pki["cert"]), "--key", str(self.pki["key"]), "--www", str(self.www),
            "--git-root", str(self.git_root), "--log", str(self.https_log),
            "--ready", str(self.dir / "https.ready")], self.dir / "https.out")
        self.daemons.append(https)
        https.wait(f"not listening on {self.addr}:443", lambda: listening(self.addr, 443))
        # The probe is logged from its connection's thread: wait for it, so that counts taken
        # by the tests never see it arrive late.
        https.wait("no readiness probe logged", lambda: bool(self.https_entries()))

    def https_entries(self) -> list[dict[str, Any]]:
        """Everything the HTTPS server logged, oldest first: requests (`sni`, `host`, `method`,
        `path`, `status`) and connections that ended without one (`error`)."""
        if not self.https_log.exists():
            return []
        return [json.loads(line) for line in self.https_log.read_text().splitlines() if line.strip()]

    def requests(self) -> list[dict[str, Any]]:
        return [e for e in self.https_entries() if "path" in e]

    # --- sshd -------------------------------------------------------------------------------

    def _make_ssh_files(self) -> None:
        ssh = self.dir / "ssh"
        ssh.mkdir()
        host_key = keygen(ssh / "host_ed25519", "", "netfix-host")
        # The key the server accepts, and one with a passphrase it accepts too: refusing that
        # one is the product's job, not the server's.
        self.key = keygen(ssh / "id_ed25519", "", "netfix-client")
        self.passphrase_key = keygen(ssh / "id_ed25519_passphrase", KEY_PASSPHRASE,
                                     "netfix-client-passphrase")
        self.host_key = public_key(host_key)
        # Whatever the client asks for, these keys only run git-shell.
        restrict = 'restrict,command="git-shell -c \\"$SSH_ORIGINAL_COMMAND\\""'
        (ssh / "authorized_keys").write_text(
            f"{restrict} {public_key(self.key)}\n{restrict} {public_key(self.passphrase_key)}\n")
        self.ssh_dir = ssh

    def _start_sshd(self) -> None:
        if not SSHD.is_file():
            raise RuntimeError(f"{SSHD} is missing: install openssh-server (scripts/install-deps.sh)")
        # Privilege separation needs it; Debian's service unit makes it at boot, which never
        # happened in a container.
        Path("/run/sshd").mkdir(exist_ok=True)
        config = self.ssh_dir / "sshd_config"
        config.write_text(
            f"ListenAddress {self.addr}:22\n"
            f"HostKey {self.ssh_dir / 'host_ed25519'}\n"
            "PidFile none\n"
            f"AuthorizedKeysFile {self.ssh_dir / 'authorized_keys'}\n"
            "StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"AllowUsers {SSH_USER}\n"
            "AllowTcpForwarding no\nX11Forwarding no\nPermitTTY no\nLogLevel VERBOSE\n")
        self.sshd = Daemon("sshd", [str(SSHD), "-D", "-e", "-f", str(config)], self.ssh_dir / "sshd.out")
        self.daemons.append(self.sshd)
        self.sshd.wait(f"not listening on {self.addr}:22", lambda: listening(self.addr, 22))
        # sshd logs the probe's connection from its own child after the probe returned: wait
        # for that line, so that connection counts start after it.
        self.sshd.wait("did not log the readiness probe",
                       lambda: "Connection closed by" in self.sshd.output())

    def sshd_log(self) -> str:
        return self.sshd.output()

    def ssh_connections(self) -> int:
        """Connections sshd accepted so far, its readiness probe included."""
        return self.sshd_log().count("Connection from")

    # --- what the product and the tests need ------------------------------------------------

    def https_repo_url(self, repo: str = REPO) -> str:
        return f"https://{GIT_HOST}/{repo}"

    def ssh_repo_url(self) -> str:
        return f"ssh://{SSH_USER}@{GIT_HOST}{self.git_root / REPO}"

    def known_hosts_line(self, host: str = GIT_HOST) -> str:
        return f"{host} {self.host_key}\n"

    def resolve_entries(self) -> list[str]:
        """`host:port:addr` for every certificate name on 443, and git.test and the npm
        registry on 22 (sshd answers for both, so a wrongly allowed SSH connection to a
        non-git host would succeed)."""
        targets = [(n, 443) for n in CERT_NAMES] + [(GIT_HOST, 22), (NPM_HOST, 22)]
        return [f"{h}:{p}:{self.addr}" for h, p in targets]

    def product_env(self, defaults: str = "") -> dict[str, str]:
        """`DYNOCAP_RESOLVE` (the fixture's entries after `defaults`, the conftest's loopback
        sinks for the other test names) and `DYNOCAP_EXTRA_CA`."""
        resolve = ",".join([e for e in defaults.split(",") if e] + self.resolve_entries())
        return {"DYNOCAP_RESOLVE": resolve, "DYNOCAP_EXTRA_CA": str(self.pki["ca"])}

    def _kill_daemons(self) -> None:
        for d in self.daemons:
            d.kill()
        self.daemons = []

    def close(self) -> None:
        self._kill_daemons()
        shutil.rmtree(self.dir, ignore_errors=True)
