#!/usr/bin/env python3
"""Sends one shape of TLS ClientHello through the egress proxy, from inside a `filtered` guest
(tests/network_hello.rs copies it there and runs it with the host's python3).

    hello_client.py PROXY_HOST:PORT HOST SHAPE [ARGUMENT]

Opens `CONNECT HOST:443` through the proxy, sends SHAPE's bytes into the tunnel and prints one
JSON object: the proxy's status, what came back through the tunnel (hex), the TLS alert it
held if it was one, and for real handshakes the TLS version, whether the server asked for a
retry and the server's reply. Crafted hellos are built here byte by byte; real ones come from
Python's own TLS client through a memory BIO, so their records can be cut differently.
"""

import json
import os
import socket
import ssl
import struct
import sys
import time

PROXY, HOST, SHAPE = sys.argv[1], sys.argv[2], sys.argv[3]
# The address `quic` sends to, the number of tunnels `silent` opens.
ADDRESS = sys.argv[4] if len(sys.argv) > 4 else None
OTHER = "other.test"
# ServerHello.random of a HelloRetryRequest (RFC 8446 4.1.3).
HRR_RANDOM = bytes.fromhex("cf21ad74e59a6111be1d8c021e65b891c2a211167abb8c5e079e09e2c8a8339c")
CHANGE_CIPHER_SPEC = bytes([20, 3, 3, 0, 1, 1])
ALERTS = {40: "handshake_failure", 49: "access_denied", 50: "decode_error", 80: "internal_error"}


def extension(kind, data):
    return struct.pack("!HH", kind, len(data)) + data


def server_name(*names, name_type=0):
    entries = b"".join(bytes([name_type]) + struct.pack("!H", len(n)) + n.encode() for n in names)
    return extension(0, struct.pack("!H", len(entries)) + entries)


def client_hello(*extensions):
    """A TLS 1.3-style ClientHello handshake message with these extensions."""
    ext = b"".join(extensions)
    ext += extension(43, bytes([2, 3, 4]))  # supported_versions: TLS 1.3
    ext += extension(10, bytes([0, 2, 0, 29]))  # supported_groups: x25519
    ext += extension(13, bytes([0, 2, 4, 3]))  # signature_algorithms: ecdsa_secp256r1_sha256
    ext += extension(51, bytes([0, 0]))  # key_share: empty, the server picks
    body = b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32)
    body += struct.pack("!H", 4) + b"\x13\x01\x13\x02" + b"\x01\x00"
    body += struct.pack("!H", len(ext)) + ext
    return b"\x01" + struct.pack("!I", len(body))[1:] + body


def records(message, size=16384):
    out = b""
    for i in range(0, len(message), size):
        part = message[i : i + size]
        out += bytes([22, 3, 1]) + struct.pack("!H", len(part)) + part
    return out


def tunnel(target=None):
    """A CONNECT to `target` (default HOST:443); the socket and the proxy's status."""
    target = target or f"{HOST}:443"
    host, port = PROXY.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        byte = sock.recv(1)
        if not byte:
            break
        head += byte
    return sock, head.split(b" ")[1].decode() if head.count(b" ") else ""


def drain(sock):
    """Everything until the proxy closes (bounded, so a bug shows as a failure, not a hang)."""
    sock.settimeout(60)
    got = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        got += chunk
    return got


def result(status, got, **more):
    alert = None
    if len(got) >= 7 and got[-7:-2] == bytes([21, 3, 3, 0, 2]) and got[-2] == 2:
        alert = ALERTS.get(got[-1], got[-1])
    return dict(status=status, received=got.hex(), alert=alert, **more)


def crafted(data, pieces=1, pause=0.0, then_close=False, target=None):
    """Sends `data` in `pieces` writes `pause` seconds apart; `then_close` ends the client's
    half of the tunnel after the last. `target`: the CONNECT's, if not HOST:443."""
    sock, status = tunnel(target)
    if status != "200":
        return result(status, drain(sock))
    step = max(1, -(-len(data) // pieces))
    try:
        for i in range(0, len(data), step):
            sock.sendall(data[i : i + step])
            time.sleep(pause)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        # The proxy judged what it had, answered and closed while the rest was on its way
        # (its close with unread bytes resets the connection): its answer is still queued
        # here to be read.
        pass
    return result(status, drain(sock))


def real(split=False, groups=None, second_hello=None, tls12=False):
    """A real TLS handshake by Python's client. `split` re-cuts its first ClientHello into
    records of 90 bytes sent in several writes; `second_hello`, if the server asks for a
    retry, is sent instead of the client's own second ClientHello; `tls12` caps the version
    at TLS 1.2, whose client flight after the ServerHello is partly plaintext."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the proxy is under test here, not the certificate
    if groups:
        ctx.set_ecdh_curve(groups)
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=HOST)
    sock, status = tunnel()
    if status != "200":
        return result(status, b"")
    first, retried, received = True, False, b""
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pass
        data = outgoing.read()
        if first and split:
            message = data[5:]
            assert data[0] == 22 and len(message) == struct.unpack("!H", data[3:5])[0]
            cut = records(message, 90)
            for i in range(0, len(cut), 70):
                sock.sendall(cut[i : i + 70])
                time.sleep(0.02)
        elif data:
            sock.sendall(data)
        first = False
        chunk = sock.recv(65536)
        if not chunk:
            return result(status, received, handshake=None, retried=retried)
        received += chunk
        if HRR_RANDOM in chunk:
            retried = True
            if second_hello is not None:
                sock.sendall(second_hello)
                received += drain(sock)
                return result(status, received, handshake=None, retried=retried)
        incoming.write(chunk)
    sock.sendall(outgoing.read())
    reply = b""
    while b"\n" not in reply:
        try:
            reply += tls.read(1024)
        except ssl.SSLWantReadError:
            chunk = sock.recv(65536)
            if not chunk:
                break
            incoming.write(chunk)
    return dict(status=status, handshake=tls.version(), retried=retried, reply=reply.decode())


def silent():
    """ADDRESS (a count) tunnels opened at once that never send a byte, held for a while."""
    socks = [tunnel() for _ in range(int(ADDRESS))]
    time.sleep(2)
    statuses = sorted({status for _, status in socks})
    for sock, _ in socks:
        sock.close()
    return dict(status=",".join(statuses), tunnels=len(socks), alert=None, received="")


def plain_http():
    host, port = PROXY.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"GET http://{HOST}/ HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    head = drain(sock)
    return dict(status=head.split(b" ")[1].decode(), received=head[:200].decode(errors="replace"))


def quic():
    """A QUIC Initial-shaped datagram to ADDRESS:443 and HOST:443, past the proxy: UDP has no
    way out of a filtered guest, so both fail or go nowhere."""
    datagram = bytes([0xC3, 0, 0, 0, 1, 8]) + os.urandom(8) + bytes([0]) + os.urandom(1180)
    sent = {}
    for target in (ADDRESS, HOST):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                udp.sendto(datagram, (target, 443))
            sent[target] = "sent"
        except OSError as err:
            sent[target] = f"{type(err).__name__}: {err}"
    return dict(status=None, udp=sent)


ECH = 0xFE0D
ESNI = 0xFFCE
# The payload of every ECH/ESNI extension sent: the test looks for it in what the server got.
MARKER = b"dynocap-hidden-name-marker"
SHAPES = {
    "silent": silent,
    # A valid hello's first 60 bytes, a byte every 25 ms, then the client's half is closed.
    "slow-partial": lambda: crafted(
        records(client_hello(server_name(HOST)))[:60], 60, 0.025, then_close=True
    ),
    "ech": lambda: crafted(records(client_hello(server_name(HOST), extension(ECH, MARKER)))),
    "esni": lambda: crafted(records(client_hello(server_name(HOST), extension(ESNI, MARKER)))),
    "ech-no-sni": lambda: crafted(records(client_hello(extension(ECH, MARKER)))),
    "two-names": lambda: crafted(records(client_hello(server_name(HOST, OTHER)))),
    "other-name-type": lambda: crafted(records(client_hello(server_name(HOST, name_type=1)))),
    "no-sni": lambda: crafted(records(client_hello())),
    "other-sni": lambda: crafted(records(client_hello(server_name(OTHER)))),
    "second-hello": lambda: crafted(
        records(client_hello(server_name(HOST))) + records(client_hello(server_name(OTHER)))
    ),
    # The hello split over records of 40 bytes, the last of them carrying a second hello.
    "second-hello-same-record": lambda: crafted(
        records(client_hello(server_name(HOST)) + client_hello(server_name(OTHER)), 40), 5
    ),
    # A handshake message announcing 70,000 bytes, past the proxy's 64 KiB bound for a hello
    # (a ClientHello's own fields cannot grow that large), sent whole in full records.
    "huge": lambda: crafted(records(b"\x01" + (70000).to_bytes(3, "big") + bytes(70000))),
    "quic": quic,
    "not-tls": lambda: crafted(f"GET / HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()),
    # A handshake record of length 0 ahead of a valid hello (RFC 8446 5.1 forbids it).
    "empty-record": lambda: crafted(bytes([22, 3, 1, 0, 0]) + records(client_hello(server_name(HOST)))),
    # An SSLv2-compatible CLIENT-HELLO (two-byte header with the high bit set).
    "sslv2": lambda: crafted(
        bytes([0x80, 0x2E, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10]) + bytes(37)
    ),
    # A ChangeCipherSpec record (middlebox compatibility) before the hello.
    "ccs-first": lambda: crafted(CHANGE_CIPHER_SPEC + records(client_hello(server_name(HOST)))),
    # The allowed name on a port the policy does not allow, its hello ready behind the CONNECT.
    "other-port": lambda: crafted(records(client_hello(server_name(HOST))), target=f"{HOST}:444"),
    # The allowed name with a signed port, which u16 parsing would take as 443.
    "signed-port": lambda: crafted(records(client_hello(server_name(HOST))), target=f"{HOST}:+443"),
    "plain-http": plain_http,
    "split-real": lambda: real(split=True, groups="prime256v1"),
    "retry-real": lambda: real(),
    "tls12-real": lambda: real(tls12=True),
    "retry-other-sni": lambda: real(
        second_hello=CHANGE_CIPHER_SPEC + records(client_hello(server_name(OTHER)))
    ),
    "retry-ech": lambda: real(
        second_hello=CHANGE_CIPHER_SPEC
        + records(client_hello(server_name(HOST), extension(ECH, MARKER)))
    ),
}

print(json.dumps(SHAPES[SHAPE]()))
