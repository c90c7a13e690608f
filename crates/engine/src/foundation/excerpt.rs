//! Bounded excerpts of command output: the head and the tail, with a marker saying how much
//! was dropped between them. A build log's first lines say what ran and its last lines say
//! why it failed, so both ends are worth more to a reader (and to a model) than the first
//! megabyte alone. The tail starts at a line: the partial line the cut left at its start is
//! dropped with the rest (counted as omitted) unless the tail has no other line end. The head
//! ends at one likewise, so that no piece of a line reads as a line of its own before the
//! marker (`1` of a cut `12`).

use std::collections::VecDeque;

/// Share of the bound kept from the start; the rest is kept from the end.
const HEAD_SHARE: usize = 4;

/// Keeps the first `max / 4` and the last `max - max / 4` bytes pushed into it.
#[derive(Debug)]
pub struct Excerpt {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    head_cap: usize,
    tail_cap: usize,
    omitted: u64,
    /// The last byte dropped from the tail's front was a line end (or none was dropped): the
    /// tail starts at a line.
    tail_at_line: bool,
}

impl Excerpt {
    pub fn new(max: usize) -> Self {
        let head_cap = max / HEAD_SHARE;
        Self {
            head: Vec::new(),
            tail: VecDeque::new(),
            head_cap,
            tail_cap: max - head_cap,
            omitted: 0,
            tail_at_line: true,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        let room = self.head_cap.saturating_sub(self.head.len());
        let (to_head, rest) = data.split_at(room.min(data.len()));
        self.head.extend_from_slice(to_head);
        if rest.len() >= self.tail_cap {
            let dropped = self.tail.len() + rest.len() - self.tail_cap;
            if dropped > 0 {
                let last = match rest.len() - self.tail_cap {
                    0 => self.tail.back().copied(),
                    kept_from => Some(rest[kept_from - 1]),
                };
                self.tail_at_line = last == Some(b'\n');
            }
            self.omitted += dropped as u64;
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
            return;
        }
        self.tail.extend(rest);
        let excess = self.tail.len().saturating_sub(self.tail_cap);
        if excess > 0 {
            self.tail_at_line = self.tail[excess - 1] == b'\n';
            self.tail.drain(..excess);
            self.omitted += excess as u64;
        }
    }

    /// Whether bytes were dropped.
    pub fn truncated(&self) -> bool {
        self.omitted > 0
    }

    /// The head, a marker line where bytes were dropped, and the tail. The cut edges are moved
    /// to character boundaries (the bytes moved count as omitted), so UTF-8 text stays text,
    /// the head to the end of its last whole line when it holds a line end, and the tail to the
    /// start of a line when it holds a line end before its last byte.
    pub fn into_bytes(self) -> Vec<u8> {
        let Self {
            mut head,
            tail,
            mut omitted,
            tail_at_line,
            ..
        } = self;
        let mut tail: Vec<u8> = tail.into();
        if omitted == 0 {
            head.extend_from_slice(&tail);
            return head;
        }
        let mut partial = incomplete_suffix(&head);
        head.truncate(head.len() - partial);
        if let Some(newline) = head.iter().rposition(|&b| b == b'\n') {
            partial += head.len() - (newline + 1);
            head.truncate(newline + 1);
        }
        let partial_line = match tail_at_line {
            true => 0,
            false => tail[..tail.len().saturating_sub(1)]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(0, |newline| newline + 1),
        };
        let continuation = tail[partial_line..]
            .iter()
            .take(3)
            .take_while(|&&b| b & 0xC0 == 0x80)
            .count();
        tail.drain(..partial_line + continuation);
        omitted += (partial + partial_line + continuation) as u64;
        let marker = marker(omitted);
        // The marker is a line of its own: after a head that ends a line (or is empty) its
        // leading newline would make an empty line that was never output.
        let marker = match head.last() {
            None | Some(b'\n') => &marker[1..],
            Some(_) => &marker[..],
        };
        head.extend_from_slice(marker.as_bytes());
        head.extend_from_slice(&tail);
        head
    }
}

/// `text` cut to at most about `max` bytes the same way (head, marker, tail).
pub fn excerpt_str(text: &str, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text.to_owned(), false);
    }
    let mut excerpt = Excerpt::new(max);
    excerpt.push(text.as_bytes());
    (
        String::from_utf8_lossy(&excerpt.into_bytes()).into_owned(),
        true,
    )
}

/// The line put where bytes were dropped: `[… 1,234,567 bytes omitted …]`.
pub fn marker(omitted: u64) -> String {
    format!("\n[… {} bytes omitted …]\n", thousands(omitted))
}

/// `n` with thousands separators: `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Length of a UTF-8 sequence cut off at the end of `bytes` (0 when it ends cleanly).
fn incomplete_suffix(bytes: &[u8]) -> usize {
    for back in 1..=3.min(bytes.len()) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let needed = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut e = Excerpt::new(100);
        e.push(b"hello ");
        e.push(b"world");
        assert!(!e.truncated());
        assert_eq!(e.into_bytes(), b"hello world");
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_the_count_between() {
        let mut e = Excerpt::new(40);
        for chunk in (0..1000).map(|i| format!("{i:04}\n")) {
            e.push(chunk.as_bytes());
        }
        assert!(e.truncated());
        let text = String::from_utf8(e.into_bytes()).unwrap();
        assert!(text.starts_with("0000\n0001"), "{text}");
        assert!(text.ends_with("0998\n0999\n"), "{text}");
        assert!(text.contains("[… 4,960 bytes omitted …]"), "{text}");
    }

    #[test]
    fn one_huge_push_is_split_too() {
        let mut e = Excerpt::new(8);
        e.push(&[b'x'; 1_000_000]);
        let bytes = e.into_bytes();
        assert!(String::from_utf8_lossy(&bytes).contains("999,992 bytes omitted"));
    }

    #[test]
    fn cuts_land_on_character_boundaries() {
        let mut e = Excerpt::new(16);
        e.push("ééééééééééééééééééé".as_bytes());
        let text = String::from_utf8(e.into_bytes()).expect("still UTF-8");
        assert!(text.starts_with("éé") && text.ends_with("éé"), "{text}");
        let (cut, truncated) = excerpt_str(&"ü".repeat(100), 20);
        assert!(truncated && !cut.contains('\u{FFFD}'), "{cut}");
    }

    #[test]
    fn the_tail_starts_at_a_line() {
        // 100 lines of 9 bytes; a tail of 30 bytes starts 6 bytes into a line.
        let lines: String = (0..100).map(|i| format!("line {i:03}\n")).collect();
        for chunk in [1, 7, 1000] {
            let mut e = Excerpt::new(40);
            for piece in lines.as_bytes().chunks(chunk) {
                e.push(piece);
            }
            let text = String::from_utf8(e.into_bytes()).unwrap();
            let (_, tail) = text.split_once("omitted …]\n").unwrap();
            assert_eq!(
                tail, "line 097\nline 098\nline 099\n",
                "chunks of {chunk}: {text}"
            );
            // Every byte is shown or counted.
            let count: u64 = text
                .split("[… ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .replace(',', "")
                .parse()
                .unwrap();
            // The head ends a line, so the marker has no newline of its own before it.
            let shown = text.len() - (marker(count).len() - 1);
            assert_eq!(shown as u64 + count, lines.len() as u64, "{text}");
            assert!(
                text.starts_with("line 000\n[… "),
                "chunks of {chunk}: {text}"
            );
        }
        // A tail of 36 bytes starts right after a line end: it loses nothing.
        let mut e = Excerpt::new(48);
        e.push(lines.as_bytes());
        let text = String::from_utf8(e.into_bytes()).unwrap();
        assert!(
            text.ends_with("omitted …]\nline 096\nline 097\nline 098\nline 099\n"),
            "{text}"
        );
        // One long line has no line start to move to: its end is kept.
        let mut e = Excerpt::new(16);
        e.push(&[b'x'; 100]);
        e.push(b"\n");
        assert!(e.into_bytes().ends_with(b"xxxxxxxxxxx\n"));
    }

    /// The head ends at its last line end: the piece of the line the cut left (`1` of `12`)
    /// is counted as omitted instead of reading as a line. A head without a line end (one
    /// long line) keeps its bytes, the marker on a line of its own after them.
    #[test]
    fn the_head_ends_at_a_line() {
        let numbers: String = (1..=1000).map(|i| format!("{i}\n")).collect();
        let mut e = Excerpt::new(100);
        e.push(numbers.as_bytes());
        let text = String::from_utf8(e.into_bytes()).unwrap();
        let (head, _) = text.split_once("[… ").unwrap();
        assert_eq!(head, "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n", "{text}");
        assert!(
            !text.contains("\n\n"),
            "no empty line that was not output: {text}"
        );

        let mut e = Excerpt::new(100);
        e.push(&[b'x'; 1000]);
        let text = String::from_utf8(e.into_bytes()).unwrap();
        assert!(
            text.starts_with(&format!("{}\n[… ", "x".repeat(25))),
            "{text}"
        );

        // CRLF lines end at their LF; a cut inside a multibyte character before the last
        // line end is dropped with the partial line.
        let mut e = Excerpt::new(40);
        e.push("é\r\nééééé".repeat(10).as_bytes());
        let text = String::from_utf8(e.into_bytes()).expect("still UTF-8");
        assert!(text.starts_with("é\r\n[… "), "{text}");
    }

    #[test]
    fn counts_read_with_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
