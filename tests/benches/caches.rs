//! Package caches per project: `pip install -r requirements.txt` in the first task of a
//! project, and the same install in a new task of the same project, which pip serves from the
//! project's cache (target: the second at least 3x faster than the first). Side by side in one
//! run, each round with a project of its own (so a fresh cache), first and second alternating.
//!
//! PyPI is tests/support/tlsfix.rs under its real names (`DYNOCAP_RESOLVE`), reached through
//! `filtered` egress with `--allow-host @pypi`, two ways in the same run, alternating within
//! each round: on a 127.X.Y.Z (loopback: the download the cache saves costs next to nothing),
//! and in a network namespace of the bench's own behind a link shaped like a real uplink
//! (tests/support/shaped_link.rs: `tc` rate limits each direction to 100 Mbit/s, adding 20 ms
//! each way where the kernel has `sch_netem`), dynocap then running in the namespace at the
//! link's other end. Two requirement sets, made by the bench: `PACKAGES` wheels of `WHEEL_MB`
//! MB of incompressible bytes each (a data-science project's download: numpy, pandas and
//! friends are about that), where the cache saves the download; and `SDISTS` source
//! distributions with two of those wheels, where it also saves building the sdists into
//! wheels (pip keeps the wheels it built). Nothing leaves loopback and the bench's own
//! namespaces. Run with `scripts/bench.sh` (builds the release binaries first), or after
//! those builds `cargo bench -p dynocap-e2e --bench caches`. Needs root.

#[path = "../support/shaped_link.rs"]
mod shaped_link;
#[path = "../support/tlsfix.rs"]
mod tlsfix;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use dynocap_e2e::bench::{release_bins, stop_command_servers, wait_for_supervisors_to_exit};
use dynocap_e2e::netfix::product;
use shaped_link::ShapedLink;
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
    let link = ShapedLink::start(&fix, "p");

    let work = tempfile::Builder::new()
        .prefix("dccb")
        .tempdir_in("/tmp")
        .expect("temp dir");
    let ca = fix.ca_cert.display().to_string();
    let agent = agent.display().to_string();
    let variant = |name: &'static str, link, resolve| {
        // A home each: a home's command server, and the supervisors it starts, keep the
        // network namespace of the client that started them.
        let home = work.path().join(format!("home-{name}"));
        Variant::<'_> {
            name,
            link,
            envs: vec![
                ("DYNOCAP_HOME", home.display().to_string()),
                ("DYNOCAP_AGENT", agent.clone()),
                (product::ENV_RESOLVE, resolve),
                (product::ENV_EXTRA_CA, ca.clone()),
            ],
            home,
        }
    };
    let variants = [
        variant("loopback", None, fix.resolve(&PYPI)),
        variant("shaped", Some(&link), link.resolve(&PYPI)),
    ];
    let bench = Bench {
        dynocap: &dynocap,
        fix: &fix,
        work: work.path(),
        variants: &variants,
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    println!("load average at the end: {}", load.join(" "));
    for (what, medians) in results {
        for (variant, (first, second)) in variants.iter().zip(medians) {
            let index = match variant.link {
                None => "index on loopback".to_owned(),
                Some(link) => format!("index behind a shaped link: {}", link.shape),
            };
            println!(
                "pip install -r requirements.txt ({what}) in a filtered task, {index}: first \
                 {:.2}s, second task of the project (from its cache) {:.2}s (medians of \
                 {ROUNDS}): {:.1}x faster (target >= 3x)",
                first.as_secs_f64(),
                second.as_secs_f64(),
                first.as_secs_f64() / second.as_secs_f64()
            );
        }
    }
    for variant in &variants {
        let _ = bench
            .dynocap(variant)
            .args(["cache", "rm", "--all"])
            .output();
    }
}

/// One way the tasks reach the index: its server on loopback, or in `S` behind the shaped
/// link (dynocap then runs in `H`).
struct Variant<'a> {
    name: &'static str,
    link: Option<&'a ShapedLink>,
    envs: Vec<(&'static str, String)>,
    home: PathBuf,
}

impl Drop for Variant<'_> {
    /// Ends the home's command server and waits for its supervisors, also when the bench
    /// panics: the variants drop before the shaped link, whose namespaces go only after
    /// every process in `H`, and before the directory holding the homes.
    fn drop(&mut self) {
        stop_command_servers(&self.home);
        wait_for_supervisors_to_exit(&self.home, Duration::from_secs(30));
    }
}

struct Bench<'a> {
    dynocap: &'a Path,
    fix: &'a TlsFix,
    work: &'a Path,
    variants: &'a [Variant<'a>],
}

impl Bench<'_> {
    /// `dynocap` with `variant`'s environment, in `H` for the shaped link.
    fn dynocap(&self, variant: &Variant) -> Command {
        let mut cmd = match variant.link {
            Some(link) => link.command(self.dynocap),
            None => Command::new(self.dynocap),
        };
        cmd.envs(variant.envs.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// `dynocap ARGS`, which must succeed.
    fn dynocap_ok(&self, variant: &Variant, args: &[&str]) -> Output {
        let out = self
            .dynocap(variant)
            .args(args)
            .output()
            .expect("spawn dynocap");
        assert!(
            out.status.success(),
            "dynocap {args:?} ({}): {}{}",
            variant.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// How many package files (wheels, sdists) the index server `variant` reaches has sent,
    /// and how many other requests (index pages) it has answered.
    fn requests(&self, variant: &Variant) -> (usize, usize) {
        let requests = match variant.link {
            Some(link) => link.requests(),
            None => self.fix.requests(),
        };
        let files = requests
            .iter()
            .filter(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(".whl") || p.ends_with(".tar.gz"))
            })
            .count();
        (files, requests.len() - files)
    }

    /// For each variant, the medians of the first and the second install of `requirements`,
    /// each round in a project of its own; the variants alternate within each round.
    fn workload(&self, label: &str, requirements: &[&str]) -> Vec<(Duration, Duration)> {
        let mut times = vec![(Vec::new(), Vec::new()); self.variants.len()];
        for round in 0..ROUNDS {
            let mut order: Vec<usize> = (0..self.variants.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for v in order {
                let (first, second) = self.round(&self.variants[v], label, round, requirements);
                times[v].0.push(first);
                times[v].1.push(second);
            }
        }
        times
            .into_iter()
            .map(|(mut first, mut second)| {
                first.sort();
                second.sort();
                (first[ROUNDS / 2], second[ROUNDS / 2])
            })
            .collect()
    }

    /// The first and the second install in a fresh project, whose caches go after.
    fn round(
        &self,
        variant: &Variant,
        label: &str,
        round: usize,
        requirements: &[&str],
    ) -> (Duration, Duration) {
        let project = self.work.join(format!("{label}-{}-{round}", variant.name));
        std::fs::create_dir_all(&project).expect("project");
        let text = requirements.join("\n") + "\n";
        std::fs::write(project.join("requirements.txt"), text).expect("write");
        let path = project.to_str().expect("utf-8 path");
        let mut took = [Duration::ZERO; 2];
        for (n, which) in ["first", "second"].into_iter().enumerate() {
            let name = format!("{label}-{}-{which}-{round}", variant.name);
            self.dynocap_ok(
                variant,
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
                    "2048",
                ],
            );
            let before = self.requests(variant);
            took[n] = self.install(variant, &name);
            let after = self.requests(variant);
            let (fetched, pages) = (after.0 - before.0, after.1 - before.1);
            if which == "first" {
                assert_eq!(
                    fetched,
                    requirements.len(),
                    "the first install ({}) fetches all",
                    variant.name
                );
            } else {
                assert_eq!(
                    fetched, 0,
                    "the second install ({}) fetched {fetched} files",
                    variant.name
                );
            }
            println!(
                "{label} {} round {round}: {which} install {:.2}s ({fetched} package files, \
                 {pages} other requests)",
                variant.name,
                took[n].as_secs_f64()
            );
            self.dynocap_ok(variant, &["--json", "task", "finish", &name]);
            // A finished task keeps its disk until purged; the project's cache stays.
            self.dynocap_ok(variant, &["--json", "rm", &name, "--purge"]);
        }
        // Each project's cache sets its whole size aside on the host: the rounds' caches
        // would fill the disk. Its last task's supervisor may still hold it for a moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self
            .dynocap(variant)
            .args(["cache", "rm", path])
            .output()
            .is_ok_and(|out| out.status.success())
        {
            assert!(Instant::now() < deadline, "cache rm {path} kept failing");
            std::thread::sleep(Duration::from_millis(200));
        }
        (took[0], took[1])
    }

    /// One install's wall time, from the host (the exec's round trip included).
    fn install(&self, variant: &Variant, task: &str) -> Duration {
        let start = Instant::now();
        let out = self.dynocap_ok(
            variant,
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
}
