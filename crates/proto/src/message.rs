//! The messages carried inside frames: what a stream asks for and how it ends.
//!
//! Every message is JSON with unknown fields refused, so a version mismatch between the host
//! and an agent shows up as a clear error instead of silently ignored options.

use serde::{Deserialize, Serialize};

/// Channel numbers used in [`crate::FrameKind::Data`] and [`crate::FrameKind::Eof`] frames.
pub mod channel {
    /// Bytes the host sends into the stream (an import's tar stream).
    pub const INPUT: u8 = 0;
    pub const STDOUT: u8 = 1;
    pub const STDERR: u8 = 2;
    /// A pseudo-terminal's combined output.
    pub const TERMINAL: u8 = 3;
    /// The bytes of a tunnel, in both directions.
    pub const TUNNEL: u8 = 4;
}

/// Protocol revision; the agent announces it in [`Hello`] and the host refuses a mismatch.
pub const PROTOCOL_VERSION: u32 = 2;

/// Upper bound on the command string of an exec, so a request always fits in one frame.
pub const MAX_COMMAND_LEN: usize = 256 * 1024;

/// Sent by the agent on the control stream as soon as it is ready for requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hello {
    pub protocol: u32,
    pub agent_version: String,
}

/// What an `Open` frame asks the agent to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Request {
    /// Answered with `Done(Response::Pong)`; used for liveness and latency checks.
    Ping,
    Exec(ExecRequest),
    /// Unpack the tar stream the host sends on [`channel::INPUT`] into a workspace.
    Unpack(UnpackRequest),
    /// Store the bytes the host sends on [`channel::INPUT`] in a file only the agent reads
    /// (the imported history bundle).
    ReceiveFile(ReceiveFileRequest),
    /// Turn the unpacked workspace into a git repository and record its baseline.
    Baseline(BaselineRequest),
    /// Send the patch baseline → working tree on [`channel::STDOUT`].
    Diff(DiffRequest),
    /// Start or stop the guest's egress listener, through which commands reach the host's
    /// proxy; answered with `Done(Response::Egress)`.
    Egress(EgressRequest),
    /// Clone a git repository into a workspace through the egress listener, as the sandbox
    /// user; git's progress comes on [`channel::STDERR`], the end as `Done(Response::Cloned)`.
    Clone(CloneRequest),
    /// How many processes the guest's own kernel has OOM-killed since it booted (its
    /// `/proc/vmstat` `oom_kill`), answered with `Done(Response::OomKills)`. Only a guest with
    /// a kernel of its own (a VM) is asked: in a jail that counter is the host's.
    OomKills,
    /// Write everything the guest's kernel holds for its filesystems through to its disk
    /// (`sync(2)`), answered with `Done(Response::Synced)`. Only a guest whose disk belongs
    /// to a kernel of its own (a VM) is asked: a jail's disk is synced from the host.
    Sync,
    /// Whether the guest's root filesystem recorded errors, without a sync; answered with
    /// `Done(Response::DiskHealthy)`, or an error naming the failure. Asked after each command
    /// of a raw VM sandbox, whose files need no sync (they do not outlive the machine) but
    /// whose failed disk is still an error of the command, never a silent success.
    DiskHealth,
    /// The room left on the project's package cache disk the guest mounted (a VM task's:
    /// a jail's cache is mounted by its supervisor, which reads it on the host), answered
    /// with `Done(Response::CacheRoom)`; its failures are the disk's (see `DiskHealth`).
    CacheRoom,
    /// A file operation ([`crate::files`]) done as the sandbox user, answered with
    /// `Done(Response::File)` or an error saying why the guest refused it.
    File(crate::files::FileRequest),
    /// Connect to a TCP port on the guest's own loopback (a port forward's connection): the
    /// stream is then a tunnel ([`crate::tunnel`]) carrying that connection's bytes, ended by
    /// either side's `Done` or `Error` (an `Error` first when nothing listens there).
    Connect(ConnectRequest),
    /// Hold the agent's frames after this request's `Done(Response::Pong)` until a `Resume`
    /// or a `Rejoin`: the host saves the guest for a live fork while nothing is in flight on
    /// the channel either way (it sends nothing after this request meanwhile).
    Pause,
    /// The saved guest's own host, after the save: the agent's frames flow again and the
    /// guest's clock is set to the host's (it stood still while the guest was paused);
    /// answered with `Done(Response::Pong)`.
    Resume(ResumeRequest),
    /// Sent on the control stream by the host of a guest resumed from another's save (a live
    /// fork), before anything else: the agent leaves the saved host's session (its commands
    /// run on, their output unread), takes `hostname` and the host's clock (the saved
    /// guest's is behind by the time since the save) and answers with a new `Hello`.
    Rejoin(RejoinRequest),
}

/// See [`Request::Rejoin`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RejoinRequest {
    pub hostname: String,
    /// The host's wall clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

/// See [`Request::Resume`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResumeRequest {
    /// The host's wall clock, milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

/// See [`Request::Connect`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConnectRequest {
    /// The port on the guest's `127.0.0.1` (or `::1` when nothing listens there).
    pub port: u16,
}

/// What the guest side asks for when it opens a stream (its id has [`crate::GUEST_STREAM_BIT`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum GuestRequest {
    /// A connection a guest process made to the egress listener: its bytes follow on
    /// [`channel::TUNNEL`] under the flow control of [`crate::tunnel`].
    Tunnel,
}

/// See [`Request::Egress`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressRequest {
    /// Listen on `127.0.0.1:<port>` and give commands the proxy settings; `None` stops the
    /// listener and removes the settings.
    pub listen_port: Option<u16>,
    /// PEM certificates the guest's TLS clients trust (the system bundle plus the host's
    /// extra CAs), written to a root-owned file that commands' CA variables point at.
    pub ca_bundle: Option<String>,
    /// The host's extra CAs alone (`DYNOCAP_EXTRA_CA`), which the agent adds to the guest's
    /// own system CA bundles, so that TLS clients trust them without any variable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_ca: Option<String>,
    /// The host listens on `127.0.0.1:<listen_port>` in the guest's network itself (a jail's
    /// supervisor, whose socket there carries connections without the agent): the agent gives
    /// commands the proxy settings but binds nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host_listens: bool,
}

/// See [`Request::Clone`]. The secret fields never appear in logs or command lines.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloneRequest {
    /// The repository's URL without credentials: what git is given and what the clone's
    /// `origin` records.
    pub url: String,
    /// The `user[:password]` of an https URL (as written there, percent-encoding and all),
    /// handed to git for this fetch only, through a file only the fetch reads, removed when
    /// the fetch ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// Must not exist or be an empty directory.
    pub dest: String,
    /// `head` (the default branch at depth 1), `branches` (every branch), or `none` (the tree
    /// of the default branch, without a `.git`).
    pub history: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// An OpenSSH private key for an `ssh://` clone, placed where only the fetch reads it and
    /// removed when the fetch ends.
    pub ssh_key: Option<String>,
    /// `known_hosts` lines for an SSH clone's host.
    pub known_hosts: Option<String>,
    pub timeout_ms: u64,
}

impl std::fmt::Debug for CloneRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloneRequest")
            .field("url", &self.url)
            .field("dest", &self.dest)
            .field("history", &self.history)
            .field(
                "credentials",
                &self.credentials.as_ref().map(|_| "<redacted>"),
            )
            .field("ssh_key", &self.ssh_key.as_ref().map(|_| "<redacted>"))
            .field("timeout_ms", &self.timeout_ms)
            .finish_non_exhaustive()
    }
}

/// See [`Request::Unpack`]. The destination must not exist or be an empty directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnpackRequest {
    pub dest: String,
    /// Guest ids that own everything unpacked.
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// Refuse archives whose content exceeds this many bytes.
    pub max_bytes: u64,
}

/// See [`Request::ReceiveFile`]. `name` is a plain file name inside the agent's private
/// state directory (no `/`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReceiveFileRequest {
    pub name: String,
    pub max_bytes: u64,
}

/// See [`Request::Baseline`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BaselineRequest {
    pub workspace: String,
    /// A file received with [`Request::ReceiveFile`] holding the project's history.
    pub bundle: Option<String>,
    /// What HEAD was on the host: `refs/heads/NAME` or a commit id. Ignored without a bundle.
    pub head: Option<String>,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// The project's own ignore rules from its git directory (`info/exclude`), which the
    /// import honoured: the private repository's diffs honour them too. Sent only when set,
    /// so the request stays readable by an agent that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<String>,
}

/// See [`Request::Diff`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiffRequest {
    pub workspace: String,
    /// A patch larger than this is refused with an error instead of being sent.
    pub max_bytes: u64,
    /// The memory one file's line diff may take in the guest; a file whose line diff would
    /// take more is sent as binary. The host gives a share of the sandbox's memory; without
    /// it the agent assumes the smallest sandbox's. Sent only when set, so the request stays
    /// readable by an agent that predates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line_diff_budget: Option<u64>,
    /// Look at every file, not only at what the agent saw change since the last diff: for
    /// the patch that is saved, which must not depend on what a journal can see. Sent only
    /// when set, as above.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub full_scan: bool,
}

/// Run `sh -c command` in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecRequest {
    pub command: String,
    pub cwd: String,
    /// Added to the agent's base environment (PATH, HOME, USER, LANG, TERM).
    pub env: Vec<(String, String)>,
    /// 0 means no deadline.
    pub timeout_ms: u64,
    /// Allocate a 24x80 pseudo-terminal; output then arrives on [`channel::TERMINAL`].
    pub terminal: bool,
    /// Per-channel cap on the bytes sent back; the rest is read and dropped.
    pub output_limit: u64,
    /// Grace period between SIGTERM and SIGKILL when the deadline passes or on cancel.
    pub kill_grace_ms: u64,
    /// Output is flow-controlled ([`crate::exec_window`]): sent only against credit the host
    /// returns as it consumes it. Sent only when set, so other requests stay readable by an
    /// agent that predates it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_window: bool,
}

/// How a stream finished successfully.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Response {
    Pong,
    Exit(ExecExit),
    Unpacked {
        files: u64,
        bytes: u64,
    },
    Received {
        bytes: u64,
    },
    /// The baseline commit in the agent's private repository.
    Baseline {
        commit: String,
    },
    /// The patch was sent in full; `bytes` is its length.
    Diff {
        bytes: u64,
    },
    /// The egress listener's state after an [`EgressRequest`].
    Egress {
        listening: bool,
    },
    /// The clone is in the workspace: the commit checked out, and its branch.
    Cloned {
        commit: String,
        branch: Option<String>,
    },
    /// See [`Request::OomKills`]; `None` for a kernel that does not count them.
    OomKills {
        count: Option<u64>,
    },
    /// See [`Request::Sync`].
    Synced,
    /// See [`Request::DiskHealth`].
    DiskHealthy,
    /// See [`Request::CacheRoom`]; `None` for a guest without a package cache.
    CacheRoom {
        room: Option<CacheRoom>,
    },
    /// See [`Request::File`].
    File(crate::files::FileResult),
}

/// A filesystem's room, as `statvfs` gives it to an unprivileged writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CacheRoom {
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub free_inodes: u64,
}

/// How an exec ended. Output travelled separately as `Data` frames.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecExit {
    pub exit_code: Option<i32>,
    /// Signal name such as `SIGKILL` when the command was killed by a signal.
    pub signal: Option<String>,
    pub timed_out: bool,
    pub cancelled: bool,
    pub duration_ms: u64,
    /// Some output was dropped because a channel reached `output_limit`.
    pub truncated: bool,
}

/// Payload of an `Error` frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ErrorBody {
    pub message: String,
}

/// Encodes a message as a frame payload.
pub fn to_payload<T: Serialize>(message: &T) -> Vec<u8> {
    // Serialising these plain structs cannot fail: no maps with non-string keys, no
    // fallible Serialize impls.
    serde_json::to_vec(message).expect("protocol messages always serialise")
}

/// Decodes a frame payload, naming what was expected when it does not parse.
pub fn from_payload<'a, T: Deserialize<'a>>(
    what: &'static str,
    payload: &'a [u8],
) -> Result<T, crate::error::ProtoError> {
    serde_json::from_slice(payload).map_err(|err| crate::error::ProtoError::BadMessage {
        what,
        detail: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip_and_unknown_fields_refused() {
        let req = Request::Exec(ExecRequest {
            command: "echo hi".into(),
            cwd: "/".into(),
            env: vec![("A".into(), "b".into())],
            timeout_ms: 1000,
            terminal: false,
            output_limit: 10,
            kill_grace_ms: 100,
            output_window: false,
        });
        let bytes = to_payload(&req);
        assert_eq!(from_payload::<Request>("request", &bytes).unwrap(), req);
        let err = from_payload::<Request>("request", br#"{"exec":{"command":"x","bogus":1}}"#);
        assert!(err.is_err());
    }
}
