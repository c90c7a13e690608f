//! Redaction of text that crosses the channel in messages both sides show to people: a clone
//! URL may carry a token (`https://user:token@host/…`), and git repeats the URL in its errors.

/// Replaces the user-info part of every URL in `text` (`https://user:token@host` →
/// `https://***@host`), so a token in a clone URL never reaches a message or a log.
pub fn strip_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#' | '\'' | '"') || c.is_whitespace())
            .unwrap_or(tail.len());
        match tail[..end].rfind('@') {
            Some(user_end) => {
                out.push_str("***");
                out.push_str(&tail[user_end..end]);
            }
            None => out.push_str(&tail[..end]),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userinfo_is_stripped_from_every_url() {
        assert_eq!(
            strip_userinfo(
                "fatal: repository 'https://me:ghp_secret@github.com/a/b.git/' not found"
            ),
            "fatal: repository 'https://***@github.com/a/b.git/' not found"
        );
        assert_eq!(
            strip_userinfo("ssh://git@host/x and https://tok@h2/y"),
            "ssh://***@host/x and https://***@h2/y"
        );
        assert_eq!(strip_userinfo("https://host/a@b"), "https://host/a@b");
        assert_eq!(strip_userinfo("no url here"), "no url here");
    }
}
