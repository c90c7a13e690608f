//! Where a client finds its home's command server: a socket in the home's `run/` directory
//! whose name is a digest of what the server must share with the client to run its command
//! as the client's own `dynocap-core` would: the same `dynocap-core` file, user and groups,
//! namespaces and root, environment and umask, and the process attributes a command's
//! processes inherit (resource limits, scheduling and I/O priority, CPU affinity, cgroups,
//! capabilities, seccomp, security label, OOM score). A client that differs in any of them
//! (an upgraded binary, `sudo`, `unshare`, another `DYNOCAP_*` setting, `nice`, `ulimit`,
//! `systemd-run`) computes another name, and so never reaches a server that would run its
//! command differently: the server a client starts inherits all of them from that client.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::attributes::Process;

/// Variables that say where a shell is, which no served command reads: left out of the
/// digest, so that one server serves a person's commands from every directory.
const LOCATION_VARIABLES: [&str; 2] = ["PWD", "OLDPWD"];

/// The home directory the command will use, resolved as `dynocap-core` resolves it
/// (`Home::from_env` in the engine): `DYNOCAP_HOME`, else `$XDG_DATA_HOME/dynocap`, else
/// `$HOME/.local/share/dynocap`. Only picks the socket to try: a server starts only for the
/// home its own environment gives, so a disagreement costs speed, never correctness.
pub fn home_dir(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|value| !value.is_empty());
    if let Some(dir) = set("DYNOCAP_HOME") {
        return Some(PathBuf::from(dir));
    }
    if let Some(dir) = set("XDG_DATA_HOME") {
        return Some(PathBuf::from(dir).join("dynocap"));
    }
    set("HOME").map(|home| PathBuf::from(home).join(".local/share/dynocap"))
}

/// What of a process a served command depends on besides its arguments, and the server
/// must therefore share with its clients: the umask, and the environment, sorted and without
/// [`LOCATION_VARIABLES`]. A client sends its own with each request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub umask: u32,
    /// Entries `KEY=VALUE`.
    pub env: Vec<OsString>,
}

impl Context {
    /// This process's. Reads the umask, which means setting it: call while one thread runs.
    pub fn of_this_process() -> Self {
        Self::keyed(current_umask(), environment_entries())
    }

    /// A context from a umask and environment entries in any order, kept as the digest and
    /// the comparison need them.
    pub fn keyed(umask: u32, entries: impl IntoIterator<Item = OsString>) -> Self {
        let mut env: Vec<OsString> = entries
            .into_iter()
            .filter(|entry| {
                let name = entry
                    .as_bytes()
                    .split(|b| *b == b'=')
                    .next()
                    .unwrap_or_default();
                !LOCATION_VARIABLES
                    .iter()
                    .any(|skip| skip.as_bytes() == name)
            })
            .collect();
        env.sort();
        Self { umask, env }
    }
}

/// The server's socket for `core` (the `dynocap-core` file, followed if a link) and
/// `context`, in the home whose `run/` directory is `run_dir`.
pub fn socket_path(run_dir: &Path, core: &Path, context: &Context) -> io::Result<PathBuf> {
    Ok(run_dir.join(format!("cli-{:016x}.sock", server_key(core, context)?)))
}

/// The digest in the socket's name. Not a secret and not a defence: any process of the user
/// can connect to any of the home's sockets, and the server reads its peer's attributes from
/// the kernel and serves only one whose attributes are its own. The digest sends each client
/// to a server that will serve it, started by a client like it.
pub fn server_key(core: &Path, context: &Context) -> io::Result<u64> {
    let binary = std::fs::metadata(core)?;
    let mut digest = Fnv1a::new();
    for field in [
        binary.dev(),
        binary.ino(),
        binary.size(),
        binary.mtime().cast_unsigned(),
        binary.mtime_nsec().cast_unsigned(),
        u64::from(nix::unistd::geteuid().as_raw()),
        u64::from(nix::unistd::getegid().as_raw()),
    ] {
        digest.write(&field.to_le_bytes());
    }
    // Every attribute a command's processes inherit, as the server reads them of a client.
    let attributes = Process::current().attributes();
    // A server never serves a process under seccomp (see `cli_server::peer` in
    // dynocap-core): such a process neither looks for one nor starts one.
    let unfiltered = attributes.iter().any(|attribute| {
        attribute.name == "Seccomp"
            && matches!(&attribute.value, Ok(mode) if mode.trim_ascii() == b"0")
    });
    if !unfiltered {
        return Err(io::Error::other(
            "this process runs under seccomp (or its mode cannot be read): no command server",
        ));
    }
    for attribute in attributes {
        digest.write(attribute.name.as_bytes());
        match &attribute.value {
            Ok(bytes) => {
                digest.write(b"=");
                digest.write(bytes);
            }
            Err(errno) => {
                digest.write(b"!");
                digest.write(&errno.to_le_bytes());
            }
        }
        digest.write(&[0]);
    }
    digest.write(&context.umask.to_le_bytes());
    for entry in &context.env {
        digest.write(entry.as_bytes());
        digest.write(&[0]);
    }
    Ok(digest.finish())
}

/// This process's environment, each entry `KEY=VALUE`.
fn environment_entries() -> impl Iterator<Item = OsString> {
    std::env::vars_os().map(|(key, value)| {
        let mut entry = key;
        entry.push("=");
        entry.push(value);
        entry
    })
}

/// This process's umask. Reading it means setting it: call while one thread runs, or while
/// no other creates files.
pub(crate) fn current_umask() -> u32 {
    let mask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    nix::sys::stat::umask(mask);
    mask.bits()
}

/// `dynocap-core` beside the running `dynocap`.
pub fn core_beside(client: &Path) -> PathBuf {
    client
        .parent()
        .unwrap_or_else(|| Path::new(OsStr::new("/")))
        .join(crate::CORE_BINARY)
}

/// 64-bit FNV-1a: stable across builds and processes, unlike std's `DefaultHasher`, whose
/// algorithm is unspecified; the client and the server must compute the same name.
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_resolved_as_the_engine_resolves_it() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| value.into())
            }
        };
        assert_eq!(
            home_dir(env(&[("DYNOCAP_HOME", "/h"), ("HOME", "/root")])),
            Some(PathBuf::from("/h"))
        );
        assert_eq!(
            home_dir(env(&[
                ("DYNOCAP_HOME", ""),
                ("XDG_DATA_HOME", "/x"),
                ("HOME", "/r")
            ])),
            Some(PathBuf::from("/x/dynocap"))
        );
        assert_eq!(
            home_dir(env(&[("HOME", "/r")])),
            Some(PathBuf::from("/r/.local/share/dynocap"))
        );
        assert_eq!(home_dir(env(&[])), None);
    }

    #[test]
    fn the_key_changes_with_the_binary_and_is_stable_otherwise() {
        let dir = std::env::temp_dir().join(format!("dcrendezvous{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let core = dir.join("core");
        let context = Context::keyed(0o022, [OsString::from("A=1")]);
        std::fs::write(&core, b"one").expect("write");
        let first = server_key(&core, &context).expect("key");
        assert_eq!(
            first,
            server_key(&core, &context).expect("key"),
            "same file, same key"
        );
        // A new build is a new file: replaced, as installs and cargo do.
        let replacement = dir.join("core.new");
        std::fs::write(&replacement, b"two, longer").expect("write");
        std::fs::rename(&replacement, &core).expect("rename");
        let second = server_key(&core, &context).expect("key");
        assert_ne!(first, second);
        // Another umask or environment: another key.
        let umask = Context::keyed(0o077, [OsString::from("A=1")]);
        let env = Context::keyed(0o022, [OsString::from("A=2")]);
        for other in [umask, env] {
            assert_ne!(second, server_key(&core, &other).expect("key"), "{other:?}");
        }
        assert!(server_key(&dir.join("absent"), &context).is_err());
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn the_environment_is_keyed_without_the_shells_location_and_in_any_order() {
        let entries = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
        let here = Context::keyed(
            0o022,
            entries(&["PWD=/a", "B=2", "A=1", "OLDPWD=/x", "PWDX=kept"]),
        )
        .env;
        let there = Context::keyed(0o022, entries(&["A=1", "PWD=/b", "PWDX=kept", "B=2"])).env;
        assert_eq!(here, there);
        assert_eq!(here, entries(&["A=1", "B=2", "PWDX=kept"]));
        assert_ne!(
            here,
            Context::keyed(0o022, entries(&["A=1", "B=3", "PWDX=kept"])).env
        );
    }

    #[test]
    fn reading_the_umask_gives_it_and_leaves_it_as_it_was() {
        let before = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o027));
        assert_eq!(current_umask(), 0o027);
        assert_eq!(current_umask(), 0o027, "the first read put it back");
        nix::sys::stat::umask(before);
    }

    #[test]
    fn fnv1a_matches_its_reference_values() {
        // From the FNV reference test suite.
        let digest = |text: &[u8]| {
            let mut fnv = Fnv1a::new();
            fnv.write(text);
            fnv.finish()
        };
        assert_eq!(digest(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(digest(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
