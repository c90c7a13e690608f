//! Guest output on the user's terminal: under a real pseudo-terminal (`script`), `dynocap exec`
//! and `task exec` show escape sequences, C1 and bidi controls as visible text; `--raw` and
//! pipes get the bytes as the guest wrote them.

use std::process::{Command, Stdio};

use dynocap_e2e::*;

/// Prints, on stdout and stderr, one sequence of each class a terminal would act on: OSC 52
/// (clipboard), OSC 0 (title), CSI 2J (clear), a cursor move, DCS, an 8-bit CSI (U+009B) and a
/// right-to-left override (U+202E). Double quotes only: it goes through two shells.
const HOSTILE: &str = "printf \"\\033]52;c;aGk=\\007\\033]0;t\\007\\033[2J\\033[5;5H\
\\033Pq\\033\\\\\\\\\\302\\233x\\342\\200\\256y\\n\"; printf \"\\033]2;e\\007\\n\" >&2";

/// The bytes a terminal receives from `dynocap SUBCOMMAND NAME [FLAGS] -- HOSTILE`.
fn under_pty(home: &TestHome, subcommand: &[&str], flags: &[&str]) -> Vec<u8> {
    let mut line = format!("'{}'", dynocap_bin().display());
    for word in subcommand.iter().chain(flags) {
        line.push_str(&format!(" '{word}'"));
    }
    line.push_str(&format!(" -- '{HOSTILE}'"));
    let out = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("DYNOCAP_HOME", home.path())
        .env_remove("DYNOCAP_BACKEND")
        .stdin(Stdio::null())
        .output()
        .expect("run script(1) from util-linux");
    assert!(
        out.status.success(),
        "{line} failed under a pty: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    out.stdout
}

fn assert_neutralised(seen: &[u8]) {
    let text = String::from_utf8_lossy(seen);
    for (bad, what) in [
        (&b"\x1b"[..], "ESC"),
        (b"\x07", "BEL"),
        (b"\xc2\x9b", "8-bit CSI"),
        (b"\xe2\x80\xae", "RLO"),
    ] {
        assert!(
            !seen.windows(bad.len()).any(|w| w == bad),
            "{what} reached the terminal: {text:?}"
        );
    }
    for visible in [
        "^[]52;c;aGk=^G^[]0;t^G^[[2J^[[5;5H^[Pq^[\\<U+009B>x<U+202E>y\r\n",
        "^[]2;e^G\r\n",
    ] {
        assert!(text.contains(visible), "{visible:?} not in {text:?}");
    }
}

#[test]
fn exec_output_is_neutralised_on_a_terminal_and_exact_elsewhere() {
    if !require_root("exec_output_is_neutralised_on_a_terminal_and_exact_elsewhere") {
        return;
    }
    let home = TestHome::new();
    home.sandbox("tty", &[]);
    assert_neutralised(&under_pty(&home, &["exec", "tty"], &[]));

    // --raw: the bytes as they came, escape sequences included.
    let raw = under_pty(&home, &["exec", "tty"], &["--raw"]);
    let osc52 = b"\x1b]52;c;aGk=\x07";
    assert!(
        raw.windows(osc52.len()).any(|w| w == osc52),
        "--raw changed the output: {:?}",
        String::from_utf8_lossy(&raw)
    );

    // A pipe gets every byte unchanged.
    let piped = home
        .command()
        .args(["exec", "tty", "--", HOSTILE])
        .output()
        .expect("spawn dynocap exec");
    assert_eq!(
        piped.stdout,
        b"\x1b]52;c;aGk=\x07\x1b]0;t\x07\x1b[2J\x1b[5;5H\x1bPq\x1b\\\xc2\x9bx\xe2\x80\xaey\n"
    );
    assert_eq!(piped.stderr, b"\x1b]2;e\x07\n");
}

#[test]
fn task_exec_output_is_neutralised_on_a_terminal() {
    if !require_root("task_exec_output_is_neutralised_on_a_terminal") {
        return;
    }
    let home = TestHome::new();
    let project = tempfile::tempdir().expect("project dir");
    write(&project.path().join("README"), "hi\n");
    let path = project.path().to_str().expect("utf-8 temp path");
    home.json(&[
        "task",
        "start",
        path,
        "--name",
        "ttytask",
        "--history",
        "none",
    ]);
    assert_neutralised(&under_pty(&home, &["task", "exec", "ttytask"], &[]));
    home.json(&["rm", "--force", "--purge", "ttytask"]);
}
