//! The request a `sudo` client sends the broker, as bytes: the wire format in the module doc
//! of `sudo`. Bounded, and checked field by field on the way in.

/// The first field of every request; a broker refuses any other.
pub(super) const VERSION: &[u8] = b"dynocap-sudo-2";
/// Largest request: arguments, environment and assignments together.
pub(super) const MAX_REQUEST: usize = 1 << 20;

/// Why a request cannot be sent.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum EncodeError {
    #[error("an argument is too long")]
    FieldTooLong,
    #[error("the arguments and environment are {0} bytes, more than the {MAX_REQUEST} allowed")]
    TooLarge(usize),
}

/// Why a request's bytes are not a request: what the broker tells the caller.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("truncated field length")]
    TruncatedLength,
    #[error("truncated field")]
    TruncatedField,
    #[error("unknown request version")]
    Version,
    #[error("no working directory")]
    NoCwd,
    #[error("no {0} count")]
    NoCount(&'static str),
    #[error("bad {0} count")]
    BadCount(&'static str),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("no command")]
    NoCommand,
    #[error(transparent)]
    Assignment(#[from] AssignmentError),
}

/// Why a `VAR=value` word before the command cannot set a variable: the client refuses it
/// before sending, and the broker again (any guest process may write to its socket).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum AssignmentError {
    #[error(
        "{0:?} is not a valid environment variable name: in VAR=value, VAR is ASCII letters, \
         digits and underscores, not starting with a digit"
    )]
    BadName(String),
    #[error("the value of {0} contains a NUL byte")]
    Nul(String),
}

/// Checks one `VAR=value` assignment: `VAR` a POSIX environment variable name
/// (`[A-Za-z_][A-Za-z0-9_]*`), the value anything but NUL.
pub(super) fn check_assignment(word: &[u8]) -> Result<(), AssignmentError> {
    let (name, value) = match word.iter().position(|b| *b == b'=') {
        Some(eq) => (&word[..eq], &word[eq + 1..]),
        None => (word, &[][..]),
    };
    let lossy = || String::from_utf8_lossy(name).into_owned();
    let valid = name
        .first()
        .is_some_and(|b| b.is_ascii_alphabetic() || *b == b'_')
        && name.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && word.contains(&b'=');
    if !valid {
        return Err(AssignmentError::BadName(lossy()));
    }
    if value.contains(&0) {
        return Err(AssignmentError::Nul(lossy()));
    }
    Ok(())
}

/// The whole request: its total length, then each field with its length.
pub(super) fn encode(fields: &[&[u8]]) -> Result<Vec<u8>, EncodeError> {
    let mut body = Vec::new();
    for field in fields {
        let len = u32::try_from(field.len()).map_err(|_| EncodeError::FieldTooLong)?;
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(field);
    }
    if body.len() > MAX_REQUEST {
        return Err(EncodeError::TooLarge(body.len()));
    }
    // Below MAX_REQUEST, so it fits.
    let total = u32::try_from(body.len()).map_err(|_| EncodeError::TooLarge(body.len()))?;
    let mut out = total.to_le_bytes().to_vec();
    out.extend_from_slice(&body);
    Ok(out)
}

/// A decoded request: where, what and with which environment.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Request {
    pub cwd: Vec<u8>,
    pub argv: Vec<Vec<u8>>,
    /// The caller's environment, which the broker makes root's.
    pub env: Vec<Vec<u8>>,
    /// `VAR=value` words given before the command, each checked by [`check_assignment`]:
    /// they override the root environment.
    pub assignments: Vec<Vec<u8>>,
}

/// Parses a request's body (after its length), refusing anything malformed.
pub(super) fn decode(body: &[u8]) -> Result<Request, DecodeError> {
    let mut fields = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or(DecodeError::TruncatedLength)?;
        // A field longer than the address space cannot be in the body either.
        let len = usize::try_from(u32::from_le_bytes(*len)).unwrap_or(usize::MAX);
        let (field, tail) = tail
            .split_at_checked(len)
            .ok_or(DecodeError::TruncatedField)?;
        fields.push(field.to_vec());
        rest = tail;
    }
    let mut fields = fields.into_iter();
    if fields.next().as_deref() != Some(VERSION) {
        return Err(DecodeError::Version);
    }
    let cwd = fields.next().ok_or(DecodeError::NoCwd)?;
    let mut counted = |what: &'static str| -> Result<Vec<Vec<u8>>, DecodeError> {
        let count: usize = std::str::from_utf8(&fields.next().ok_or(DecodeError::NoCount(what))?)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or(DecodeError::BadCount(what))?;
        (0..count)
            .map(|_| fields.next().ok_or(DecodeError::Missing(what)))
            .collect()
    };
    let argv = counted("argument")?;
    let env = counted("environment")?;
    let assignments = counted("assignment")?;
    if argv.is_empty() {
        return Err(DecodeError::NoCommand);
    }
    for assignment in &assignments {
        check_assignment(assignment)?;
    }
    Ok(Request {
        cwd,
        argv,
        env,
        assignments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let request = encode(&[
            VERSION,
            b"/work",
            b"2",
            b"id",
            b"-u",
            b"1",
            b"A=b",
            b"2",
            b"DEBIAN_FRONTEND=noninteractive",
            b"_x1=a=b c",
        ])
        .expect("encode");
        let body = &request[4..];
        assert_eq!(
            u32::from_le_bytes(request[..4].try_into().expect("4 bytes")) as usize,
            body.len()
        );
        assert_eq!(
            decode(body),
            Ok(Request {
                cwd: b"/work".to_vec(),
                argv: vec![b"id".to_vec(), b"-u".to_vec()],
                env: vec![b"A=b".to_vec()],
                assignments: vec![
                    b"DEBIAN_FRONTEND=noninteractive".to_vec(),
                    b"_x1=a=b c".to_vec()
                ],
            })
        );
        for bad in [
            encode(&[b"other-1", b"/", b"1", b"id", b"0"]),
            encode(&[VERSION, b"/", b"3", b"id", b"0"]),
            encode(&[VERSION, b"/", b"0", b"0", b"0"]),
            encode(&[VERSION, b"/", b"x"]),
            encode(&[VERSION, b"/", b"1", b"id", b"0"]),
            encode(&[VERSION, b"/", b"1", b"id", b"0", b"1", b"1A=b"]),
        ] {
            let bad = bad.expect("encode");
            assert!(decode(&bad[4..]).is_err());
        }
        assert!(decode(&body[..body.len() - 1]).is_err());
        // What the caller reads for each, as it always read it.
        let refusal = |fields: &[&[u8]]| {
            let request = encode(fields).expect("encode");
            decode(&request[4..]).expect_err("refused").to_string()
        };
        assert_eq!(
            refusal(&[b"other-1", b"/", b"1", b"id", b"0"]),
            "unknown request version"
        );
        assert_eq!(
            refusal(&[VERSION, b"/", b"3", b"id", b"0"]),
            "missing argument"
        );
        assert_eq!(refusal(&[VERSION, b"/", b"0", b"0", b"0"]), "no command");
        assert_eq!(refusal(&[VERSION, b"/", b"x"]), "bad argument count");
        assert_eq!(
            refusal(&[VERSION, b"/", b"1", b"id"]),
            "no environment count"
        );
        assert_eq!(
            refusal(&[VERSION, b"/", b"1", b"id", b"0"]),
            "no assignment count"
        );
        // A caller writing to the socket itself meets the client's checks again.
        for (word, message) in [
            (
                &b"1A=b"[..],
                "\"1A\" is not a valid environment variable name",
            ),
            (b"A-B=c", "\"A-B\" is not a valid environment variable name"),
            (b"A", "\"A\" is not a valid environment variable name"),
            (b"=x", "\"\" is not a valid environment variable name"),
            (b"A=x\0y", "the value of A contains a NUL byte"),
        ] {
            let text = refusal(&[VERSION, b"/", b"1", b"id", b"0", b"1", word]);
            assert!(text.starts_with(message), "{word:?}: {text}");
        }
        assert_eq!(
            decode(&body[..body.len() - 1]),
            Err(DecodeError::TruncatedField)
        );
        assert_eq!(decode(&[1, 0]), Err(DecodeError::TruncatedLength));
        let big = vec![b'x'; MAX_REQUEST];
        assert_eq!(
            encode(&[VERSION, &big]).expect_err("too large").to_string(),
            format!(
                "the arguments and environment are {} bytes, more than the {MAX_REQUEST} allowed",
                MAX_REQUEST + VERSION.len() + 8
            )
        );
    }
}
