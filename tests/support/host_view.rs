//! What a guest can learn about its host from `/sys` and `/proc`: the host facts a test
//! looks for ([`HostFacts`]) and the search a guest runs for them ([`search`]).
//!
//! The search walks all of `/sys` and `/proc` (the pid directories but the caller's own and
//! PID 1's left out) in one Python process inside the guest, reading every file it may read,
//! every name and every symlink target, and reports each needle found with where it was. A
//! control needle the guest must show (its own hostname) proves the walk read what it
//! claims: a search that read nothing would otherwise pass.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use crate::TestHome;

/// The search, run by the guest's `python3` with one JSON argument:
/// `{"anywhere": [...], "devices": [...], "control": "..."}`, each needle hex-encoded so that
/// the search's own command line (`/proc/self/cmdline`) does not hold what it looks for. `anywhere` needles (host paths,
/// DMI identifiers) count wherever they appear; `devices` (host block device names) count as
/// whole words, outside the mount tables. The mount tables name, as the source of each
/// read-only bind of the host's files, the host device it comes from (SECURITY.md, "What the
/// guest sees of the host"): they are searched for host paths, not for device names.
const SEARCH: &str = r#"
import json, os, re, signal, stat, sys

spec = json.loads(sys.argv[1])
anywhere = [bytes.fromhex(n) for n in spec["anywhere"]]
devices = [re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(bytes.fromhex(n)) + rb"(?![A-Za-z0-9_])")
           for n in spec["devices"]]
control = bytes.fromhex(spec["control"])
# Files that are not about the host, or that a read would block on or take minutes over:
# kernel memory, symbols and type information (megabytes each), the kernel log, page maps,
# the kernel's tracing and debugging.
SKIP = {"/proc/kcore", "/proc/kmsg", "/proc/kallsyms", "/proc/kpagecount", "/proc/kpageflags",
        "/proc/kpagecgroup", "/proc/sysrq-trigger", "/sys/kernel/debug", "/sys/kernel/tracing",
        "/sys/kernel/btf"}
MOUNT_TABLES = re.compile(r"^/proc/(self|1|thread-self)/(task/\d+/)?(mountinfo|mounts|mountstats)$")

found, stats = [], {"names": 0, "files": 0, "control": []}

def on_alarm(*_):
    raise TimeoutError
signal.signal(signal.SIGALRM, on_alarm)

def check(path, where, data):
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if control in data:
        stats["control"].append(path)
    for needle in anywhere:
        if needle in data:
            found.append([needle.decode(), path, where])
    if where == "content" and MOUNT_TABLES.match(path):
        return
    for pattern in devices:
        if pattern.search(data):
            found.append([pattern.pattern.decode(errors="replace"), path, where])

def read(path):
    signal.setitimer(signal.ITIMER_REAL, 2)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        # proc's seq files hand out a page per read: read on to the end (or 1 MiB).
        try:
            data = b""
            while len(data) < 1 << 20:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                data += chunk
            return data
        finally:
            os.close(fd)
    except (OSError, TimeoutError):
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)

def visit(path):
    stats["names"] += 1
    check(path, "name", path)
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        try:
            check(path, "link", os.readlink(path))
        except OSError:
            pass
    elif stat.S_ISDIR(st.st_mode):
        walk(path)
    elif stat.S_ISREG(st.st_mode):
        data = read(path)
        if data is not None:
            stats["files"] += 1
            check(path, "content", data)

def walk(top):
    try:
        names = os.listdir(top)
    except OSError:
        return
    for name in names:
        path = os.path.join(top, name)
        if path in SKIP:
            continue
        if top == "/proc" and (name.isdigit() or name in ("self", "thread-self")):
            continue
        visit(path)

walk("/sys")
walk("/proc")
for pid in ("self", "1"):
    walk(f"/proc/{pid}")
print(json.dumps({"found": found, **stats}))
"#;

/// What the host knows and no guest should: read on the host when the test starts.
#[derive(Debug, Default)]
pub struct HostFacts {
    /// The host's block devices (`/sys/block`): its disks, partitions' parents, every loop
    /// device (the jail's sandbox disks among them).
    pub block_devices: Vec<String>,
    /// The files behind the host's loop devices (`loop/backing_file`): sandbox disk images.
    pub loop_backing_files: Vec<String>,
    /// The machine's DMI identifiers (`/sys/class/dmi/id`): UUID, serials and asset tags, the
    /// ones that single out this machine; placeholders a vendor left unset are dropped.
    pub dmi_identifiers: Vec<String>,
}

/// DMI fields that identify a machine (a vendor or product name does not).
const DMI_IDENTIFIERS: &[&str] = &[
    "product_uuid",
    "product_serial",
    "board_serial",
    "chassis_serial",
    "board_asset_tag",
    "chassis_asset_tag",
];

/// Values vendors leave in unset DMI fields: not an identifier of anything.
fn is_placeholder(value: &str) -> bool {
    let lower = value.to_ascii_lowercase();
    value.len() < 6
        || [
            "to be filled",
            "default string",
            "not specified",
            "not applicable",
            "system serial",
            "0123456789",
            "none",
        ]
        .iter()
        .any(|p| lower.contains(p))
        || value
            .chars()
            .all(|c| c == '0' || c == '-' || c == 'f' || c == 'F')
}

impl HostFacts {
    /// Reads the host's facts now. Run it after the test's sandboxes started, so their loop
    /// devices are among them.
    pub fn read() -> HostFacts {
        let mut facts = HostFacts::default();
        if let Ok(dir) = std::fs::read_dir("/sys/block") {
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let backing = entry.path().join("loop/backing_file");
                if let Ok(file) = std::fs::read_to_string(backing) {
                    facts.loop_backing_files.push(file.trim().to_owned());
                }
                facts.block_devices.push(name);
            }
        }
        for field in DMI_IDENTIFIERS {
            let path = Path::new("/sys/class/dmi/id").join(field);
            if let Ok(value) = std::fs::read_to_string(path) {
                let value = value.trim();
                if !is_placeholder(value) {
                    facts.dmi_identifiers.push(value.to_owned());
                }
            }
        }
        facts
    }
}

/// What one search in a guest returned.
#[derive(Debug)]
pub struct Search {
    /// `(needle, path, where)`: where is `name`, `link` or `content`.
    pub found: Vec<(String, String, String)>,
    /// Names visited and files read.
    pub names: u64,
    pub files: u64,
}

/// Searches the guest `name` of `home` for `anywhere` (paths, identifiers: found anywhere)
/// and `devices` (whole words, outside the mount tables), as the sandbox user or, with
/// `as_root`, as the guest's root through the image's `sudo`. Panics if the walk did not see
/// the guest's own hostname in `/proc/sys/kernel/hostname`, its control.
pub fn search(
    home: &TestHome,
    name: &str,
    as_root: bool,
    anywhere: &BTreeSet<String>,
    devices: &BTreeSet<String>,
) -> Search {
    let encode = |needles: &BTreeSet<String>| needles.iter().map(|n| hex(n)).collect::<Vec<_>>();
    let spec = json!({
        "anywhere": encode(anywhere),
        "devices": encode(devices),
        "control": hex(name),
    })
    .to_string();
    let script = shell_quote(SEARCH);
    let argument = shell_quote(&spec);
    let sudo = if as_root { "sudo " } else { "" };
    // Thousands of files: seconds in a jail, tens of seconds in a VM under TCG on a busy
    // machine, so a deadline far past exec's default.
    let command = format!("{sudo}python3 -c {script} {argument}");
    let result = home.exec(name, &["--timeout", "600"], &command);
    assert_eq!(result["exitCode"], 0, "the search failed: {result:#}");
    let out = result["stdout"].as_str().expect("stdout");
    let report: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|err| panic!("the search printed no JSON ({err}): {out}"));
    let control = report["control"].as_array().expect("control");
    assert!(
        control.iter().any(|p| p == "/proc/sys/kernel/hostname"),
        "the search did not read the guest's own hostname in /proc/sys/kernel/hostname, so \
         it cannot be trusted to have read the rest: {report}"
    );
    let found = report["found"]
        .as_array()
        .expect("found")
        .iter()
        .map(|hit| {
            let part = |i: usize| hit[i].as_str().expect("string").to_owned();
            (part(0), part(1), part(2))
        })
        .collect();
    Search {
        found,
        names: report["names"].as_u64().expect("names"),
        files: report["files"].as_u64().expect("files"),
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `s` as one single-quoted shell word.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
