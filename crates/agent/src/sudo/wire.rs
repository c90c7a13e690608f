//! The request a `sudo` client sends the broker, as bytes: the wire format in the module doc
//! of `sudo`. Bounded, and checked field by field on the way in.

/// The first field of every request; a broker refuses any other.
pub(super) const VERSION: &[u8] = b"dynocap-sudo-1";
/// Largest request: arguments and environment together.
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
    pub env: Vec<Vec<u8>>,
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
    if argv.is_empty() {
        return Err(DecodeError::NoCommand);
    }
    Ok(Request { cwd, argv, env })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let request =
            encode(&[VERSION, b"/work", b"2", b"id", b"-u", b"1", b"A=b"]).expect("encode");
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
            })
        );
        for bad in [
            encode(&[b"other-1", b"/", b"1", b"id", b"0"]),
            encode(&[VERSION, b"/", b"3", b"id", b"0"]),
            encode(&[VERSION, b"/", b"0", b"0"]),
            encode(&[VERSION, b"/", b"x"]),
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
        assert_eq!(refusal(&[VERSION, b"/", b"0", b"0"]), "no command");
        assert_eq!(refusal(&[VERSION, b"/", b"x"]), "bad argument count");
        assert_eq!(
            refusal(&[VERSION, b"/", b"1", b"id"]),
            "no environment count"
        );
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
