//! Package caches per project: `pip install -r requirements.txt` in the first task of a
//! project, and the same install in a new task of the same project, which pip serves from the
//! project's cache (target: the second at least 3x faster than the first). Side by side in one
//! run, each round with a project of its own (so a fresh cache), first and second alternating.
//!
//! PyPI is tests/support/tlsfix.rs on a 127.X.Y.Z under its real names (`DYNOCAP_RESOLVE`),
//! reached through `filtered` egress with `--allow-host @pypi`. Two requirement sets, made by
//! the bench: `PACKAGES` wheels of `WHEEL_MB` MB of incompressible bytes each (a data-science
//! project's download: numpy, pandas and friends are about that), where the cache saves the
//! download; and `SDISTS` source distributions with two of those wheels, where it also saves
//! building the sdists into wheels (pip keeps the wheels it built). Nothing leaves loopback. Run with `scripts/bench.sh` (builds the release binaries first). Needs root.

#[path = "../support/tlsfix.rs"]
mod tlsfix;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dynocap_e2e::bench::{dynocap_ok, release_bins};
use dynocap_e2e::netfix::product;
use tlsfix::TlsFix;

const PYPI: [&str; 2] = ["pypi.org", "files.pythonhosted.org"];
const ROUNDS: usize = 3;
const PACKAGES: usize = 6;
const WHEEL_MB: usize = 12;
/// Source distributions (40 modules each), which pip builds into wheels with setuptools and
/// keeps in its cache: what a project that needs any package without a wheel pays.
const SDISTS: usize = 6;
/// `--no-build-isolation`: an sdist builds with the image's setuptools and wheel, as the index
/// here serves neither.
const INSTALL: &str =
    "pip install -q --retries 0 --no-build-isolation --target /tmp/site -r requirements.txt";

/// Writes `PACKAGES` wheels and their PEP 503 pages into the server's tree, linked as PyPI's
/// are (absolute, on files.pythonhosted.org); returns the requirements file's text.
const WHEELS_PY: &str = r#"
import base64, hashlib, io, os, sys, zipfile
www, count, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
reqs = []
def publish(name, version, filename, data):
    os.makedirs(os.path.join(www, "files"), exist_ok=True)
    with open(os.path.join(www, "files", filename), "wb") as f:
        f.write(data)
    os.makedirs(os.path.join(www, "simple", name), exist_ok=True)
    sha = hashlib.sha256(data).hexdigest()
    with open(os.path.join(www, "simple", name, "index.html"), "w") as f:
        f.write(f'<a href="https://files.pythonhosted.org/files/{filename}#sha256={sha}">{filename}</a>\n')
    reqs.append(f"{name}=={version}")
for i in range(count):
    name, version = f"bench-pkg-{i}", "1.0.0"
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": b"",
        f"{module}/data.bin": os.urandom(mb << 20),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0)), data)
    publish(name, version, f"{module}-{version}-py3-none-any.whl", raw.getvalue())
import tarfile
sdists = int(sys.argv[4])
for i in range(sdists):
    name, version = f"bench-src-{i}", "1.0.0"
    module = name.replace("-", "_")
    root = f"{module}-{version}"
    members = {
        f"{root}/setup.py": f"from setuptools import setup\nsetup(name='{name}', version='{version}', packages=['{module}'])\n".encode(),
        f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    }
    for m in range(40):
        members[f"{root}/{module}/m{m}.py"] = "".join(f"def f{k}(x):\n    return x + {k}\n" for k in range(200)).encode()
    members[f"{root}/{module}/__init__.py"] = b""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tf:
        for path, data in members.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = 1704067200
            tf.addfile(info, io.BytesIO(data))
    publish(name, version, f"{root}.tar.gz", raw.getvalue())
print("\n".join(reqs))
"#;

fn main() {
    let bins = release_bins();
    let dynocap = bins.join("dynocap");
    let agent = std::env::var_os("DYNOCAP_AGENT")
        .map_or_else(|| bins.join("dynocap-agent"), std::path::PathBuf::from);
    let fix = TlsFix::start(&PYPI);
    let made = Command::new("python3")
        .args(["-c", WHEELS_PY])
        .arg(fix.www())
        .args([
            PACKAGES.to_string(),
            WHEEL_MB.to_string(),
            SDISTS.to_string(),
        ])
        .output()
        .expect("python3");
    assert!(made.status.success(), "{made:?}");
    let all = String::from_utf8(made.stdout).expect("utf-8");
    let wheels: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("bench-pkg-"))
        .collect();
    let sources: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("bench-src-"))
        .collect();
    let mixed: Vec<&str> = sources.iter().chain(&wheels[..2]).copied().collect();

    let work = tempfile::Builder::new()
        .prefix("dccb")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let home = work.path().join("home");
    let resolve = fix.resolve(&PYPI);
    let ca = fix.ca_cert.display().to_string();
    let agent = agent.display().to_string();
    let home_text = home.display().to_string();
    let envs = [
        ("DYNOCAP_HOME", home_text.as_str()),
        ("DYNOCAP_AGENT", agent.as_str()),
        (product::ENV_RESOLVE, resolve.as_str()),
        (product::ENV_EXTRA_CA, ca.as_str()),
    ];
    let bench = Bench {
        dynocap: &dynocap,
        envs: &envs,
        fix: &fix,
        work: work.path(),
    };
    let results = [
        (
            format!("{PACKAGES} wheels x {WHEEL_MB} MB"),
            bench.workload("wheels", &wheels),
        ),
        (
            format!("{SDISTS} sdists built by setuptools + 2 wheels x {WHEEL_MB} MB"),
            bench.workload("mixed", &mixed),
        ),
    ];
    for (what, (first, second)) in results {
        println!(
            "pip install -r requirements.txt ({what}) in a filtered task: first {:.2}s, second \
             task of the project (from its cache) {:.2}s (medians of {ROUNDS}): {:.1}x faster \
             (target >= 3x)",
            first.as_secs_f64(),
            second.as_secs_f64(),
            first.as_secs_f64() / second.as_secs_f64()
        );
    }
    let _ = Command::new(&dynocap)
        .envs(envs)
        .args(["cache", "rm", "--all"])
        .output();
}

struct Bench<'a> {
    dynocap: &'a Path,
    envs: &'a [(&'a str, &'a str)],
    fix: &'a TlsFix,
    work: &'a Path,
}

impl Bench<'_> {
    /// How many package files (wheels, sdists) the index server has sent.
    fn package_files(&self) -> usize {
        self.fix
            .requests()
            .iter()
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(".whl") || p.ends_with(".tar.gz"))
            })
            .count()
    }

    /// Medians of the first and the second install of `requirements`, each round in a
    /// project of its own.
    fn workload(&self, label: &str, requirements: &[&str]) -> (Duration, Duration) {
        let mut first = Vec::new();
        let mut second = Vec::new();
        for round in 0..ROUNDS {
            let project = self.work.join(format!("{label}-{round}"));
            std::fs::create_dir_all(&project).expect("project");
            let text = requirements.join("\n") + "\n";
            std::fs::write(project.join("requirements.txt"), text).expect("write");
            let path = project.to_str().expect("utf-8 path");
            for (which, times) in [("first", &mut first), ("second", &mut second)] {
                let name = format!("{label}-{which}-{round}");
                dynocap_ok(
                    self.dynocap,
                    self.envs,
                    &[
                        "--json",
                        "task",
                        "start",
                        path,
                        "--name",
                        &name,
                        "--network",
                        "filtered",
                        "--allow-host",
                        "@pypi",
                        "--disk-mb",
                        "4096",
                    ],
                );
                let before = self.package_files();
                let took = install(self.dynocap, self.envs, &name);
                let fetched = self.package_files() - before;
                if which == "first" {
                    assert_eq!(fetched, requirements.len(), "the first install fetches all");
                } else {
                    assert_eq!(fetched, 0, "the second install fetched {fetched} files");
                }
                println!(
                    "{label} round {round}: {which} install {:.2}s",
                    took.as_secs_f64()
                );
                times.push(took);
                dynocap_ok(
                    self.dynocap,
                    self.envs,
                    &["--json", "task", "finish", &name],
                );
            }
        }
        first.sort();
        second.sort();
        (first[ROUNDS / 2], second[ROUNDS / 2])
    }
}

/// One install's wall time, from the host (the exec's round trip included).
fn install(dynocap: &Path, envs: &[(&str, &str)], task: &str) -> Duration {
    let start = Instant::now();
    let out = dynocap_ok(
        dynocap,
        envs,
        &[
            "--json",
            "task",
            "exec",
            task,
            "--timeout",
            "900",
            "--",
            INSTALL,
        ],
    );
    let took = start.elapsed();
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(result["exitCode"], 0, "{result:#}");
    took
}
