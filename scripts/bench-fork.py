#!/usr/bin/env python3
"""Checkpoints and forks against their alternatives, side by side in one run (jail backend,
as root): a 20,000-file project whose task then writes GIB GiB (an "install" outside the
workspace). Times `task fork` against a fresh `task start` of the same project, `task
checkpoint` against a no-op `task exec`, `task restore`, and the host disk that ten forks take
against one task (allocated blocks: the forks' copies, and the room each disk reserves).

With --xfs-home MB, the same jail rows for two homes side by side, in alternating rounds: one
on the host's filesystem as it is (on ext4 here: checkpoints and forks copy what the task
wrote) and one on an XFS with reflink of MB (sparse) that the bench makes and loop-mounts
(checkpoints and forks clone the disk image and share its extents). With --pool MB, the
second home is on the host's filesystem too, with a reflink pool of MB (DYNOCAP_JAIL_POOL_MB:
reserved whole on the host). Their tasks' disks are --disk-mb (4096) each. The ten forks' disk is
then the filesystem's used space that they add (`statvfs`), since allocated blocks count a
shared extent in every file that has it.

With --vm, the same on the vm backend (QEMU guests of the built debian image, under TCG
unless DYNOCAP_VM_ACCEL says otherwise): `task checkpoint` (a frozen qcow2 layer) and `task
fork` (a boot over a new layer) against a cold `task start`, side by side; then the host disk
of ten forks of a task against that task's, in its sandbox files with each hard-linked layer
counted once: allocated (the task's layer reserves its whole disk; a fork's new layer sets
nothing aside and grows as its guest writes) and data. With --ten-forks-only, only that.

    sudo scripts/bench-fork.py [--gib 1] [--runs 3]
    sudo scripts/bench-fork.py --xfs-home 40960 [--gib 1] [--runs 3]
    sudo scripts/bench-fork.py --pool 16384 [--gib 1] [--runs 3] [--disk-mb 4096]
    sudo scripts/bench-fork.py --vm [--gib 0.25] [--runs 2] [--files 2000]
    sudo scripts/bench-fork.py --vm --files 20000 --gib 1    # the issue's shape, on the vm
    sudo scripts/bench-fork.py --vm --ten-forks-only         # the vm's ten-forks disk only

Uses target/debug (or DYNOCAP_BIN_DIR) and DYNOCAP_AGENT like the e2e tests."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("DYNOCAP_BIN_DIR", ROOT / "target" / "debug")) / "dynocap"
IMAGE_CACHE = Path(os.environ.get("DYNOCAP_TEST_IMAGE_CACHE") or "/var/cache/dynocap-test-images")
# With --vm: the environment of vm sandboxes (see vm_setup).
EXTRA_ENV: dict[str, str] = {}
# With --pool: the environment of one home (by its path).
HOME_ENV: dict[str, dict[str, str]] = {}


def dynocap(home: Path, *args: str) -> dict:
    env = dict(os.environ, DYNOCAP_HOME=str(home), **EXTRA_ENV, **HOME_ENV.get(str(home), {}))
    out = subprocess.run([str(BIN), "--json", *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"dynocap {' '.join(args)} failed: {out.stdout}{out.stderr}")
    return json.loads(out.stdout) if out.stdout.strip() else {}


def timed(home: Path, *args: str) -> float:
    start = time.monotonic()
    dynocap(home, *args)
    return time.monotonic() - start


def project(dir: Path, files: int) -> None:
    for i in range(files):
        path = dir / f"d{i // 500}" / f"f{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i}\n")
    env = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                 ["-c", "user.name=b", "-c", "user.email=b@example.com", "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=dir, env=env, check=True)


def allocated(path: Path) -> int:
    total = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def med(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms"


def report(args, mib, wrote, starts, forks, from_checkpoint, noops, checkpoints, restores) -> None:
    print(f"project: {args.files} files; the task wrote {mib} MiB in {wrote:.1f} s")
    print(f"task start (fresh, {args.runs} runs):      {med(starts)}")
    print(f"task fork (current state):            {med(forks)}  "
          f"= {statistics.median(forks) / statistics.median(starts):.2f}x a fresh start")
    print(f"task fork --checkpoint:               {from_checkpoint * 1000:.0f} ms")
    print(f"task exec -- true (no-op):            {med(noops)}")
    print(f"task checkpoint:                      {med(checkpoints)}  "
          f"= {statistics.median(checkpoints) / statistics.median(noops):.1f}x a no-op exec")
    print(f"task restore:                         {med(restores)}")


def starts_then_source(home: Path, src: str, args, prefix: str, timeout: str, fill: str,
                       flags: tuple[str, ...] = ()):
    """Times `args.runs` fresh starts of `src` (each removed after), then starts task `src`
    and has it write `args.gib` GiB from `fill` (an install's worth) and times no-op execs in
    it; every start with `flags`. Returns (starts, mib written, seconds the write took, no-op
    exec times)."""
    starts = []
    for i in range(args.runs):
        starts.append(timed(home, "task", "start", src, "--name", f"{prefix}{i}", *flags))
        dynocap(home, "rm", "--force", "--purge", f"{prefix}{i}")
    dynocap(home, "task", "start", src, "--name", "src", *flags)
    mib = int(args.gib * 1024)
    t = time.monotonic()
    dynocap(home, "task", "exec", "src", "--timeout", timeout, "--",
            f"mkdir -p ~/deps && head -c {mib}M {fill} > ~/deps/blob && sync")
    wrote = time.monotonic() - t
    noops = [timed(home, "task", "exec", "src", "--", "true") for _ in range(args.runs * 2)]
    return starts, mib, wrote, noops


def vm_setup(home: Path) -> None:
    """vm sandboxes of the debian image (built from the shared test-image cache), with the
    static agent and the VM artefact cache the tests share."""
    agent = os.environ.get("DYNOCAP_AGENT") or str(
        ROOT / "target" / "x86_64-unknown-linux-musl" / "debug" / "dynocap-agent")
    EXTRA_ENV.update({
        "DYNOCAP_IMAGE_CACHE": str(IMAGE_CACHE),
        "DYNOCAP_BACKEND": "vm",
        "DYNOCAP_VM_ACCEL": os.environ.get("DYNOCAP_VM_ACCEL", "tcg"),
        "DYNOCAP_IMAGE": "debian",
        "DYNOCAP_AGENT": agent,
    })
    dynocap(home, "image", "build", "debian")
    shared = IMAGE_CACHE / "vm-cache" / "vm"
    shared.mkdir(parents=True, exist_ok=True)
    (home / "cache").mkdir(parents=True, exist_ok=True)
    (home / "cache" / "vm").symlink_to(shared)


def vm_main(args, home: Path, src: str) -> None:
    """The vm rows: cold starts, then checkpoints and forks of a task that wrote GIB GiB."""
    vm_setup(home)
    # The guest's disk holds the image's files too (about 700 MB of the debian image): past
    # 0.5 GiB written, a disk of 4 GB. A first start, untimed, makes the base disk of that
    # size if the cache has none yet.
    flags = ("--disk-mb", "2048" if args.gib <= 0.5 else "4096")
    dynocap(home, "task", "start", src, "--name", "warm", *flags)
    dynocap(home, "rm", "--force", "--purge", "warm")
    starts, mib, wrote, noops = starts_then_source(home, src, args, "cold", "1200", "/dev/urandom",
                                                   flags)
    checkpoints = [timed(home, "task", "checkpoint", "src", f"c{i}") for i in range(args.runs)]
    forks = []
    for i in range(args.runs):
        forks.append(timed(home, "task", "fork", "src", f"fork{i}"))
        dynocap(home, "rm", "--force", "--purge", f"fork{i}")
    restore = timed(home, "task", "restore", "src", "c0")
    print(f"vm ({EXTRA_ENV['DYNOCAP_VM_ACCEL']}): project of {args.files} files; the task wrote "
          f"{mib} MiB in {wrote:.1f} s; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"vm task start (cold, {args.runs} runs):   {med(starts)}")
    print(f"vm task fork (current state):         {med(forks)}  "
          f"= {statistics.median(forks) / statistics.median(starts):.2f}x a cold start")
    print(f"vm task exec -- true (no-op):         {med(noops)}")
    print(f"vm task checkpoint:                   {med(checkpoints)}  "
          f"= {statistics.median(checkpoints) / statistics.median(starts):.3f}x a cold start, "
          f"{statistics.median(checkpoints) / statistics.median(noops):.1f}x a no-op exec")
    print(f"vm task restore:                      {restore * 1000:.0f} ms")
    dynocap(home, "rm", "--force", "--purge", "src")
    vm_ten_forks(home, src)


def layer_files(path: Path) -> tuple[int, int]:
    """(allocated, data) bytes of the files under `path`, each inode once however many links
    it has (a frozen layer is linked by the task, its checkpoints and its forks): allocated
    blocks count a disk's reservation past its end, data only the blocks within its length."""
    seen, allocated, data = set(), 0, 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            allocated += st.st_blocks * 512
            data += min(st.st_blocks * 512, st.st_size)
    return allocated, data


def vm_ten_forks(home: Path, src: str) -> None:
    """The host disk of ten forks of a vm task (the default 2048 MB disk, which the image's
    files share, 512 MB of memory) that wrote 256 MiB, against that task's, counted in its
    home's sandbox files."""
    dynocap(home, "task", "start", src, "--name", "small", "--memory-mb", "512")
    dynocap(home, "task", "exec", "small", "--timeout", "1200", "--",
            "mkdir -p ~/deps && head -c 256M /dev/urandom > ~/deps/blob && sync")
    sandboxes = home / "sandboxes"
    one_alloc, one_data = layer_files(sandboxes)
    for i in range(10):
        dynocap(home, "task", "fork", "small", f"ten{i}")
    alloc, data = layer_files(sandboxes)
    ten_alloc, ten_data = alloc - one_alloc, data - one_data
    print(f"vm host disk, one task (2048 MB disk, 256 MiB written): {one_alloc / 2**20:.0f} MiB "
          f"allocated, {one_data / 2**20:.0f} MiB of it data")
    print(f"vm host disk, ten forks of it: {ten_alloc / 2**20:.0f} MiB allocated "
          f"= {ten_alloc / one_alloc:.2f}x one task (a fork's layer sets nothing aside); "
          f"{ten_data / 2**20:.0f} MiB of data = {ten_data / one_data:.3f}x one task's")
    for i in range(10):
        dynocap(home, "rm", "--force", "--purge", f"ten{i}")
    dynocap(home, "rm", "--force", "--purge", "small")


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def id_shift(home: Path, name: str):
    """(entries, seconds) of the move of fork `name`'s layer to its host ids, from its log."""
    tasks = dynocap(home, "ls").get("tasks", [])
    ids = [t["id"] for t in tasks if t.get("name") == name]
    if not ids:
        return None
    log = home / "logs" / f"{ids[0]}.log"
    match = re.search(r"moved \d+ of (\d+) entries of the layer .* in (\d+) ms",
                      log.read_text(errors="replace") if log.exists() else "")
    return (int(match[1]), int(match[2]) / 1000) if match else None


def side_by_side(args, homes: dict[str, Path], src: str) -> None:
    """The jail rows for each home in `homes` (label: home), in alternating rounds."""
    t = {label: {k: [] for k in ("start", "noop", "checkpoint", "fork", "restore", "shift")}
         for label in homes}
    wrote = {}
    mib = int(args.gib * 1024)
    for label, home in homes.items():
        dynocap(home, "task", "start", src, "--name", "src", "--disk-mb", str(args.disk_mb))
        w = time.monotonic()
        dynocap(home, "task", "exec", "src", "--timeout", "600", "--",
                f"mkdir -p ~/deps && head -c {mib}M /dev/zero > ~/deps/blob && sync")
        wrote[label] = time.monotonic() - w
    for i in range(args.runs):
        for label, home in homes.items():
            t[label]["start"].append(timed(home, "task", "start", src, "--name", f"fresh{i}",
                                           "--disk-mb", str(args.disk_mb)))
            dynocap(home, "rm", "--force", "--purge", f"fresh{i}")
            t[label]["noop"] += [timed(home, "task", "exec", "src", "--", "true") for _ in range(2)]
            t[label]["checkpoint"].append(timed(home, "task", "checkpoint", "src", f"c{i}"))
            t[label]["fork"].append(timed(home, "task", "fork", "src", f"fork{i}"))
            t[label]["shift"].append(id_shift(home, f"fork{i}"))
            dynocap(home, "rm", "--force", "--purge", f"fork{i}")
            t[label]["restore"].append(timed(home, "task", "restore", "src", f"c{i}"))
    print(f"project: {args.files} files; the task wrote {mib} MiB; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for label, r in t.items():
        start, noop = statistics.median(r["start"]), statistics.median(r["noop"])
        fork, cp = statistics.median(r["fork"]), statistics.median(r["checkpoint"])
        print(f"[{label}] write {wrote[label]:.1f} s; start {med(r['start'])}, fork {med(r['fork'])}"
              f" = {fork / start:.3f}x a fresh start; no-op exec {med(r['noop'])}, checkpoint "
              f"{med(r['checkpoint'])} = {cp / noop:.1f}x a no-op exec; restore {med(r['restore'])}")
        shifts = [x for x in r["shift"] if x is not None]
        if shifts:
            entries, secs = statistics.median(e for e, _ in shifts), statistics.median(s for _, s in shifts)
            print(f"[{label}] the fork's id shift (in its boot): {entries:.0f} entries in "
                  f"{secs * 1000:.0f} ms = {secs / fork:.2f} of the fork")
    for label, home in homes.items():
        dynocap(home, "rm", "--force", "--purge", "src")
    # Ten forks of a task with a 1 GB disk that wrote 256 MiB, per home.
    for label, home in homes.items():
        before = used(home / "sandboxes")
        dynocap(home, "task", "start", src, "--name", "small", "--disk-mb", "1024")
        dynocap(home, "task", "exec", "small", "--timeout", "600", "--",
                "mkdir -p ~/deps && head -c 256M /dev/zero > ~/deps/blob && sync")
        shared_fs = label != "copy"
        one = used(home / "sandboxes") - before if shared_fs else allocated(home / "sandboxes")
        after_one = used(home / "sandboxes")
        for i in range(10):
            dynocap(home, "task", "fork", "small", f"ten{i}")
        ten = (used(home / "sandboxes") - after_one if shared_fs
               else allocated(home / "sandboxes") - one)
        how = "filesystem used space" if shared_fs else "allocated blocks"
        print(f"[{label}] disk of one task (1024 MB disk, 256 MiB written): {one / 2**20:.0f} MiB; "
              f"ten forks of it: {ten / 2**20:.0f} MiB = {ten / one:.2f}x one task, the task and its "
              f"forks {(one + ten) / one:.2f}x ({how})")
        for i in range(10):
            dynocap(home, "rm", "--force", "--purge", f"ten{i}")
        dynocap(home, "rm", "--force", "--purge", "small")


def xfs_home(base: Path, megabytes: int) -> Path:
    """A sparse XFS with reflink of `megabytes`, loop-mounted under `base`."""
    image, mount = base / "xfs.img", base / "xfs"
    mount.mkdir()
    with open(image, "wb") as f:
        f.truncate(megabytes << 20)
    subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    return mount / "h"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gib", type=float, default=None)
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--files", type=int, default=None)
    parser.add_argument("--vm", action="store_true")
    parser.add_argument("--ten-forks-only", action="store_true",
                        help="with --vm: only the host disk of ten forks (no timed rows)")
    parser.add_argument("--xfs-home", type=int, default=None, metavar="MB",
                        help="also bench a home on an XFS with reflink of MB, side by side")
    parser.add_argument("--pool", type=int, default=None, metavar="MB",
                        help="also bench a home with a reflink pool of MB, side by side")
    parser.add_argument("--disk-mb", type=int, default=4096,
                        help="the disk of the side-by-side benches' tasks")
    args = parser.parse_args()
    # TCG is slow: the vm's defaults are smaller.
    defaults = (0.25, 2, 2000) if args.vm else (1.0, 3, 20000)
    for name, default in zip(("gib", "runs", "files"), defaults):
        if getattr(args, name) is None:
            setattr(args, name, default)
    base = Path(tempfile.mkdtemp(prefix="dcf", dir="/tmp"))
    home, proj = base / "h", base / "p"
    proj.mkdir()
    project(proj, args.files)
    if args.xfs_home or args.pool:
        if args.pool:
            second = base / "hp"
            HOME_ENV[str(second)] = {"DYNOCAP_JAIL_POOL_MB": str(args.pool)}
            homes = {"copy": home, "pool": second}
        else:
            homes = {"copy": home, "clone": xfs_home(base, args.xfs_home)}
        try:
            side_by_side(args, homes, str(proj))
        finally:
            for h in homes.values():
                for task in dynocap(h, "ls").get("tasks", []):
                    dynocap(h, "rm", "--force", "--purge", task["id"])
            if args.pool:
                # The pool and the shared bind mount under it, both gone with it.
                dynocap(homes["pool"], "jail-pool", "rm")
            else:
                subprocess.run(["umount", str(base / "xfs")])
            subprocess.run(["rm", "-rf", str(base)])
        return
    if args.vm:
        try:
            if args.ten_forks_only:
                vm_setup(home)
                vm_ten_forks(home, str(proj))
            else:
                vm_main(args, home, str(proj))
        finally:
            for task in dynocap(home, "ls").get("tasks", []):
                dynocap(home, "rm", "--force", "--purge", task["id"])
            subprocess.run(["rm", "-rf", str(base)])
        return
    try:
        src = str(proj)
        # Fresh starts of the project, for the fork to be compared with.
        starts, mib, wrote, noops = starts_then_source(home, src, args, "fresh", "600", "/dev/zero")
        checkpoints = []
        for i in range(args.runs):
            checkpoints.append(timed(home, "task", "checkpoint", "src", f"c{i}"))
        restores = [timed(home, "task", "restore", "src", "c0") for _ in range(args.runs)]
        for i in range(1, args.runs):
            dynocap(home, "task", "checkpoint", "src", f"c{i}", "--delete")
        forks = []
        for i in range(args.runs):
            forks.append(timed(home, "task", "fork", "src", f"fork{i}"))
            dynocap(home, "rm", "--force", "--purge", f"fork{i}")
        from_checkpoint = timed(home, "task", "fork", "src", "fromcp", "--checkpoint", "c0")
        dynocap(home, "rm", "--force", "--purge", "fromcp")
        dynocap(home, "task", "checkpoint", "src", "c0", "--delete")
        report(args, mib, wrote, starts, forks, from_checkpoint, noops, checkpoints, restores)
        dynocap(home, "rm", "--force", "--purge", "src")
        # The disk of ten forks, at a scale that leaves a shared machine its room: a 1 GB
        # disk (its inodes hold the project twice over) that holds 256 MiB of writes.
        dynocap(home, "task", "start", src, "--name", "small", "--disk-mb", "1024")
        dynocap(home, "task", "exec", "small", "--timeout", "600", "--",
                "mkdir -p ~/deps && head -c 256M /dev/zero > ~/deps/blob && sync")
        sandboxes = home / "sandboxes"
        one = allocated(sandboxes)
        for i in range(10):
            dynocap(home, "task", "fork", "small", f"ten{i}")
        ten = allocated(sandboxes) - one
        print(f"host disk, one task (1024 MB disk, 256 MiB written): {one / 2**20:.0f} MiB allocated")
        print(f"host disk, ten forks of it:           {ten / 2**20:.0f} MiB allocated "
          f"= {ten / one:.1f}x one task")
    finally:
        listing = dynocap(home, "ls")
        for task in listing.get("tasks", []):
            dynocap(home, "rm", "--force", "--purge", task["id"])
        subprocess.run(["rm", "-rf", str(base)])


if __name__ == "__main__":
    main()
