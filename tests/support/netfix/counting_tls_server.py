#!/usr/bin/env python3
"""A TLS server that counts the connections it accepts (tests/network_hello.rs starts it).

Every accepted connection is one JSON line in --log before anything is read from it,
{"accepted": "ip:port"}, so a test can tell whether the proxy connected at all; then, when it
ends, the handshake's outcome and every byte the server received on it, in hex:
{"peer", "received", "sni", "version"} or {"peer", "received", "error"}. The handshake runs
over memory BIOs so that those bytes are the server's own view of the stream. A completed
handshake gets one line, REPLY, and the connection is closed.

--groups limits the key exchange groups (e.g. prime256v1): a client whose first key share is
for another group (X25519, OpenSSL's default) then gets a HelloRetryRequest.
"""

import argparse
import json
import socket
import ssl
import threading

REPLY = b"hello from the counting server\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--addr", required=True)
    parser.add_argument("--port", type=int, default=443)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--groups")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    if args.groups:
        ctx.set_ecdh_curve(args.groups)
    # Set once on the shared context; it tags the connection's own socket.
    ctx.sni_callback = lambda sock, name, _ctx: setattr(sock, "sni", name)
    log_file = open(args.log, "a", buffering=1)
    log_lock = threading.Lock()

    def log(entry):
        with log_lock:
            log_file.write(json.dumps(entry) + "\n")

    def handle(conn, peer):
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ctx.wrap_bio(incoming, outgoing, server_side=True)
        received = bytearray()
        entry = {"peer": peer}
        try:
            conn.settimeout(30)
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    pass
                finally:
                    conn.sendall(outgoing.read())
                chunk = conn.recv(65536)
                if not chunk:
                    raise ConnectionError("the client closed during the handshake")
                received += chunk
                incoming.write(chunk)
            tls.write(REPLY)
            conn.sendall(outgoing.read())
            entry.update(sni=getattr(tls, "sni", None), version=tls.version())
        except Exception as err:  # a refused or broken handshake is what these tests make
            entry["error"] = f"{type(err).__name__}: {err}"
        finally:
            entry["received"] = received.hex()
            log(entry)
            conn.close()

    listener = socket.create_server((args.addr, args.port))
    while True:
        conn, (ip, port) = listener.accept()
        peer = f"{ip}:{port}"
        # Logged from the accept loop, in accept order, before the connection's thread runs.
        log({"accepted": peer})
        threading.Thread(target=handle, args=(conn, peer), daemon=True).start()


if __name__ == "__main__":
    main()
