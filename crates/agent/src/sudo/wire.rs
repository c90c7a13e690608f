//! The request a `sudo` client sends the broker, as bytes: the wire format in the module doc
//! of `sudo`. Bounded, and checked field by field on the way in.

/// The first field of every request; a broker refuses any other.
pub(super) const VERSION: &[u8] = b"dynocap-sudo-1";
/// Largest request: arguments and environment together.
pub(super) const MAX_REQUEST: usize = 1 << 20;

/// The whole request: its total length, then each field with its length.
pub(super) fn encode(fields: &[&[u8]]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    for field in fields {
        let len = u32::try_from(field.len()).map_err(|_| "an argument is too long".to_owned())?;
        body.extend_from_slice(&len.to_le_bytes());
        body.extend_from_slice(field);
    }
    if body.len() > MAX_REQUEST {
        return Err(format!(
            "the arguments and environment are {} bytes, more than the {MAX_REQUEST} allowed",
            body.len()
        ));
    }
    let total = u32::try_from(body.len()).map_err(|_| "request too long".to_owned())?;
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
pub(super) fn decode(body: &[u8]) -> Result<Request, String> {
    let mut fields = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (len, tail) = rest.split_at_checked(4).ok_or("truncated field length")?;
        let len = usize::try_from(u32::from_le_bytes(
            len.try_into().map_err(|_| "bad length")?,
        ))
        .map_err(|_| "bad length")?;
        let (field, tail) = tail.split_at_checked(len).ok_or("truncated field")?;
        fields.push(field.to_vec());
        rest = tail;
    }
    let mut fields = fields.into_iter();
    if fields.next().as_deref() != Some(VERSION) {
        return Err("unknown request version".into());
    }
    let cwd = fields.next().ok_or("no working directory")?;
    let mut counted = |what: &str| -> Result<Vec<Vec<u8>>, String> {
        let count: usize = std::str::from_utf8(&fields.next().ok_or(format!("no {what} count"))?)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or(format!("bad {what} count"))?;
        (0..count)
            .map(|_| fields.next().ok_or(format!("missing {what}")))
            .collect()
    };
    let argv = counted("argument")?;
    let env = counted("environment")?;
    if argv.is_empty() {
        return Err("no command".into());
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
    }
}
