//! Guest output on the user's terminal. What a command in a sandbox prints is hostile data: a
//! terminal obeys escape sequences in it, which can write the clipboard (OSC 52), retitle the
//! window, clear the screen or move the cursor to paint over what the user reads, and bidi
//! controls reorder text on screen. When a stream is a terminal, every control character is
//! shown as visible text instead; pipes and files get the bytes unchanged (`exec --raw` asks
//! for them on a terminal too).
//!
//! Colours (SGR) are neutralised like the rest: telling a harmless SGR from the rest means
//! parsing every terminal's dialect, and a single mistake hands the guest the terminal.
//!
//! Streamed output arrives in pieces cut anywhere; [`Neutraliser`] carries what a cut splits
//! (a UTF-8 character, a CR whose LF is in the next piece) so the result is the same as for
//! the whole text at once.

use std::fmt::Write;

/// `text` with every character a terminal would act on rendered visibly: C0 controls and DEL in
/// caret notation (`ESC` is `^[`, so OSC 52 shows as `^[]52;...`), C1 controls and bidi
/// controls as `<U+XXXX>`. Kept: printable text, newline, tab, and a carriage return directly
/// before a newline (CRLF line ends, as a pseudo-terminal writes them). A lone carriage return
/// would let later text overwrite earlier text on the same line, so it is shown as `^M`.
pub fn neutralise(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' | '\t' => out.push(c),
            '\r' if chars.peek() == Some(&'\n') => out.push(c),
            '\u{0}'..='\u{1f}' => {
                out.push('^');
                out.push(char::from(c as u8 ^ 0x40));
            }
            '\u{7f}' => out.push_str("^?"),
            c if is_c1(c) || is_bidi_control(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "<U+{:04X}>", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

/// [`neutralise`] for text that arrives in pieces of bytes. Escape sequences need no carrying:
/// each control character is rendered on its own, so a sequence split over two pieces comes
/// out as it would whole.
#[derive(Debug, Default)]
pub struct Neutraliser {
    /// The start of a UTF-8 character the last piece ended in the middle of (at most 3 bytes).
    partial: Vec<u8>,
    /// The last piece ended with CR: kept only if the next one starts with LF.
    carriage_return: bool,
}

impl Neutraliser {
    /// The neutralised text of `bytes`, minus what waits for the next piece. Bytes that are not
    /// UTF-8 become U+FFFD, as `String::from_utf8_lossy` makes them.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        let mut pending = std::mem::take(&mut self.partial);
        pending.extend_from_slice(bytes);
        let mut text = String::with_capacity(pending.len() + 1);
        if std::mem::take(&mut self.carriage_return) {
            text.push('\r');
        }
        let mut rest = &pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(valid) => {
                    text.push_str(valid);
                    break;
                }
                Err(err) => {
                    let (valid, after) = rest.split_at(err.valid_up_to());
                    // `valid_up_to` marks the end of the longest valid prefix.
                    text.push_str(std::str::from_utf8(valid).expect("checked valid prefix"));
                    match err.error_len() {
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[bad..];
                        }
                        // Cut inside a character: finish it with the next piece.
                        None => {
                            self.partial = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        if text.ends_with('\r') {
            text.pop();
            self.carriage_return = true;
        }
        neutralise(&text)
    }

    /// What is left once the stream ended: a cut character as U+FFFD, a final CR as `^M`.
    pub fn finish(&mut self) -> String {
        let mut text = String::new();
        if std::mem::take(&mut self.carriage_return) {
            text.push('\r');
        }
        if !std::mem::take(&mut self.partial).is_empty() {
            text.push(char::REPLACEMENT_CHARACTER);
        }
        neutralise(&text)
    }
}

/// C1 controls (U+0080..U+009F): terminals in UTF-8 mode may take U+009B as CSI, U+009D as
/// OSC, U+0090 as DCS, and so on.
fn is_c1(c: char) -> bool {
    ('\u{80}'..='\u{9f}').contains(&c)
}

/// Unicode bidirectional controls ("Trojan Source", CVE-2021-42574): they make the terminal
/// show text in an order other than the one it has.
fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}

#[cfg(test)]
mod tests {
    use super::{neutralise, Neutraliser};

    /// Nothing a terminal could act on survives: no C0 but newline, tab and CR before LF, no
    /// DEL, no C1, no bidi control.
    fn assert_inert(out: &str) {
        let mut chars = out.chars().peekable();
        while let Some(c) = chars.next() {
            let ok = match c {
                '\n' | '\t' => true,
                '\r' => chars.peek() == Some(&'\n'),
                c => !c.is_control() && !super::is_bidi_control(c),
            };
            assert!(ok, "{c:?} reached the terminal in {out:?}");
        }
    }

    #[test]
    fn plain_text_newlines_and_tabs_are_kept() {
        let text = "hello\tworld\nsecond line, ünïcödé ✓\r\n";
        assert_eq!(neutralise(text), text);
    }

    #[test]
    fn every_sequence_class_is_rendered_visibly() {
        let cases = [
            // OSC 52 clipboard write, BEL- and ST-terminated.
            (
                "\x1b]52;c;ZWNobyBwd25lZA==\x07",
                "^[]52;c;ZWNobyBwd25lZA==^G",
            ),
            ("\x1b]52;c;eA==\x1b\\", "^[]52;c;eA==^[\\"),
            // Window and icon title.
            ("\x1b]0;pwned\x07", "^[]0;pwned^G"),
            ("\x1b]2;pwned\x07", "^[]2;pwned^G"),
            // Screen clear, cursor moves, SGR colour.
            ("\x1b[2J\x1b[H", "^[[2J^[[H"),
            ("\x1b[10;20H\x1b[3A", "^[[10;20H^[[3A"),
            ("\x1b[31mred\x1b[0m", "^[[31mred^[[0m"),
            // DCS, APC, PM, SOS strings.
            ("\x1bPq#0\x1b\\", "^[Pq#0^[\\"),
            ("\x1b_apc\x1b\\", "^[_apc^[\\"),
            ("\x1b^pm\x1b\\", "^[^pm^[\\"),
            ("\x1bXsos\x1b\\", "^[Xsos^[\\"),
            // C1 controls: 8-bit CSI, OSC, DCS, ST.
            ("\u{9b}2J", "<U+009B>2J"),
            ("\u{9d}0;t\u{9c}", "<U+009D>0;t<U+009C>"),
            ("\u{90}q\u{9c}", "<U+0090>q<U+009C>"),
            // Bidi controls.
            ("a\u{202e}cba\u{202c}", "a<U+202E>cba<U+202C>"),
            ("\u{2066}x\u{2069}\u{200f}", "<U+2066>x<U+2069><U+200F>"),
            // Other C0, DEL, backspace, lone CR.
            ("\x00\x07\x08\x7f", "^@^G^H^?"),
            ("safe\rEVIL", "safe^MEVIL"),
            ("end\r", "end^M"),
        ];
        for (input, expected) in cases {
            let out = neutralise(input);
            assert_eq!(out, expected, "for {input:?}");
            assert_inert(&out);
        }
    }

    #[test]
    fn every_control_character_is_neutralised() {
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        assert_inert(&neutralise(&all));
    }

    /// Every way of cutting `bytes` in two gives what the whole does.
    fn assert_cuts_agree(bytes: &[u8]) {
        let whole = neutralise(&String::from_utf8_lossy(bytes));
        for cut in 0..=bytes.len() {
            let mut n = Neutraliser::default();
            let (a, b) = bytes.split_at(cut);
            let pieces = n.push(a) + &n.push(b) + &n.finish();
            assert_eq!(pieces, whole, "cut at {cut} of {bytes:?}");
        }
    }

    #[test]
    fn pieces_cut_anywhere_come_out_as_the_whole() {
        assert_cuts_agree("é ✓ 😀 ünï".as_bytes());
        assert_cuts_agree(b"\x1b]52;c;eA==\x07 \x1b[2J\xc2\x9b2J \xe2\x80\xaeRLO");
        assert_cuts_agree(b"line\r\nlone\rcr\r");
        assert_cuts_agree(b"bad \xff\xfe utf8 \xe2\x80 cut \xf0\x9f\x98");
    }

    #[test]
    fn a_split_character_and_a_split_crlf_wait_for_their_ends() {
        let mut n = Neutraliser::default();
        assert_eq!(n.push(b"caf\xc3"), "caf");
        assert_eq!(n.push(b"\xa9 \xc2"), "é ");
        // U+009B (8-bit CSI) split over two pieces is still shown as a C1 control.
        assert_eq!(n.push(b"\x9b2J\r"), "<U+009B>2J");
        assert_eq!(n.push(b"\nnext\r"), "\r\nnext");
        assert_eq!(n.push(b"x\xe2\x80"), "^Mx");
        assert_eq!(n.finish(), "\u{FFFD}");
    }
}
