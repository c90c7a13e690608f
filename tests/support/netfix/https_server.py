#!/usr/bin/env python3
"""The network tests' HTTPS server (tests/support/netfix.rs starts it; nothing else should).

One TLS listener on a loopback address, one certificate for every test name, routed by path
so it answers the same whatever name the client used:

  /<repo>.git/...      git smart HTTP, through `git http-backend` as CGI
  /private/<repo>.git/...  the same behind HTTP Basic authentication (--auth-file holds
                       `user:password`: a file, so the password is in no command line)
  /dumb/<repo>.git/... the git root's files as they are: git's dumb HTTP protocol only
  /hang/...            reads the request and never answers (a server that hangs)
  /big/<bytes>         <bytes> of generated data (the benchmark's download; nothing stored)
  anything else        static files under --www (a directory answers with its index.html or
                       index.json: the npm registry's package documents and the PEP 503 index)

Every request is one JSON line in --log (SNI, Host, method, path, status), so a test can tell
whether a connection reached the server at all.
"""

import argparse
import base64
import json
import os
import ssl
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

CHUNK = 1 << 20
BIG_BYTE = b"dynocap-bench-" * (CHUNK // 14 + 1)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr, ctx, www, git_root, log, basic_auth):
        super().__init__(addr, Handler)
        self.basic_auth = basic_auth
        self.ctx = ctx
        # Set once on the shared context; it tags the connection's own socket.
        ctx.sni_callback = lambda sock, name, _ctx: setattr(sock, "netfix_sni", name)
        self.http_backend = os.path.join(
            subprocess.run(
                ["git", "--exec-path"], capture_output=True, text=True, check=True
            ).stdout.strip(),
            "git-http-backend",
        )
        self.www = os.path.realpath(www)
        self.git_root = git_root
        self.log_file = open(log, "a", buffering=1)
        self.log_lock = threading.Lock()

    def log_json(self, entry):
        with self.log_lock:
            self.log_file.write(json.dumps(entry) + "\n")

    def handle_error(self, request, client_address):
        # A refused or broken TLS handshake is an expected event in these tests: log it, no
        # traceback on stderr.
        err = sys.exc_info()[1]
        self.log_json({"error": f"{type(err).__name__}: {err}"})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "dynocap-netfix"

    def setup(self):
        # The handshake runs here, in the connection's own thread, so a client that never
        # finishes one cannot stall the accept loop.
        self.request = self.server.ctx.wrap_socket(self.request, server_side=True)
        self.sni = getattr(self.request, "netfix_sni", None)
        super().setup()

    def log_message(self, fmt, *args):
        pass

    def record(self, status):
        self.server.log_json(
            {
                "sni": self.sni,
                "host": self.headers.get("Host"),
                "method": self.command,
                "path": self.path,
                "status": status,
            }
        )

    def do_GET(self):
        self.route()

    def do_HEAD(self):
        self.route()

    def do_POST(self):
        self.route()

    def route(self):
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/hang/"):
            self.record(None)
            threading.Event().wait()
        if path.startswith("/dumb/"):
            return self.dumb(path[len("/dumb"):])
        if path.startswith("/private/"):
            given = self.headers.get("Authorization")
            if self.server.basic_auth is None or given != self.server.basic_auth:
                self.record(401)
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="netfix"')
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            return self.git(path[len("/private"):])
        if ".git/" in path or path.endswith(".git"):
            return self.git(path)
        if path.startswith("/big/"):
            return self.big(path[len("/big/"):])
        return self.static(path)

    def send_body(self, status, body, ctype="text/plain", cache=None):
        self.record(status)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if cache:
            self.send_header("Cache-Control", cache)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def static(self, path):
        full = os.path.realpath(os.path.join(self.server.www, path.lstrip("/")))
        if full != self.server.www and not full.startswith(self.server.www + os.sep):
            return self.send_body(404, b"outside the served tree\n")
        if os.path.isdir(full):
            for index in ("index.html", "index.json"):
                if os.path.isfile(os.path.join(full, index)):
                    full = os.path.join(full, index)
                    break
        if not os.path.isfile(full):
            return self.send_body(404, b"not found\n")
        ctype = {
            ".html": "text/html",
            ".json": "application/json",
            ".tgz": "application/octet-stream",
            ".whl": "application/octet-stream",
        }.get(os.path.splitext(full)[1], "application/octet-stream")
        # Package files never change once published, and the registries' CDNs say so (PyPI's
        # files.pythonhosted.org sends exactly this): what lets pip keep them in its cache.
        cache = None
        if path.endswith((".whl", ".tgz", ".tar.gz")):
            cache = "max-age=365000000, immutable, public"
        with open(full, "rb") as f:
            self.send_body(200, f.read(), ctype, cache)

    def dumb(self, path):
        root = os.path.realpath(self.server.git_root)
        full = os.path.realpath(os.path.join(root, path.lstrip("/")))
        if not full.startswith(root + os.sep) or not os.path.isfile(full):
            return self.send_body(404, b"not found\n")
        with open(full, "rb") as f:
            self.send_body(200, f.read(), "application/octet-stream")

    def big(self, size):
        try:
            remaining = int(size)
        except ValueError:
            return self.send_body(400, b"/big/<bytes>\n")
        self.record(200)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(remaining))
        self.end_headers()
        if self.command == "HEAD":
            return
        view = memoryview(BIG_BYTE)
        while remaining > 0:
            n = min(remaining, CHUNK)
            self.wfile.write(view[:n])
            remaining -= n

    def request_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    # Trailer section ends with an empty line.
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def git(self, path):
        split = urlsplit(self.path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.server.git_root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": path,
            "QUERY_STRING": split.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "REMOTE_ADDR": self.client_address[0],
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        for key, value in self.headers.items():
            env["HTTP_" + key.upper().replace("-", "_")] = value
        if "Git-Protocol" in self.headers:
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        body = self.request_body()
        env["CONTENT_LENGTH"] = str(len(body))
        proc = subprocess.run([self.server.http_backend], input=body, env=env, capture_output=True)
        head, _, out = proc.stdout.partition(b"\r\n\r\n")
        if not _:
            head, _, out = proc.stdout.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split()[0])
            elif key:
                headers.append((key, value.strip()))
        self.record(status)
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--port", type=int, default=443)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--www", required=True)
    parser.add_argument("--git-root", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--ready", required=True, help="file written once listening")
    parser.add_argument("--auth-file", help="/private/'s user:password (without: none)")
    args = parser.parse_args()
    basic = None
    if args.auth_file:
        with open(args.auth_file, "rb") as f:
            basic = "Basic " + base64.b64encode(f.read().strip()).decode()

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server = Server((args.addr, args.port), ctx, args.www, args.git_root, args.log, basic)
    with open(args.ready, "w") as f:
        f.write(f"{args.addr}:{server.server_address[1]}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
