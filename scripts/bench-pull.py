#!/usr/bin/env python3
"""`dynocap image pull` against `skopeo copy` from the same local registry, side by side.

Starts Debian's `docker-registry` (the CNCF distribution registry) on a fresh 127.X address
with TLS from a throwaway CA, pushes two images the script makes itself (image A: five layers
of ~20 MB each, ~100 MB; image B: A's first four layers and one new ~20 MB layer), then times,
alternately and ROUNDS times each:

  skopeo copy docker://REGISTRY/bench/a:1 oci:DIR      (the floor: download and verify)
  dynocap image pull REGISTRY/bench/a:1                (download, verify, unpack, assemble)

each into an empty directory / fresh DYNOCAP_HOME, and then `dynocap image pull` of B on a home
that has A (only B's own layer should be fetched). Prints medians and the ratio.
`--layers N --layer-mb M` change image A's shape (B keeps sharing all of A's layers but the
top one): the same bytes in more, smaller layers cost more per-layer work (unpacks, installs).
`--baseline-dynocap OTHER` times a second build's pull in the same rounds (the two builds'
order alternating from round to round), so a change is measured against the build before it
on the same machine at the same time: each build's ratio to skopeo and theirs to each other.

Then task starts on a pulled image beside the same start on the built `debian` image: the
debian image comes from the tests' shared image cache (DYNOCAP_TEST_IMAGE_CACHE, else
/var/cache/dynocap-test-images; built there first when missing, which takes minutes), its
rootfs is pushed as a one-layer image (same files, so only being pulled differs), pulled, and
`dynocap task start PROJECT --image X --backend B` alternates between the two, after one
untimed start on each (a VM's first start on an image makes its base disk), ROUNDS times on the
jail and VM_ROUNDS times on the vm backend (under TCG unless DYNOCAP_VM_ACCEL says otherwise;
each boot takes seconds, so few rounds), each task removed, untimed, before the next start.
`--no-tasks` skips this part.

Usage (as root): scripts/bench-pull.py [--dynocap target/release/dynocap] [--rounds 3]
                 [--baseline-dynocap /tmp/dynocap-before] [--layers 5 --layer-mb 20]
                 [--backends jail,vm]
                 [--vm-rounds 3] [--no-tasks]
Needs docker-registry, skopeo, openssl, mmdebstrap (scripts/install-deps.sh). Loopback only.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import random
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

NAME = "registry.bench"
PORT = 5000
LAYER_MB = 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def layer(seed: int, megabytes: int) -> bytes:
    """A tar of a few files of pseudo-random (incompressible) bytes."""
    rng = random.Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        d = tarfile.TarInfo(f"layer{seed}")
        d.type = tarfile.DIRTYPE
        d.mode = 0o755
        tar.addfile(d)
        for n in range(4):
            data = rng.randbytes(megabytes * (1 << 20) // 4)
            info = tarfile.TarInfo(f"layer{seed}/file{n}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write_layout(directory: str, layers: list) -> None:
    blobs = os.path.join(directory, "blobs/sha256")
    os.makedirs(blobs, exist_ok=True)

    def put(data: bytes) -> str:
        digest = sha(data)
        with open(os.path.join(blobs, digest), "wb") as f:
            f.write(data)
        return digest

    descriptors = []
    for tar in layers:
        blob = gzip.compress(tar, compresslevel=1, mtime=0)
        descriptors.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                            "digest": "sha256:" + put(blob), "size": len(blob)})
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": ["sha256:" + sha(t) for t in layers]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + put(config), "size": len(config)},
        "layers": descriptors}).encode()
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": "sha256:" + put(manifest), "size": len(manifest)}]}
    with open(os.path.join(directory, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(directory, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')


def run(cmd, **kw):
    subprocess.run(cmd, check=True, **kw)


def make_ca(pki: str, addr: str) -> None:
    os.makedirs(pki, exist_ok=True)
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"), "-days", "2",
         "-subj", "/CN=dynocap pull bench CA", "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign"], capture_output=True)
    run(["openssl", "req", *ec, "-keyout", p("server.key"), "-out", p("server.csr"),
         "-subj", f"/CN={NAME}"], capture_output=True)
    with open(p("server.ext"), "w") as f:
        f.write(f"subjectAltName=DNS:{NAME},IP:{addr}\nextendedKeyUsage=serverAuth\n")
    run(["openssl", "x509", "-req", "-in", p("server.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
         "-CAcreateserial", "-out", p("server.pem"), "-days", "2", "-extfile", p("server.ext")],
        capture_output=True)
    os.makedirs(p("certs"), exist_ok=True)
    shutil.copy(p("ca.pem"), p("certs/ca.crt"))


CPU = {}


def timed(cmd, env=None, cpu=None) -> float:
    """Wall seconds of `cmd`; its CPU seconds (user + system) are added to CPU[cpu]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu:
        CPU.setdefault(cpu, []).append(after.ru_utime - before.ru_utime
                                        + after.ru_stime - before.ru_stime)
    return wall


def bench_task_starts(dynocap: str, env: dict, addr: str, pki: str, work: str, rounds: int,
                      backends: list, vm_rounds: int) -> None:
    """Task starts on the debian image pulled from the registry beside the built one."""
    cache = os.environ.get("DYNOCAP_TEST_IMAGE_CACHE") or "/var/cache/dynocap-test-images"
    home = os.path.join(work, "home-tasks")
    env = dict(env, DYNOCAP_HOME=home, DYNOCAP_IMAGE_CACHE=cache)

    def dc(*args):
        out = subprocess.run([dynocap, "--json", *args], env=env, check=True, capture_output=True)
        return json.loads(out.stdout) if out.stdout.strip() else None

    print("task starts: the debian image (from the image cache, or built now)", file=sys.stderr)
    built = dc("image", "build", "debian")["image"]
    rootfs = os.path.join(built["path"], "rootfs")
    layer_tar = os.path.join(work, "debian.tar")
    run(["tar", "--numeric-owner", "--xattrs", "-C", rootfs, "-cf", layer_tar, "."])
    layout = os.path.join(work, "layout-debian")
    blobs = os.path.join(layout, "blobs/sha256")
    os.makedirs(blobs)
    h = hashlib.sha256()
    with open(layer_tar, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    layer_hex, layer_size = h.hexdigest(), os.path.getsize(layer_tar)
    os.rename(layer_tar, os.path.join(blobs, layer_hex))
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": "sha256:" + sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": f"sha256:{layer_hex}", "size": layer_size}]}).encode()
    for blob in (config, manifest):
        with open(os.path.join(blobs, sha(blob)), "wb") as f:
            f.write(blob)
    with open(os.path.join(layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + sha(manifest), "size": len(manifest)}]}, f)
    with open(os.path.join(layout, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-cert-dir", f"{pki}/certs",
         f"oci:{layout}", f"docker://{addr}:{PORT}/bench/debian:1"])
    shutil.rmtree(layout)
    pulled_ref = f"{NAME}:{PORT}/bench/debian:1"
    print(f"task starts: pulling {pulled_ref} ({layer_size / 1e6:.0f} MB, one layer)", file=sys.stderr)
    dc("image", "pull", pulled_ref)

    project = os.path.join(work, "project")
    os.makedirs(os.path.join(project, "src"))
    for n in range(20):
        with open(os.path.join(project, "src", f"f{n}.txt"), "w") as f:
            f.write(f"file {n}\n" * 100)
    git = ["git", "-C", project, "-c", "user.name=b", "-c", "user.email=b@example.com"]
    run([*git, "init", "-q", "-b", "main"])
    run([*git, "add", "-A"])
    run([*git, "commit", "-q", "-m", "first"])

    for backend in backends:
        backend_rounds = vm_rounds if backend == "vm" else rounds
        benv = env
        if backend == "vm":
            benv = dict(env, DYNOCAP_VM_ACCEL=env.get("DYNOCAP_VM_ACCEL", "tcg"))

        def start(image: str, name: str) -> float:
            took = timed([dynocap, "task", "start", project, "--name", name, "--image", image,
                          "--backend", backend], env=benv)
            subprocess.run([dynocap, "rm", name, "--force", "--purge"], env=benv, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.2)
            return took

        # One untimed start on each first: what a first start makes once per image (a VM's
        # base disk from the rootfs, its initramfs) is not what this compares.
        for image in ("debian", pulled_ref):
            warm = start(image, f"w-{backend}-{'p' if image == pulled_ref else 'd'}")
            print(f"task starts ({backend}): first start on {image} {warm:.2f} s (untimed warm-up)",
                  file=sys.stderr)
        times = {"debian": [], pulled_ref: []}
        for n in range(backend_rounds):
            # Alternating which goes first, so neither always follows the other's teardown.
            order = ["debian", pulled_ref] if n % 2 == 0 else [pulled_ref, "debian"]
            for image in order:
                tag = "p" if image == pulled_ref else "d"
                times[image].append(start(image, f"t{backend}{n}-{tag}"))
        d, p = statistics.median(times["debian"]), statistics.median(times[pulled_ref])
        accel = f", {benv['DYNOCAP_VM_ACCEL']}" if backend == "vm" else ""
        print(f"task start ({backend}{accel}), median of {backend_rounds}, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}:")
        print(f"  on the debian image          {d:.2f} s  {[round(t, 2) for t in times['debian']]}")
        print(f"  on the same rootfs, pulled   {p:.2f} s  {[round(t, 2) for t in times[pulled_ref]]}")
        print(f"  ratio pulled/debian          {p / d:.2f}x (target <= 1.1x)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dynocap", default="target/release/dynocap")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", type=int, default=5, help="image A's layers (at least 2)")
    parser.add_argument("--layer-mb", type=int, default=LAYER_MB, help="MB in each layer")
    parser.add_argument("--baseline-dynocap", metavar="OTHER",
                        help="another build (e.g. the one before a change) whose pull of A is "
                             "timed in the same rounds, alternating with --dynocap's")
    parser.add_argument("--backends", default="jail,vm",
                        help="the backends the task starts run on, in this order")
    parser.add_argument("--vm-rounds", type=int, default=3,
                        help="rounds of the vm task starts (under TCG each boot takes seconds)")
    parser.add_argument("--no-tasks", action="store_true",
                        help="skip the task starts on a pulled image beside the debian image")
    args = parser.parse_args()
    if args.layers < 2 or args.layer_mb < 1:
        parser.error("--layers needs at least 2 (B shares all but A's top one), --layer-mb 1")
    dynocap = os.path.abspath(args.dynocap)
    baseline = os.path.abspath(args.baseline_dynocap) if args.baseline_dynocap else None
    work = tempfile.mkdtemp(prefix="dcbench-pull-")
    addr = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    pki = os.path.join(work, "pki")
    make_ca(pki, addr)
    with open(os.path.join(work, "config.yml"), "w") as f:
        f.write(f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: "
                f"{work}/data\nhttp:\n  addr: {addr}:{PORT}\n  tls:\n    certificate: {pki}/server.pem\n"
                f"    key: {pki}/server.key\n")
    registry = subprocess.Popen(["docker-registry", "serve", os.path.join(work, "config.yml")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((addr, PORT), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the registry did not listen")
                time.sleep(0.05)
        count, size = args.layers, args.layer_mb
        print(f"making layers ({count * size} MB image A, B sharing {count - 1} of its {count} "
              "layers)", file=sys.stderr)
        shared = [layer(n, size) for n in range(count - 1)]
        image_a = shared + [layer(1000, size)]
        image_b = shared + [layer(2000, size)]
        for name, layers in (("a", image_a), ("b", image_b)):
            layout = os.path.join(work, f"layout-{name}")
            write_layout(layout, layers)
            run(["skopeo", "copy", "--quiet", "--preserve-digests", "--dest-cert-dir", f"{pki}/certs",
                 f"oci:{layout}", f"docker://{addr}:{PORT}/bench/{name}:1"])
        env = dict(os.environ, DYNOCAP_REGISTRIES=f"{NAME}:{PORT}",
                   DYNOCAP_RESOLVE=f"{NAME}:{PORT}:{addr}", DYNOCAP_EXTRA_CA=f"{pki}/ca.pem",
                   DOCKER_CONFIG="/nonexistent")
        skopeo_times, pull_times, baseline_times = [], [], []
        load_before = os.getloadavg()
        for n in range(args.rounds):
            dest = os.path.join(work, f"skopeo-{n}")
            skopeo_times.append(timed(["skopeo", "copy", "--quiet", "--src-cert-dir", f"{pki}/certs",
                                       f"docker://{addr}:{PORT}/bench/a:1", f"oci:{dest}"],
                                      cpu="skopeo"))
            shutil.rmtree(dest)
            home = os.path.join(work, f"home-{n}")
            builds = [(dynocap, pull_times, "pull", home)]
            if baseline:
                builds.append((baseline, baseline_times, "baseline", home + "-baseline"))
                # Alternating which goes first, so neither always follows skopeo.
                if n % 2 == 1:
                    builds.reverse()
            for binary, times, cpu, build_home in builds:
                times.append(timed([binary, "image", "pull", f"{NAME}:{PORT}/bench/a:1"],
                                   env=dict(env, DYNOCAP_HOME=build_home), cpu=cpu))
                if build_home != home or n < args.rounds - 1:
                    shutil.rmtree(build_home)
        home = os.path.join(work, f"home-{args.rounds - 1}")
        start = time.monotonic()
        out = subprocess.run([dynocap, "--json", "image", "pull", f"{NAME}:{PORT}/bench/b:1"],
                             env=dict(env, DYNOCAP_HOME=home), check=True, capture_output=True)
        second = time.monotonic() - start
        transfer = json.loads(out.stdout)["transfer"]
        s, p = statistics.median(skopeo_times), statistics.median(pull_times)
        print(f"image A (~{count * size} MB, {count} layers), median of {args.rounds}:")
        print(f"  skopeo copy docker:// oci:   {s:.2f} s  {[round(t, 2) for t in skopeo_times]}")
        print(f"  dynocap image pull           {p:.2f} s  {[round(t, 2) for t in pull_times]}")
        print(f"  ratio pull/skopeo            {p / s:.2f}x (target <= 1.2x)")
        cs, cp = statistics.median(CPU["skopeo"]), statistics.median(CPU["pull"])
        print(f"  CPU (user+sys), median       skopeo {cs:.2f} s, pull {cp:.2f} s: {cp / cs:.2f}x "
              "(the registry's own not counted)")
        if baseline:
            b = statistics.median(baseline_times)
            cb = statistics.median(CPU["baseline"])
            print(f"  baseline pull ({args.baseline_dynocap})")
            print(f"                               {b:.2f} s  {[round(t, 2) for t in baseline_times]}")
            print(f"  ratio baseline/skopeo        {b / s:.2f}x, CPU {cb:.2f} s: {cb / cs:.2f}x")
            print(f"  ratio pull/baseline          {p / b:.2f}x wall, {cp / cb:.2f}x CPU; round by "
                  f"round (same load), median "
                  f"{statistics.median(x / y for x, y in zip(pull_times, baseline_times)):.2f}x")
        load_after = os.getloadavg()
        print(f"  load average (1 min) before/after the rounds: {load_before[0]:.1f} / "
              f"{load_after[0]:.1f}")
        print(f"image B (A's {count - 1} base layers + 1 own), on a home holding A: {second:.2f} s, "
              f"{transfer['blobsDownloaded']} blob(s) / {transfer['bytesDownloaded'] / 1e6:.1f} MB downloaded, "
              f"{transfer['layersPresent']} layers already stored")
        if not args.no_tasks:
            bench_task_starts(dynocap, env, addr, pki, work, args.rounds,
                              args.backends.split(","), args.vm_rounds)
        return 0
    finally:
        registry.kill()
        registry.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
