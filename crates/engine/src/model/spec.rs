//! Requests as a caller states them, their defaults and ranges (docs/mcp.md), and
//! the validation that refuses bad values with a message naming the parameter and the fix.
//! Values out of range are refused, never clamped.

use serde::{Deserialize, Serialize};

use crate::foundation::error::{Coded, Error, ErrorCode, Result};
use crate::foundation::terms::Param;

pub const TTL_MIN: u64 = 30;
pub const TTL_MAX: u64 = 86_400;
pub const TTL_DEFAULT: u64 = 1_800;
pub const CPUS_MIN: u32 = 1;
pub const CPUS_MAX: u32 = 64;
pub const RAW_CPUS_DEFAULT: u32 = 1;
pub const TASK_CPUS_DEFAULT: u32 = 2;
pub const MEMORY_MB_MIN: u64 = 64;
pub const MEMORY_MB_MAX: u64 = 1_048_576;
pub const MEMORY_MB_DEFAULT: u64 = 1_024;
/// The sandbox's disk (its writable layer): bytes and inodes (one per 16 KiB).
pub const DISK_MB_MIN: u64 = 64;
pub const DISK_MB_MAX: u64 = 1_048_576;
pub const DISK_MB_DEFAULT: u64 = 2_048;
/// Process count cap per sandbox: stops fork bombs while leaving room for real builds.
pub const PIDS_LIMIT: u64 = 1_024;

pub const EXEC_TIMEOUT_DEFAULT: u64 = 30;
pub const EXEC_TIMEOUT_MAX: u64 = 86_400;
/// Bytes of stdout and of stderr returned per exec; the rest is dropped and `truncated` set.
pub const EXEC_OUTPUT_LIMIT: u64 = 1024 * 1024;
pub const EXEC_KILL_GRACE_MS: u64 = 2_000;
/// Longest `KEY=VALUE` of an exec's environment: the kernel refuses any single environment
/// string of `MAX_ARG_STRLEN` (128 KiB, its NUL included) or more.
pub const EXEC_ENV_ENTRY_MAX: usize = 32 * 4096 - 1;
/// All of an exec's environment entries together: with the longest command, far below what
/// `execve` accepts (a quarter of the stack limit: 2 MiB by default).
pub const EXEC_ENV_TOTAL_MAX: usize = 256 * 1024;
/// Longest working directory (`PATH_MAX` with its NUL).
pub const EXEC_CWD_MAX: usize = 4095;
/// Room an exec request takes in its agent frame besides the command, cwd and environment
/// (field names, numbers, framing).
const EXEC_REQUEST_OVERHEAD: usize = 4096;

/// Network modes of the spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    None,
    Filtered,
    Nat,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Filtered => "filtered",
            Self::Nat => "nat",
        }
    }

    pub fn parse(value: &str) -> Result<Self> {
        match value {
            "none" => Ok(Self::None),
            "filtered" => Ok(Self::Filtered),
            "nat" => Ok(Self::Nat),
            other => Err(Error::invalid(format!(
                "network \"{other}\" is not a network mode; use \"none\", \"filtered\" or \"nat\""
            ))),
        }
    }
}

/// Parameters of `dynocap run` / `dynocap_run`, defaults already applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    pub name: String,
    pub network: Network,
    pub ttl_seconds: u64,
    pub cpus: u32,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(rename = "diskMB")]
    pub disk_mb: u64,
    /// Hosts a `filtered` sandbox may also reach (`--allow-host`), beyond the operator's list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_hosts: Vec<String>,
    /// The image to boot (`--image`); `None`: `DYNOCAP_IMAGE`, else `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The backend to boot on (`--backend`); `None`: `DYNOCAP_BACKEND`, else `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::model::backend_choice::BackendChoice>,
    /// The built image whose kernel a vm boots (`--kernel`); `None`: the image's own, else
    /// the newest image's that has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

impl RunSpec {
    /// Applies the raw-sandbox defaults to whatever the caller left out, then validates.
    pub fn raw(
        name: &str,
        network: Option<&str>,
        ttl_seconds: Option<u64>,
        cpus: Option<u64>,
        memory_mb: Option<u64>,
        disk_mb: Option<u64>,
    ) -> Result<Self> {
        validate_name(name)?;
        let resources = Resources::new(
            network,
            ttl_seconds,
            cpus,
            memory_mb,
            disk_mb,
            RAW_CPUS_DEFAULT,
        )?;
        Ok(Self {
            name: name.to_owned(),
            network: resources.network,
            ttl_seconds: resources.ttl_seconds,
            cpus: resources.cpus,
            memory_mb: resources.memory_mb,
            disk_mb: resources.disk_mb,
            allow_hosts: Vec::new(),
            image: None,
            backend: None,
            kernel: None,
        })
    }
}

/// What every sandbox (raw or task) is given, defaults applied and every value checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub network: Network,
    pub ttl_seconds: u64,
    pub cpus: u32,
    pub memory_mb: u64,
    /// MiB of disk for the sandbox's writable layer.
    pub disk_mb: u64,
}

impl Resources {
    /// `default_cpus` differs between raw sandboxes (1) and tasks (2); the rest is shared.
    pub fn new(
        network: Option<&str>,
        ttl_seconds: Option<u64>,
        cpus: Option<u64>,
        memory_mb: Option<u64>,
        disk_mb: Option<u64>,
        default_cpus: u32,
    ) -> Result<Self> {
        Ok(Self {
            network: network
                .map(Network::parse)
                .transpose()?
                .unwrap_or(Network::None),
            ttl_seconds: check_range(
                Param::TtlSeconds,
                ttl_seconds.unwrap_or(TTL_DEFAULT),
                TTL_MIN,
                TTL_MAX,
            )?,
            cpus: check_cpus(cpus.unwrap_or(u64::from(default_cpus)))?,
            memory_mb: check_range(
                Param::MemoryMb,
                memory_mb.unwrap_or(MEMORY_MB_DEFAULT),
                MEMORY_MB_MIN,
                MEMORY_MB_MAX,
            )?,
            disk_mb: check_range(
                Param::DiskMb,
                disk_mb.unwrap_or(DISK_MB_DEFAULT),
                DISK_MB_MIN,
                DISK_MB_MAX,
            )?,
        })
    }
}

fn check_cpus(cpus: u64) -> Result<u32> {
    let cpus = check_range(Param::Cpus, cpus, u64::from(CPUS_MIN), u64::from(CPUS_MAX))?;
    u32::try_from(cpus).map_err(|_| Error::invalid("cpus is out of range"))
}

/// Refuses `value` outside `min..=max`, naming the parameter (as the reader knows it) and the
/// range.
pub fn check_range(param: Param, value: u64, min: u64, max: u64) -> Result<u64> {
    let bound = if value < min {
        format!("below the minimum {min}")
    } else if value > max {
        format!("above the maximum {max}")
    } else {
        return Ok(value);
    };
    Err(Error::worded(ErrorCode::InvalidArgument, |s| {
        format!(
            "{} {value} is {bound}; use a value from {min} to {max}",
            s.param(param)
        )
    }))
}

/// Sandbox and task names: `[a-z0-9][a-z0-9_.-]{0,62}`. They end up in hostnames, paths and
/// cgroup names, so nothing else is accepted.
pub fn validate_name(name: &str) -> Result<()> {
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() <= 63
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.' || b == b'-'
        });
    if valid && !name.starts_with("task-") && !name.starts_with("sbx-") {
        return Ok(());
    }
    if name.starts_with("task-") || name.starts_with("sbx-") {
        return Err(Error::invalid(format!(
            "name \"{name}\" starts with a prefix reserved for generated ids (task-, sbx-); pick another name"
        )));
    }
    Err(Error::invalid(format!(
        "name {name:?} is not valid: use 1 to 63 characters from a-z, 0-9, '_', '.', '-', starting with a letter or digit"
    )))
}

/// Parameters of an exec (`dynocap exec`, `dynocap_exec`, `dynocap_task_exec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecSpec {
    pub command: String,
    pub cwd: String,
    /// `cwd` was not given, so it is the caller's default: a raw sandbox's image may name
    /// another (its config's `WorkingDir`), which the supervisor then uses instead.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cwd_defaulted: bool,
    pub env: Vec<(String, String)>,
    pub timeout_seconds: u64,
    pub terminal: bool,
    /// Output kept per stream: its head and its tail, with a marker where bytes were dropped
    /// ([`crate::foundation::excerpt`]).
    pub max_output_bytes: u64,
    pub output_encoding: OutputEncoding,
    /// Send progress (time so far, the latest line of output) while the command runs.
    #[serde(default)]
    pub report_progress: bool,
    /// Send every byte of stdout and stderr while the command runs
    /// ([`crate::supervisor::control::ControlReply::Output`]), unbounded; the final result still carries
    /// the bounded excerpt. Not for terminal commands (their transcript is a rendered screen).
    #[serde(default)]
    pub stream_output: bool,
}

/// How output travels in an Exec result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputEncoding {
    /// Text; bytes that are not UTF-8 become U+FFFD.
    #[default]
    Utf8,
    /// The bytes as they came, base64-encoded.
    Base64,
}

impl OutputEncoding {
    pub fn parse(value: &str) -> Result<Self> {
        match value {
            "utf8" => Ok(Self::Utf8),
            "base64" => Ok(Self::Base64),
            other => Err(Error::invalid(format!(
                "outputEncoding \"{other}\" is not valid; use \"utf8\" or \"base64\""
            ))),
        }
    }
}

/// What an MCP exec keeps of each stream unless `maxOutputBytes` asks for more: 8 KiB of head
/// and 24 KiB of tail, enough for the error at the end of a long build log.
pub const EXEC_OUTPUT_MCP_DEFAULT: u64 = 32 * 1024;

impl ExecSpec {
    pub fn new(
        command: &str,
        cwd: Option<&str>,
        default_cwd: &str,
        env: Vec<(String, String)>,
        timeout_seconds: Option<u64>,
        terminal: bool,
    ) -> Result<Self> {
        if command.trim().is_empty() {
            return Err(Error::invalid(
                "command is empty; give the shell command to run",
            ));
        }
        if command.len() > dynocap_proto::MAX_COMMAND_LEN {
            return Err(Error::invalid(format!(
                "command is {} bytes; the limit is {} bytes (256 KiB): put long scripts in a \
                 file in the sandbox and run that",
                command.len(),
                dynocap_proto::MAX_COMMAND_LEN
            )));
        }
        if command.contains('\0') {
            return Err(Error::invalid("command contains a NUL byte"));
        }
        let cwd_defaulted = cwd.is_none();
        let cwd = cwd.unwrap_or(default_cwd);
        if !cwd.starts_with('/') || cwd.contains('\0') {
            return Err(Error::invalid(format!(
                "cwd {cwd:?} must be an absolute path inside the sandbox, such as {default_cwd}"
            )));
        }
        if cwd.len() > EXEC_CWD_MAX {
            return Err(Error::invalid(format!(
                "cwd is {} bytes; the limit is {EXEC_CWD_MAX} bytes (PATH_MAX)",
                cwd.len()
            )));
        }
        for (key, value) in &env {
            let key_ok = !key.is_empty()
                && !key.starts_with(|c: char| c.is_ascii_digit())
                && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !key_ok {
                return Err(Error::invalid(format!(
                    "env key {key:?} is not a valid variable name (letters, digits and '_', not starting with a digit)"
                )));
            }
            if value.contains('\0') {
                return Err(Error::invalid(format!(
                    "env value of {key} contains a NUL byte"
                )));
            }
            let entry = key.len() + 1 + value.len();
            if entry > EXEC_ENV_ENTRY_MAX {
                return Err(Error::invalid(format!(
                    "env {key} is {entry} bytes as KEY=VALUE; the limit is {EXEC_ENV_ENTRY_MAX} \
                     bytes per variable (the kernel's): put the value in a file in the sandbox"
                )));
            }
        }
        let env_total: usize = env.iter().map(|(k, v)| k.len() + 1 + v.len()).sum();
        if env_total > EXEC_ENV_TOTAL_MAX {
            return Err(Error::invalid(format!(
                "env is {env_total} bytes in all (as KEY=VALUE); the limit is \
                 {EXEC_ENV_TOTAL_MAX} bytes: put large values in files in the sandbox"
            )));
        }
        // Each within its limit, the three must still fit in one request to the agent once
        // JSON-encoded, where a control character takes six bytes.
        let encoded = serde_json::to_vec(&(command, cwd, &env))
            .map_err(SpecFailure::EncodeExec)?
            .len();
        let room = dynocap_proto::MAX_FRAME_LEN - EXEC_REQUEST_OVERHEAD;
        if encoded > room {
            return Err(Error::invalid(format!(
                "command, cwd and env take {encoded} bytes once encoded for the sandbox (each \
                 control character takes 6); the limit is {room}: put long scripts in a file in \
                 the sandbox"
            )));
        }
        let timeout_seconds = check_range(
            Param::TimeoutSeconds,
            timeout_seconds.unwrap_or(EXEC_TIMEOUT_DEFAULT),
            1,
            EXEC_TIMEOUT_MAX,
        )?;
        Ok(Self {
            command: command.to_owned(),
            cwd: cwd.to_owned(),
            cwd_defaulted,
            env,
            timeout_seconds,
            terminal,
            max_output_bytes: EXEC_OUTPUT_LIMIT,
            output_encoding: OutputEncoding::Utf8,
            report_progress: false,
            stream_output: false,
        })
    }

    /// Sets how much output per stream the result keeps (`maxOutputBytes`, 1 to 1 MiB) and
    /// how it is encoded.
    pub fn with_output(mut self, max_output_bytes: u64, encoding: OutputEncoding) -> Result<Self> {
        self.max_output_bytes = check_range(
            Param::MaxOutputBytes,
            max_output_bytes,
            1,
            EXEC_OUTPUT_LIMIT,
        )?;
        self.output_encoding = encoding;
        Ok(self)
    }
}

/// What failed checking a spec, other than the spec being wrong (that is `invalid_argument`,
/// said where it is found).
#[derive(Debug, thiserror::Error)]
enum SpecFailure {
    #[error("encoding the exec request: {0}")]
    EncodeExec(#[source] serde_json::Error),
}

impl Coded for SpecFailure {
    fn code(&self) -> ErrorCode {
        match self {
            Self::EncodeExec(_) => ErrorCode::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "web-1", "x.y_z", "0abc", &"a".repeat(63)] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "",
            "-a",
            "A",
            "a b",
            "a/b",
            "é",
            &"a".repeat(64),
            "task-x",
            "sbx-1",
            "_x",
            ".x",
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ttl_edges_and_defaults() {
        let spec = RunSpec::raw("a", None, None, None, None, None).unwrap();
        assert_eq!(
            (spec.ttl_seconds, spec.cpus, spec.memory_mb),
            (1800, 1, 1024)
        );
        assert_eq!(spec.network, Network::None);
        assert!(RunSpec::raw("a", None, Some(30), None, None, None).is_ok());
        assert!(RunSpec::raw("a", None, Some(86_400), None, None, None).is_ok());
        let low = RunSpec::raw("a", None, Some(29), None, None, None).unwrap_err();
        assert_eq!(low.code, crate::ErrorCode::InvalidArgument);
        assert!(low.message.contains("ttl_seconds 29"), "{low}");
        assert_eq!(
            low.words.as_ref().map(|w| w[0].clone()),
            Some(crate::terms::Piece::Param(Param::TtlSeconds))
        );
        assert!(RunSpec::raw("a", None, Some(86_401), None, None, None).is_err());
        assert!(RunSpec::raw("a", None, None, Some(0), None, None).is_err());
        assert!(RunSpec::raw("a", Some("wifi"), None, None, None, None).is_err());
    }

    #[test]
    fn disk_edges_and_default() {
        let spec = RunSpec::raw("a", None, None, None, None, None).unwrap();
        assert_eq!(spec.disk_mb, 2_048);
        assert!(RunSpec::raw("a", None, None, None, None, Some(64)).is_ok());
        assert!(RunSpec::raw("a", None, None, None, None, Some(1_048_576)).is_ok());
        let low = RunSpec::raw("a", None, None, None, None, Some(63)).unwrap_err();
        assert_eq!(low.code, crate::ErrorCode::InvalidArgument);
        assert!(low.message.contains("disk_mb 63"), "{low}");
        assert!(RunSpec::raw("a", None, None, None, None, Some(1_048_577)).is_err());
    }

    #[test]
    fn exec_validation() {
        let spec = ExecSpec::new("true", None, "/", vec![], None, false).unwrap();
        assert_eq!((spec.cwd.as_str(), spec.timeout_seconds), ("/", 30));
        assert!(ExecSpec::new("", None, "/", vec![], None, false).is_err());
        assert!(ExecSpec::new("true", Some("rel"), "/", vec![], None, false).is_err());
        assert!(ExecSpec::new(
            "true",
            None,
            "/",
            vec![("A=B".into(), "x".into())],
            None,
            false
        )
        .is_err());
        assert!(ExecSpec::new("true", None, "/", vec![], Some(0), false).is_err());
    }

    /// Every size limit is inclusive and named in the refusal.
    #[test]
    fn exec_size_limits() {
        let max = dynocap_proto::MAX_COMMAND_LEN;
        let exec = |command: &str, cwd: Option<&str>, env: Vec<(String, String)>| {
            ExecSpec::new(command, cwd, "/", env, None, false)
        };
        assert!(exec(&"x".repeat(max), None, vec![]).is_ok());
        let long = exec(&"x".repeat(max + 1), None, vec![]).unwrap_err();
        assert_eq!(long.code, crate::ErrorCode::InvalidArgument);
        assert!(long.message.contains("limit is 262144 bytes"), "{long}");

        let value = |len: usize| vec![("V".to_owned(), "v".repeat(len))];
        assert!(exec("true", None, value(EXEC_ENV_ENTRY_MAX - 2)).is_ok());
        let big = exec("true", None, value(EXEC_ENV_ENTRY_MAX - 1)).unwrap_err();
        assert!(big.message.contains("131071 bytes per variable"), "{big}");
        let many: Vec<_> = (0..3)
            .map(|i| (format!("V{i}"), "v".repeat(100_000)))
            .collect();
        let total = exec("true", None, many).unwrap_err();
        assert!(total.message.contains("limit is 262144 bytes"), "{total}");

        let cwd = format!("/{}", "d".repeat(EXEC_CWD_MAX));
        let deep = exec("true", Some(&cwd), vec![]).unwrap_err();
        assert!(deep.message.contains("PATH_MAX"), "{deep}");

        // Control characters are short to count but six bytes each on the wire.
        let controls = exec(&"\u{1}".repeat(max), None, vec![]).unwrap_err();
        assert!(controls.message.contains("once encoded"), "{controls}");
        // The longest command of characters JSON doubles, with a full environment, still fits.
        let full: Vec<_> = ["A", "B"]
            .iter()
            .map(|k| ((*k).to_owned(), "v".repeat(EXEC_ENV_TOTAL_MAX / 2 - 3)))
            .collect();
        assert!(exec(&"\"".repeat(max), None, full).is_ok());
    }
}
