#!/usr/bin/env python3
"""Writes what the network tests' HTTPS server serves statically (tests/support/netfix.rs).

usage: content.py WWW NPM_PACKAGE PYPI_PACKAGE VERSION

- an npm registry: WWW/<pkg>/index.json, the package document npm fetches from
  https://registry.npmjs.org/<pkg>, whose dist.tarball points at WWW/<pkg>/-/<pkg>-<v>.tgz on
  the same registry name, with the sha1 `shasum` and sha512 `integrity` npm checks;
- a PEP 503 simple index: WWW/simple/index.html, WWW/simple/<pkg>/index.html linking (with a
  sha256 fragment, relative so any host name works) to a real wheel in WWW/files/.

Everything is generated from fixed inputs with fixed timestamps, so it is the same every run.
"""

import base64
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import zipfile

EPOCH = 1_700_000_000


def npm(www, name, version):
    files = {
        "package/package.json": json.dumps(
            {"name": name, "version": version, "main": "index.js", "license": "MIT"},
            indent=2,
        ).encode(),
        "package/index.js": b"module.exports = 'served by the dynocap test registry';\n",
    }
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = EPOCH
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    tgz = gzip.compress(raw.getvalue(), mtime=EPOCH)
    tarball = f"{name}-{version}.tgz"
    os.makedirs(os.path.join(www, name, "-"), exist_ok=True)
    with open(os.path.join(www, name, "-", tarball), "wb") as f:
        f.write(tgz)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    doc = {
        "name": name,
        "dist-tags": {"latest": version},
        "versions": {
            version: {
                "name": name,
                "version": version,
                "main": "index.js",
                "license": "MIT",
                "dist": {
                    "tarball": f"https://registry.npmjs.org/{name}/-/{tarball}",
                    "shasum": hashlib.sha1(tgz).hexdigest(),
                    "integrity": integrity,
                },
            }
        },
        "time": {version: "2023-11-14T22:13:20.000Z"},
    }
    with open(os.path.join(www, name, "index.json"), "w") as f:
        json.dump(doc, f, indent=2)


def wheel(www, name, version):
    module = re.sub(r"[-.]+", "_", name)
    dist_info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"SERVED_BY = 'the dynocap test index'\n",
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Summary: DynoCap network test fixture\n"
        ).encode(),
        f"{dist_info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: dynocap-netfix\nRoot-Is-Purelib: true\n"
            b"Tag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2023, 11, 14, 22, 13, 20)), data)
    whl = raw.getvalue()
    filename = f"{module}-{version}-py3-none-any.whl"
    os.makedirs(os.path.join(www, "files"), exist_ok=True)
    with open(os.path.join(www, "files", filename), "wb") as f:
        f.write(whl)
    normalized = re.sub(r"[-_.]+", "-", name).lower()
    os.makedirs(os.path.join(www, "simple", normalized), exist_ok=True)
    with open(os.path.join(www, "simple", "index.html"), "w") as f:
        f.write(
            "<!DOCTYPE html>\n<html><body>\n"
            f'<a href="{normalized}/">{normalized}</a>\n</body></html>\n'
        )
    sha = hashlib.sha256(whl).hexdigest()
    with open(os.path.join(www, "simple", normalized, "index.html"), "w") as f:
        f.write(
            "<!DOCTYPE html>\n<html><body>\n"
            f'<a href="../../files/{filename}#sha256={sha}">{filename}</a>\n'
            "</body></html>\n"
        )


def main():
    www, npm_name, pypi_name, version = sys.argv[1:5]
    npm(www, npm_name, version)
    wheel(www, pypi_name, version)
    with open(os.path.join(www, "index.html"), "w") as f:
        f.write("dynocap netfix\n")


if __name__ == "__main__":
    main()
