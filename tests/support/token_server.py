"""A registry token server for tests/image_pull.rs: the Bearer token authentication of the
distribution registry (https://distribution.github.io/distribution/spec/auth/token/), on a
loopback address the test gives, over TLS. Standard library and the openssl command only.

    token_server.py ADDR PORT CERT KEY SIGN_KEY SIGN_CERT SERVICE USER PASSWORD

CERT, KEY: the server's TLS certificate and key. SIGN_KEY, SIGN_CERT: the RSA key that signs
tokens (RS256) and its certificate, which the registry trusts (`rootcertbundle`) and every
token carries (`x5c`). A request with Basic USER:PASSWORD gets every action it asks for; one
without credentials gets `pull` on repositories under `pub/` only (nothing elsewhere, so the
registry answers 401); wrong credentials get 401 from here. Prints "ready" once it listens;
logs each grant on stderr.
"""

import base64
import http.server
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.parse


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def main():
    addr, port, cert, key, sign_key, sign_cert, service, user, password = sys.argv[1:10]
    der = subprocess.run(["openssl", "x509", "-in", sign_cert, "-outform", "DER"],
                         check=True, capture_output=True).stdout

    def token(subject, scopes):
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            granted = actions.split(",") if subject else (["pull"] if name.startswith("pub/") else [])
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [base64.b64encode(der).decode()]}
        claims = {"iss": "dynocap-test", "sub": subject, "aud": service, "exp": now + 600,
                  "nbf": now - 60, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing_input = f"{b64url(json.dumps(header).encode())}.{b64url(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", sign_key],
                                   input=signing_input.encode(), check=True,
                                   capture_output=True).stdout
        return f"{signing_input}.{b64url(signature)}"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
            subject = ""
            auth = self.headers.get("Authorization", "")
            if auth.startswith("Basic "):
                given = base64.b64decode(auth[6:]).decode(errors="replace")
                if given != f"{user}:{password}":
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                subject = user
            scopes = query.get("scope", [])
            sys.stderr.write(f"token for {subject or 'anonymous'}: {scopes}\n")
            body = json.dumps({"token": token(subject, scopes), "expires_in": 600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer((addr, int(port)), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
