//! Which names `task apply` takes for the branch it creates: exactly those
//! `git check-ref-format --branch` takes, asked of the repository's own git
//! ([`super::repo::Repo::check_branch_name`]), so that DynoCap and git never disagree about a
//! name. git says only that a name is refused; [`problem`] says which of git's rules it breaks,
//! so the person sees what to change.
//!
//! One name git takes is still refused: `@{-N}`, which git reads as "the branch checked out N
//! switches ago" and expands to that (existing) branch's name. `task apply` creates a branch;
//! a name that stands for another branch is a slip, not a new name.

/// The rule of git's (`git help check-ref-format`, plus the two `--branch` adds) that `name`
/// breaks, as a phrase that completes "it ...". Called for a name git refused: a name that
/// breaks none of the rules listed here is refused for a reason git did not say.
pub fn problem(name: &str) -> String {
    if name.is_empty() {
        return "is empty".to_owned();
    }
    if name == "HEAD" {
        return "is HEAD, which git keeps for the branch checked out".to_owned();
    }
    if name.starts_with('-') {
        return "starts with '-', which git would read as an option".to_owned();
    }
    if let Some(c) = name.chars().find(|c| c.is_ascii_control()) {
        return format!("contains the control character {}", c.escape_default());
    }
    if let Some(c) = name
        .chars()
        .find(|c| matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\'))
    {
        return match c {
            ' ' => "contains a space".to_owned(),
            _ => format!("contains '{c}' (git refuses space ~ ^ : ? * [ \\ in names)"),
        };
    }
    if name.contains("..") {
        return "contains '..'".to_owned();
    }
    if name.contains("@{") {
        return "contains '@{' (git's reflog syntax)".to_owned();
    }
    if name.starts_with('/') || name.ends_with('/') {
        return "starts or ends with '/'".to_owned();
    }
    if name.contains("//") {
        return "contains '//' (an empty part between slashes)".to_owned();
    }
    if name.ends_with('.') {
        return "ends with '.'".to_owned();
    }
    for part in name.split('/') {
        if part.starts_with('.') {
            return format!("has a part starting with '.' (\"{part}\")");
        }
        if part.ends_with(".lock") {
            return format!("has a part ending with \".lock\" (\"{part}\")");
        }
    }
    "breaks one of git's rules for branch names (see `git help check-ref-format`)".to_owned()
}

/// `name` as a message quotes it: control characters escaped (`\t`, `\u{7f}`), so that the
/// one the refusal names can be seen, and at most 200 characters.
pub fn shown(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars().take(200) {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    if name.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// Whether git's `--branch` check rewrote `name` (an `@{-N}` it expanded to the branch checked
/// out N switches ago) rather than taking it as it is; `printed` is what git printed.
pub fn expanded(name: &str, printed: &[u8]) -> bool {
    printed.strip_suffix(b"\n").unwrap_or(printed) != name.as_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::facade::apply::repo::Repo;
    use std::process::Command;

    fn git(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
        Command::new("git")
            .current_dir(dir)
            .args(args)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .output()
            .expect("git runs")
    }

    /// A repository with two branches, `main` checked out after `side`: `@{-1}` is `side`.
    fn repository() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path();
        for args in [
            &["init", "-q", "-b", "side"][..],
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "base",
            ],
            &["checkout", "-q", "-b", "main"],
        ] {
            assert!(git(path, args).status.success(), "git {args:?}");
        }
        dir
    }

    /// Every name is judged by the real git and by `check_branch_name`, which must agree; a
    /// refused name's message must say which rule it breaks (the fragment in the table).
    #[test]
    fn branch_names_are_judged_as_git_judges_them() {
        let dir = repository();
        let repo = Repo::open(dir.path()).expect("open");
        // (name, git takes it, what the refusal names)
        let table: &[(&str, bool, &str)] = &[
            ("feature", true, ""),
            ("dynocap/fix-1", true, ""),
            ("a/b/c", true, ""),
            ("héllo", true, ""),
            ("@", true, ""),
            ("x@", true, ""),
            ("a.b", true, ""),
            ("a-", true, ""),
            ("foo/HEAD", true, ""),
            ("HEAD/x", true, ""),
            ("head", true, ""),
            ("FETCH_HEAD", true, ""),
            ("refs/heads/x", true, ""),
            ("a{b}", true, ""),
            ("HEAD", false, "is HEAD"),
            ("-x", false, "starts with '-'"),
            ("-", false, "starts with '-'"),
            ("--help", false, "starts with '-'"),
            ("-h", false, "starts with '-'"),
            ("", false, "is empty"),
            ("a..b", false, "'..'"),
            ("..", false, "'..'"),
            ("a.lock", false, "\".lock\""),
            ("a.lock/b", false, "\".lock\""),
            ("a/b.lock", false, "\".lock\""),
            ("@{", false, "'@{'"),
            ("x@{y", false, "'@{'"),
            ("x@{-1}", false, "'@{'"),
            ("a/", false, "'/'"),
            ("/a", false, "'/'"),
            ("a//b", false, "'//'"),
            ("a.", false, "ends with '.'"),
            (".a", false, "starting with '.'"),
            ("a/.b", false, "starting with '.'"),
            ("a b", false, "space"),
            ("a~1", false, "'~'"),
            ("a^", false, "'^'"),
            ("a:b", false, "':'"),
            ("a?", false, "'?'"),
            ("a*", false, "'*'"),
            ("a[b", false, "'['"),
            ("a\\b", false, "'\\'"),
            ("a\tb", false, "control character"),
            ("a\x7fb", false, "control character"),
            ("a\x01", false, "control character"),
        ];
        for (name, valid, names) in table {
            let by_git = git(dir.path(), &["check-ref-format", "--branch", name])
                .status
                .success();
            assert_eq!(by_git, *valid, "the table says git takes {name:?}: {valid}");
            match repo.check_branch_name(name) {
                Ok(()) => assert!(valid, "{name:?} was taken"),
                Err(err) => {
                    assert!(!valid, "{name:?} was refused: {}", err.message);
                    assert_eq!(
                        err.code,
                        crate::foundation::error::ErrorCode::InvalidArgument
                    );
                    assert!(
                        err.message.contains(names) && err.message.contains("--branch"),
                        "{name:?}: {}",
                        err.message
                    );
                }
            }
        }
    }

    /// `@{-1}`: git takes it and reads it as `side`, an existing branch; it is refused by
    /// name, and where no branch was checked out before git refuses it itself.
    #[test]
    fn the_previous_branch_shorthand_is_refused() {
        let dir = repository();
        let printed = git(dir.path(), &["check-ref-format", "--branch", "@{-1}"]);
        assert!(printed.status.success());
        assert_eq!(printed.stdout, b"side\n");
        let repo = Repo::open(dir.path()).expect("open");
        for name in ["@{-1}", "@{-1}/x", "@{-1}x"] {
            let Err(err) = repo.check_branch_name(name) else {
                panic!("{name} was taken");
            };
            assert!(err.message.contains(name), "{}", err.message);
        }
        let err = repo.check_branch_name("@{-1}").unwrap_err();
        assert!(err.message.contains("\"side\""), "{}", err.message);
        assert!(
            err.message.contains("checked out before"),
            "{}",
            err.message
        );
        let err = repo.check_branch_name("@{-9}").unwrap_err();
        assert!(err.message.contains("'@{'"), "{}", err.message);
    }

    #[test]
    fn a_quoted_name_shows_its_control_characters() {
        assert_eq!(shown("a\tb\x7f"), "a\\tb\\u{7f}");
        assert_eq!(shown(&"x".repeat(201)).chars().count(), 201);
    }

    #[test]
    fn only_a_rewritten_name_counts_as_expanded() {
        assert!(!expanded("main", b"main\n"));
        assert!(!expanded("main", b"main"));
        assert!(expanded("@{-1}", b"side\n"));
    }
}
