"""A registry that stalls, for tests/image_pull.rs: loopback only, started by the test.

    stalling_registry.py silent ADDR PORT
        accepts every connection and never sends a byte (nor closes it).
    stalling_registry.py blob ADDR PORT CERT KEY LAYOUT DIGEST [RATE]
        over TLS (CERT, KEY: the test CA's server certificate), serves the one image of the
        OCI layout LAYOUT as a registry would (`/v2/`, its manifest for any tag or by digest,
        its blobs by digest); of blob DIGEST (`sha256:...`) it sends the headers and half the
        bytes, then nothing, holding the connection open. With RATE (bytes per second) it
        sends all of blob DIGEST instead, but at that rate (a piece every 0.1 s): a trickle,
        or a registry slow but steady.
    stalling_registry.py redirect ADDR PORT CERT KEY LAYOUT DIGEST URL
        as `blob`, but answers blob DIGEST with a redirect (307) to URL.

Prints "ready" once it listens.
"""

import http.server
import json
import os
import socket
import ssl
import sys
import time


def silent(addr, port):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((addr, port))
    server.listen(64)
    print("ready", flush=True)
    held = []
    while True:
        conn, _ = server.accept()
        held.append(conn)


def blob(addr, port, cert, key, layout, stall, rate=None, redirect=None):
    with open(os.path.join(layout, "index.json")) as f:
        manifest_desc = json.load(f)["manifests"][0]

    def read_blob(digest):
        algo, _, hexa = digest.partition(":")
        if algo != "sha256" or not all(c in "0123456789abcdef" for c in hexa):
            return None
        path = os.path.join(layout, "blobs", "sha256", hexa)
        if not os.path.isfile(path):
            return None
        with open(path, "rb") as f:
            return f.read()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stderr.write("%s\n" % (fmt % args))

        def answer(self, status, body, content_type, digest=None, send=None):
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if digest:
                self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body if send is None else body[:send])
                self.wfile.flush()

        def do_HEAD(self):
            self.do_GET()

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/v2", "/v2/"):
                return self.answer(200, b"{}", "application/json")
            if "/manifests/" in path:
                ref = path.rsplit("/manifests/", 1)[1]
                digest = manifest_desc["digest"]
                if ref.startswith("sha256:") and ref != digest:
                    return self.answer(404, b"{}", "application/json")
                body = read_blob(digest)
                return self.answer(200, body, manifest_desc["mediaType"], digest)
            if "/blobs/" in path:
                digest = path.rsplit("/blobs/", 1)[1]
                body = read_blob(digest)
                if body is None:
                    return self.answer(404, b"{}", "application/json")
                if digest == stall and redirect is not None:
                    self.send_response(307)
                    self.send_header("Location", redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if digest == stall and rate is not None and self.command != "HEAD":
                    self.answer(200, body, "application/octet-stream", digest, 0)
                    piece = max(1, int(rate) // 10)
                    for at in range(0, len(body), piece):
                        self.wfile.write(body[at : at + piece])
                        self.wfile.flush()
                        time.sleep(0.1)
                    return
                if digest == stall:
                    self.answer(200, body, "application/octet-stream", digest, len(body) // 2)
                    sys.stderr.write("stalled %s\n" % digest)
                    sys.stderr.flush()
                    while True:
                        time.sleep(3600)
                return self.answer(200, body, "application/octet-stream", digest)
            return self.answer(404, b"{}", "application/json")

    httpd = http.server.ThreadingHTTPServer((addr, port), Handler)
    httpd.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    print("ready", flush=True)
    httpd.serve_forever()


def main():
    mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if not addr.startswith("127."):
        sys.exit("loopback only")
    if mode == "silent":
        silent(addr, port)
    elif mode == "blob":
        blob(addr, port, *sys.argv[4:10])
    elif mode == "redirect":
        cert, key, layout, stall, url = sys.argv[4:9]
        blob(addr, port, cert, key, layout, stall, redirect=url)
    else:
        sys.exit("mode: silent, blob or redirect")


if __name__ == "__main__":
    main()
