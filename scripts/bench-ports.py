#!/usr/bin/env python3
"""Throughput through a port forward beside plain loopback on the host, in one run.

The same small server (python3, sending N bytes from one preallocated 1 MiB buffer on each
connection, or reading N bytes for an upload) runs on the host's loopback and inside a `none`
jail sandbox behind `dynocap port`; the client here times fetching (and sending) SIZE MiB
from each, alternating sample by sample after the same pause, and prints the medians and the
forward's ratio to loopback (the target is at least 0.8x). The sandbox gets --cpus 2, so its
CPU quota is not what is measured; but its processes (the agent and the guest's server) share
the `dynocap` cgroup's CPU weight with every other sandbox, while the loopback server competes
as one process of the host's: on a loaded machine the forward is measured starved. Run it on
a quiet one (the load average is printed).

Usage (root):
    scripts/bench-ports.py [DIR]
DIR holds `dynocap`, `dynocap-core` and the static `dynocap-agent` (default target/release,
with DYNOCAP_AGENT naming the agent if it is elsewhere). SIZE (MiB, default 256) and SAMPLES
(default 7) set the work.
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


def once(port, op):
    """Seconds to move SIZE bytes over one connection to `port`."""
    buf = memoryview(bytearray(1 << 20))
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(f"{op} {SIZE}\n".encode())
        left = SIZE
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
    deadline = time.monotonic() + 60
    while True:
        try:
            once_small(port)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        except RuntimeError:
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


def main():
    bins = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release")
    dynocap = os.path.join(bins, "dynocap")
    home = tempfile.mkdtemp(prefix="dcports")
    # No command server: it would outlive the run in a home that is deleted.
    env = dict(os.environ, DYNOCAP_HOME=home, DYNOCAP_CLI_SERVER="0")
    agent = os.path.join(bins, "dynocap-agent")
    if "DYNOCAP_AGENT" not in env and os.path.isfile(agent):
        env["DYNOCAP_AGENT"] = agent
    env.pop("DYNOCAP_BACKEND", None)

    def dc(*args):
        return subprocess.run([dynocap, *args], env=env, check=True, capture_output=True, text=True).stdout

    host_port = free_port()
    host_server = subprocess.Popen([sys.executable, "-c", SERVER, str(host_port)])
    try:
        dc("run", "bench-ports", "--cpus", "2", "--backend", "jail")
        with open(os.path.join(home, "server.py"), "w") as f:
            f.write(SERVER)
        dc("cp", os.path.join(home, "server.py"), "bench-ports:/tmp/server.py")
        dc("exec", "bench-ports", "--background", "--timeout", "3600", "--",
           f"exec python3 /tmp/server.py {GUEST_PORT}")
        forward = dc("port", "bench-ports", str(GUEST_PORT)).split()[0]
        fwd_port = int(forward.split("->")[0].rsplit(":", 1)[1])
        wait_for(host_port)
        wait_for(fwd_port)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{SIZE >> 20} MiB per sample, {SAMPLES} samples each, alternating; "
              f"forward {forward}; load average {load} on {os.cpu_count()} CPUs")
        for op, what in (("get", "download (guest -> host)"), ("put", "upload (host -> guest)")):
            loop, fwd = [], []
            once(host_port, op)
            once(fwd_port, op)
            for _ in range(SAMPLES):
                time.sleep(PAUSE)
                loop.append(once(host_port, op))
                time.sleep(PAUSE)
                fwd.append(once(fwd_port, op))
            mib = SIZE / (1 << 20)
            loop_rate = mib / statistics.median(loop)
            fwd_rate = mib / statistics.median(fwd)
            print(f"{what}: loopback {loop_rate:8.0f} MiB/s, forward {fwd_rate:8.0f} MiB/s, "
                  f"ratio {fwd_rate / loop_rate:.2f}x (median of {SAMPLES})")
    finally:
        host_server.kill()
        subprocess.run([dynocap, "destroy", "bench-ports"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
