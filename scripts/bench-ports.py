#!/usr/bin/env python3
"""Throughput through a port forward beside plain loopback on the host, in one run.

The same small server (python3, sending N bytes from one preallocated 1 MiB buffer on each
connection, or reading N bytes for an upload) runs on the host's loopback and inside a `none`
sandbox behind `dynocap port`; the client here times fetching (and sending) SIZE MiB from
each, alternating sample by sample after the same pause, and prints the medians and each
forward's ratio to loopback (the target is at least 0.8x on the jail). The sandbox gets
--cpus 2, so its CPU quota is not what is measured; but its processes (the agent and the
guest's server) share the `dynocap` cgroup's CPU weight with every other sandbox, while the
loopback server competes as one process of the host's: on a loaded machine the forward is
measured starved. Run it on a quiet one (the load average is printed).

Usage (root):
    scripts/bench-ports.py [--vm] [NAME=]DIR [[NAME=]DIR ...]
Each DIR holds `dynocap`, `dynocap-core` and the static `dynocap-agent` (default
target/release, with DYNOCAP_AGENT naming the agent if it is elsewhere); several builds (a
change and the commit before it) are measured side by side, each in its own home and sandbox,
their samples alternating with loopback's. --vm starts the sandboxes on the vm backend (the
forward goes through the agent channel; under TCG expect a small fraction of loopback).
SIZE (MiB, default 256) and SAMPLES (default 7) set the work.

Beside each median it prints the CPU time each end took per GiB moved (the server, the
forward's supervisor, the client here; from /proc/PID/stat around each sample): a figure
that moves far less with the machine's load than throughput does, so a change to the relay
can be judged on a busy machine. The kernel charges a loopback receive's softirq to the
sending process, so each figure holds part of its peer's receive. The times are counted in
clock ticks (10 ms): the default work gives each figure tens of them, a few MiB none. With
--vm the guest's server runs inside QEMU, which the figures leave out.
"""

import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZE = int(os.environ.get("SIZE", "256")) << 20
SAMPLES = int(os.environ.get("SAMPLES", "7"))
PAUSE = 0.3
GUEST_PORT = 9000

SERVER = r"""
import socket, sys
port = int(sys.argv[1])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", port))
s.listen(16)
buf = memoryview(bytearray(1 << 20))
while True:
    c, _ = s.accept()
    # One byte at a time: the data may follow the request line in the same segment.
    line = b""
    while not line.endswith(b"\n"):
        chunk = c.recv(1)
        if not chunk:
            break
        line += chunk
    op, n = line.split()
    n = int(n)
    if op == b"get":
        while n > 0:
            n -= c.send(buf[: min(n, len(buf))])
    else:
        while n > 0:
            k = c.recv_into(buf)
            if not k:
                break
            n -= k
        c.sendall(b"ok")
    c.close()
"""


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User and system time of `pid` so far (its ended threads included), 0 when it is
    gone or unknown."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def own_cpu_seconds():
    return sum(os.times()[:2])


def cpu_figure(name, used, gib):
    """`used` (the server's, the supervisor's and the client's CPU-seconds) per GiB."""
    server, supervisor, client = (x / gib for x in used)
    if name == "loopback":
        return f"{name} {server:.2f} + {client:.2f} = {server + client:.2f}"
    return f"{name} {server:.2f} + {supervisor:.2f} + {client:.2f} = {server + supervisor + client:.2f}"


def once(port, op, size=None):
    """Seconds to move `size` (default SIZE) bytes over one connection to `port`."""
    size = SIZE if size is None else size
    buf = memoryview(bytearray(1 << 20))
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"{op} {size}\n".encode())
        left = size
        if op == "get":
            while left > 0:
                k = c.recv_into(buf)
                if not k:
                    raise RuntimeError("the server closed early")
                left -= k
        else:
            while left > 0:
                left -= c.send(buf[: min(left, len(buf))])
            if c.recv(2) != b"ok":
                raise RuntimeError("no acknowledgement")
    return time.perf_counter() - start


def wait_for(port):
    deadline = time.monotonic() + 120
    while True:
        try:
            once_small(port)
            return
        except (OSError, RuntimeError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def once_small(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        c.sendall(b"get 1\n")
        if c.recv(1) != b"\0":
            raise RuntimeError("not served yet")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Forward:
    """A sandbox of the build in `bins` serving SERVER on GUEST_PORT behind a forward, in a
    home of its own; `port` is the forward's host port."""

    def __init__(self, bins, backend="jail", env=None):
        self.dynocap = os.path.join(bins, "dynocap")
        self.home = tempfile.mkdtemp(prefix="dcports")
        # No command server: it would outlive the run in a home that is deleted.
        self.env = dict(os.environ, DYNOCAP_HOME=self.home, DYNOCAP_CLI_SERVER="0", **(env or {}))
        agent = os.path.join(bins, "dynocap-agent")
        if os.path.isfile(agent):
            self.env["DYNOCAP_AGENT"] = agent
        self.env.pop("DYNOCAP_BACKEND", None)
        image = []
        try:
            if backend == "vm":
                image = ["--image", "debian"]
                self.vm_setup()
            self.dc("run", "bench-ports", "--cpus", "2", "--backend", backend, "--ttl", "3600", *image)
            script = os.path.join(self.home, "server.py")
            with open(script, "w") as f:
                f.write(SERVER)
            self.dc("cp", script, "bench-ports:/tmp/server.py")
            self.dc("exec", "bench-ports", "--background", "--timeout", "3600", "--",
                    f"exec python3 /tmp/server.py {GUEST_PORT}")
            self.forward = self.dc("port", "bench-ports", str(GUEST_PORT)).split()[0]
            self.port = int(self.forward.split("->")[0].rsplit(":", 1)[1])
            wait_for(self.port)
            self.supervisor, self.server = self.processes()
        except BaseException:
            self.close()
            raise

    def processes(self):
        """The sandbox's supervisor (the `dynocap-core supervise` with this home) and, on a
        jail, the guest's server below it; None for what is not found (a VM's server is in
        the guest's kernel)."""
        supervisor, servers = None, []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
                if b"supervise" in cmdline:
                    with open(f"/proc/{entry}/environ", "rb") as f:
                        if f"DYNOCAP_HOME={self.home}\0".encode() in f.read():
                            supervisor = int(entry)
                elif b"/tmp/server.py" in cmdline:
                    servers.append(int(entry))
            except OSError:
                continue
        for pid in servers:
            ancestor = pid
            while ancestor not in (None, 0, 1, supervisor):
                ancestor = parent_of(ancestor)
            if supervisor is not None and ancestor == supervisor:
                return supervisor, pid
        return supervisor, None

    def vm_setup(self):
        """A VM boots the debian image: built from the tests' image cache when there is one,
        whose base disk the home shares as tests/support/backend.rs does."""
        cache = os.environ.get("DYNOCAP_TEST_IMAGE_CACHE") or "/var/cache/dynocap-test-images"
        if os.path.isdir(cache):
            self.env["DYNOCAP_IMAGE_CACHE"] = cache
            shared = os.path.join(cache, "vm-cache", "vm")
            os.makedirs(shared, exist_ok=True)
            os.makedirs(os.path.join(self.home, "cache"), exist_ok=True)
            os.symlink(shared, os.path.join(self.home, "cache", "vm"))
        # As the tests: TCG unless DYNOCAP_VM_ACCEL says otherwise.
        self.env.setdefault("DYNOCAP_VM_ACCEL", "tcg")
        self.dc("image", "build", "debian")

    def dc(self, *args):
        done = subprocess.run([self.dynocap, *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"dynocap {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def close(self):
        subprocess.run([self.dynocap, "destroy", "bench-ports"], env=self.env, capture_output=True)
        # A supervisor ending after the destroy answered may still write the catalog.
        for _ in range(10):
            shutil.rmtree(self.home, ignore_errors=True)
            time.sleep(0.2)
            if not os.path.exists(self.home):
                break


def main():
    args = sys.argv[1:]
    backend = "jail"
    if "--vm" in args:
        args.remove("--vm")
        backend = "vm"
    builds = []
    for arg in args or ["target/release"]:
        name, _, path = arg.rpartition("=")
        builds.append((name or os.path.basename(os.path.normpath(path)), os.path.abspath(path)))
    host_port = free_port()
    host_server = subprocess.Popen([sys.executable, "-c", SERVER, str(host_port)])
    forwards = []
    try:
        wait_for(host_port)
        for name, bins in builds:
            forwards.append((name, Forward(bins, backend)))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{SIZE >> 20} MiB per sample, {SAMPLES} samples each, alternating; {backend} "
              f"sandboxes; load average {load} on {os.cpu_count()} CPUs")
        targets = [("loopback", host_port, host_server.pid, None)] + [
            (name, fwd.port, fwd.server, fwd.supervisor) for name, fwd in forwards]
        for op, what in (("get", "download (guest -> host)"), ("put", "upload (host -> guest)")):
            times = {name: [] for name, *_ in targets}
            # CPU-seconds of the server, the supervisor and the client over the samples.
            used = {name: [0.0, 0.0, 0.0] for name, *_ in targets}
            for _, port, *_ in targets:
                once(port, op)
            for _ in range(SAMPLES):
                for name, port, server, supervisor in targets:
                    time.sleep(PAUSE)
                    before = (cpu_seconds(server), cpu_seconds(supervisor), own_cpu_seconds())
                    times[name].append(once(port, op))
                    after = (cpu_seconds(server), cpu_seconds(supervisor), own_cpu_seconds())
                    for i in range(3):
                        used[name][i] += after[i] - before[i]
            mib = SIZE / (1 << 20)
            rates = {name: mib / statistics.median(t) for name, t in times.items()}
            shown = ", ".join(
                f"{name} {rate:.0f} MiB/s ({rate / rates['loopback']:.2f}x)"
                for name, rate in rates.items() if name != "loopback")
            print(f"{what}: loopback {rates['loopback']:.0f} MiB/s, {shown} (medians of {SAMPLES})")
            gib = SIZE * SAMPLES / (1 << 30)
            print("  CPU-seconds per GiB (server + supervisor + client): "
                  + ", ".join(cpu_figure(name, used[name], gib) for name in times))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"load average at the end {load}")
    finally:
        host_server.kill()
        for _, fwd in forwards:
            fwd.close()


if __name__ == "__main__":
    main()
