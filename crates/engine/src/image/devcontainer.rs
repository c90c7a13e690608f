//! The environment a project names for itself, for `task start --image auto` (and the MCP
//! server's default): its `.devcontainer/devcontainer.json` (or `.devcontainer.json`), read as
//! VS Code reads it (JSON with `//` and `/* */` comments and trailing commas). Its `image`
//! names the image to start on when this host has it; a container made by a Dockerfile or
//! compose build is said to need that build, which DynoCap does not do.
//!
//! The file is the project's, so hostile as any project file: it is read through no link,
//! bounded in size, and only its `image`, `build`, `dockerFile` and `dockerComposeFile` are
//! looked at.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;

/// The largest devcontainer.json read.
const MAX_BYTES: u64 = 256 * 1024;

/// Where VS Code looks, in its order (`.devcontainer/<folder>/devcontainer.json`, a choice
/// between several, is not followed).
const FILES: &[(&str, &str)] = &[
    (".devcontainer", "devcontainer.json"),
    ("", ".devcontainer.json"),
];

/// What a project's devcontainer.json asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// `image`: the container image the project runs in.
    Image(String),
    /// A container made by a build (`build.dockerfile`, `dockerFile`, `dockerComposeFile`),
    /// described for a message.
    Build(String),
    /// The file names neither.
    Nothing,
}

/// What `--image auto` starts a task on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoImage {
    /// The image, or `None` for the default one.
    pub image: Option<String>,
    /// Why the task is not on the project's image, or where its image came from: shown with
    /// the started task (`imageNote`).
    pub note: Option<String>,
    /// The project names an image this host does not have (the reference, for a pull).
    pub missing: Option<String>,
}

/// Reads the devcontainer.json of the project at `project`: `Ok(None)` when it has none, and
/// an error text when it has one that cannot be read or parsed.
pub fn read(project: &Path) -> Result<Option<(String, Named)>, String> {
    let root = open(
        project,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| format!("cannot open the project {}: {err}", project.display()))?;
    for (dir, file) in FILES {
        let shown = if dir.is_empty() {
            (*file).to_owned()
        } else {
            format!("{dir}/{file}")
        };
        let parent: Option<OwnedFd> = if dir.is_empty() {
            None
        } else {
            match openat(
                &root,
                *dir,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => Some(fd),
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => continue,
                Err(nix::errno::Errno::ELOOP) => {
                    return Err(format!("{dir} is a symbolic link, which is not followed"))
                }
                Err(err) => return Err(format!("cannot open {dir}: {err}")),
            }
        };
        let fd = match openat(
            parent.as_ref().unwrap_or(&root),
            *file,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(nix::errno::Errno::ELOOP) => {
                return Err(format!("{shown} is a symbolic link, which is not followed"))
            }
            Err(err) => return Err(format!("cannot open {shown}: {err}")),
        };
        let file = std::fs::File::from(fd);
        let is_file = file.metadata().map(|m| m.is_file()).unwrap_or(false);
        if !is_file {
            return Err(format!("{shown} is not a regular file"));
        }
        let mut text = String::new();
        file.take(MAX_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|err| format!("cannot read {shown}: {err}"))?;
        if text.len() as u64 > MAX_BYTES {
            return Err(format!("{shown} is larger than {MAX_BYTES} bytes"));
        }
        return parse(&text)
            .map(|named| Some((shown.clone(), named)))
            .map_err(|err| format!("{shown} is not valid JSON with comments: {err}"));
    }
    Ok(None)
}

/// What a devcontainer.json's text asks for.
pub fn parse(text: &str) -> Result<Named, String> {
    let value: serde_json::Value =
        serde_json::from_str(&strip_jsonc(text)).map_err(|err| err.to_string())?;
    let object = value
        .as_object()
        .ok_or_else(|| "its top level is not an object".to_owned())?;
    let text_of = |key: &str| object.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    if let Some(build) = object.get("build") {
        let file = build
            .get("dockerfile")
            .or_else(|| build.get("dockerFile"))
            .and_then(|v| v.as_str())
            .unwrap_or("Dockerfile");
        return Ok(Named::Build(format!(
            "build.dockerfile {}",
            printable(file)
        )));
    }
    if let Some(file) = text_of("dockerFile") {
        return Ok(Named::Build(format!("dockerFile {}", printable(&file))));
    }
    if object.contains_key("dockerComposeFile") {
        return Ok(Named::Build(
            "dockerComposeFile (a compose build)".to_owned(),
        ));
    }
    match text_of("image") {
        Some(image) if !image.trim().is_empty() => Ok(Named::Image(image.trim().to_owned())),
        _ => Ok(Named::Nothing),
    }
}

/// The image `--image auto` starts the project at `project` on, given the images this host
/// has (`on_host`: `image ls` names). Never fails: whatever stands in the way is the note,
/// and the task starts on the default image.
pub fn choose(project: &Path, on_host: &[String]) -> AutoImage {
    let default = |note: String| AutoImage {
        image: None,
        note: Some(format!("{note}; the task runs on the default image")),
        missing: None,
    };
    match read(project) {
        Err(err) => default(err),
        Ok(None) => default(
            "the project has no .devcontainer/devcontainer.json (or .devcontainer.json) naming \
             an image"
                .to_owned(),
        ),
        Ok(Some((file, Named::Nothing))) => default(format!("{file} names no image")),
        Ok(Some((file, Named::Build(how)))) => default(format!(
            "{file} builds its container ({how}): a Dockerfile build is needed, which DynoCap \
             does not do; build the image elsewhere and `dynocap image import` or `image pull` \
             it, or make one with `dynocap image build NAME --from BASE`, then start the task \
             on it (--image NAME, or image over MCP)"
        )),
        Ok(Some((file, Named::Image(image)))) => match on_host_as(&image, on_host) {
            Some(name) => AutoImage {
                image: Some(name.clone()),
                note: Some(format!("the image {} that {file} names", printable(&name))),
                missing: None,
            },
            None => AutoImage {
                missing: Some(image.clone()),
                ..default(format!(
                    "{file} names the image {}, which this host does not have (`dynocap image \
                     pull {0}` fetches it from a registry in DYNOCAP_REGISTRIES)",
                    printable(&image)
                ))
            },
        },
    }
}

/// The name this host knows `image` by: as written, or Docker Hub's long and short forms of
/// one (`rust:1` is `docker.io/library/rust:1`).
fn on_host_as(image: &str, on_host: &[String]) -> Option<String> {
    let mut forms = vec![image.to_owned()];
    if let Some(short) = image.strip_prefix("docker.io/library/") {
        forms.push(short.to_owned());
    } else if let Some(short) = image.strip_prefix("docker.io/") {
        forms.push(short.to_owned());
    } else if !image.contains('/') {
        forms.push(format!("docker.io/library/{image}"));
    }
    forms.into_iter().find(|form| on_host.contains(form))
}

/// JSON with comments (`//`, `/* */`) and trailing commas made plain JSON; strings untouched.
fn strip_jsonc(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let mut in_string = false;
    let mut escaped = false;
    while let Some(c) = chars.next() {
        if in_string {
            plain.push(c);
            in_string = string_goes_on(c, &mut escaped);
            continue;
        }
        match (c, chars.peek()) {
            ('"', _) => {
                in_string = true;
                plain.push(c);
            }
            ('/', Some('/')) => {
                for skipped in chars.by_ref() {
                    if skipped == '\n' {
                        plain.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                let mut last = ' ';
                for skipped in chars.by_ref() {
                    if last == '*' && skipped == '/' {
                        break;
                    }
                    last = skipped;
                }
                plain.push(' ');
            }
            _ => plain.push(c),
        }
    }
    // Trailing commas: a comma whose next non-blank character closes an object or array.
    let mut out = String::with_capacity(plain.len());
    let mut in_string = false;
    let mut escaped = false;
    let bytes: Vec<char> = plain.chars().collect();
    for (i, &c) in bytes.iter().enumerate() {
        if in_string {
            in_string = string_goes_on(c, &mut escaped);
        } else if c == '"' {
            in_string = true;
        } else if c == ',' {
            let next = bytes[i + 1..].iter().find(|n| !n.is_whitespace());
            if matches!(next, Some('}' | ']')) {
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// Follows one character inside a JSON string (`escaped`: the one before was an unescaped
/// backslash): whether the string goes on after it.
fn string_goes_on(c: char, escaped: &mut bool) -> bool {
    if *escaped {
        *escaped = false;
    } else if c == '\\' {
        *escaped = true;
    } else if c == '"' {
        return false;
    }
    true
}

/// A project's text cut short with control characters escaped, for a message.
fn printable(text: &str) -> String {
    super::oci::printable(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_with_comments_and_trailing_commas() {
        let text = r#"// For format details, see https://aka.ms/devcontainer.json
        {
            "name": "Rust // not a comment",
            /* the image */ "image": "mcr.microsoft.com/devcontainers/rust:1-bookworm",
            "features": { "a": "b\"/*", },
            "forwardPorts": [3000, 8080,],
        }"#;
        assert_eq!(
            parse(text).unwrap(),
            Named::Image("mcr.microsoft.com/devcontainers/rust:1-bookworm".into())
        );
        assert_eq!(
            parse(r#"{"build": {"dockerfile": "Dockerfile.dev", "context": ".."}}"#).unwrap(),
            Named::Build("build.dockerfile Dockerfile.dev".into())
        );
        assert_eq!(
            parse(r#"{"dockerFile": "Dockerfile", "image": "x"}"#).unwrap(),
            Named::Build("dockerFile Dockerfile".into())
        );
        assert!(matches!(
            parse(r#"{"dockerComposeFile": ["a.yml"]}"#).unwrap(),
            Named::Build(_)
        ));
        assert_eq!(parse(r#"{"name": "x"}"#).unwrap(), Named::Nothing);
        assert!(parse("[1]").is_err() && parse("{").is_err());
    }

    #[test]
    fn the_image_is_used_only_where_the_host_has_it() {
        let project = tempfile::tempdir().unwrap();
        let on_host = vec!["docker.io/library/rust:1".to_owned(), "tool".to_owned()];
        let none = choose(project.path(), &on_host);
        assert!(none.image.is_none() && none.note.as_deref().unwrap().contains("no .devcontainer"));

        std::fs::create_dir(project.path().join(".devcontainer")).unwrap();
        let file = project.path().join(".devcontainer/devcontainer.json");
        std::fs::write(&file, "{\"image\": \"rust:1\", // short form\n}").unwrap();
        let found = choose(project.path(), &on_host);
        assert_eq!(found.image.as_deref(), Some("docker.io/library/rust:1"));

        std::fs::write(&file, r#"{"image": "ghcr.io/x/y:2"}"#).unwrap();
        let missing = choose(project.path(), &on_host);
        assert_eq!(
            (missing.image, missing.missing.as_deref()),
            (None, Some("ghcr.io/x/y:2"))
        );

        std::fs::write(&file, r#"{"build": {"dockerfile": "Dockerfile"}}"#).unwrap();
        let build = choose(project.path(), &on_host);
        let note = build.note.unwrap();
        assert!(
            build.image.is_none() && note.contains("Dockerfile build is needed"),
            "{note}"
        );
        // Read by a CLI user and an MCP caller alike: both ways of naming the image.
        assert!(
            note.contains("--image NAME") && note.contains("image over MCP"),
            "{note}"
        );

        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", &file).unwrap();
        let link = choose(project.path(), &on_host);
        assert!(link.image.is_none() && link.note.unwrap().contains("symbolic link"));
    }
}
