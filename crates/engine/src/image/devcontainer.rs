//! The environment a project names for itself, for `task start --image auto` (and the MCP
//! server's default): its `.devcontainer/devcontainer.json`, else `.devcontainer.json`, else
//! the one `.devcontainer/<folder>/devcontainer.json` (of several, none is chosen: that is the
//! person's choice), read as VS Code reads it (JSON with `//` and `/* */` comments, trailing
//! commas and a byte order mark). Its `image` names the image to start on when this host has
//! it; a container made by a Dockerfile or compose build is said to need that build, which
//! DynoCap does not do. Variables (`${localEnv:X}`) are not substituted: the project does not
//! get to read the host's environment into a name that is pulled and shown to the agent.
//!
//! The file is the project's, so hostile as any project file: it is read through no link,
//! bounded in size, and only its `image`, `build`, `dockerFile` and `dockerComposeFile` are
//! looked at.

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{open, openat, OFlag};
use nix::sys::stat::Mode;

/// The largest devcontainer.json read.
const MAX_BYTES: u64 = 256 * 1024;

/// Where VS Code looks first, in its order; then `.devcontainer/<folder>/devcontainer.json`.
const FILES: &[(&str, &str)] = &[
    (".devcontainer", "devcontainer.json"),
    ("", ".devcontainer.json"),
];

/// The directory whose sub-folders may each hold a configuration, and the file's name there.
const FOLDERS: (&str, &str) = (".devcontainer", "devcontainer.json");

/// The most entries of `.devcontainer/` looked through for configurations in sub-folders.
const MAX_FOLDER_ENTRIES: usize = 256;

/// The most configurations a note names when there are several.
const SHOWN_CONFIGS: usize = 5;

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
/// an error text when it has one that cannot be read or parsed, or several in sub-folders of
/// `.devcontainer/` and none at the top (a choice DynoCap does not make).
pub fn read(project: &Path) -> Result<Option<(String, Named)>, String> {
    let root = open(
        project,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|err| format!("cannot open the project {}: {err}", project.display()))?;
    for (dir, file) in FILES {
        if let Some(found) = read_one(&root, dir, file)? {
            return Ok(Some(found));
        }
    }
    let folders = config_folders(&root)?;
    match folders.as_slice() {
        [] => Ok(None),
        [folder] => read_one(&root, &format!("{}/{folder}", FOLDERS.0), FOLDERS.1),
        several => {
            let mut shown: Vec<String> = several
                .iter()
                .take(SHOWN_CONFIGS)
                .map(|f| printable(&format!("{}/{f}/{}", FOLDERS.0, FOLDERS.1)))
                .collect();
            if several.len() > SHOWN_CONFIGS {
                shown.push(format!("and {} more", several.len() - SHOWN_CONFIGS));
            }
            Err(format!(
                "the project has {} devcontainer configurations ({}) and none at \
                 {}/{}, so it names no one image: which one is the person's choice (name its \
                 image with --image, or image over MCP)",
                several.len(),
                shown.join(", "),
                FOLDERS.0,
                FOLDERS.1,
            ))
        }
    }
}

/// Reads `dir/file` (`dir` empty: at the project's root; one or two plain names, each opened
/// without following a link) of the project open at `root`: `Ok(None)` when there is none.
fn read_one(root: &OwnedFd, dir: &str, file: &str) -> Result<Option<(String, Named)>, String> {
    let shown = if dir.is_empty() {
        file.to_owned()
    } else {
        printable(&format!("{dir}/{file}"))
    };
    let mut parent: Option<OwnedFd> = None;
    for part in dir.split('/').filter(|p| !p.is_empty()) {
        match openat(
            parent.as_ref().unwrap_or(root),
            part,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => parent = Some(fd),
            Err(nix::errno::Errno::ENOTDIR) if !is_link(parent.as_ref().unwrap_or(root), part) => {
                return Ok(None)
            }
            Err(nix::errno::Errno::ENOENT) => return Ok(None),
            Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
                return Err(format!(
                    "{} is a symbolic link, which is not followed",
                    printable(dir)
                ))
            }
            Err(err) => return Err(format!("cannot open {}: {err}", printable(dir))),
        }
    }
    let fd = match openat(
        parent.as_ref().unwrap_or(root),
        file,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
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
    let mut bytes = Vec::new();
    file.take(MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot read {shown}: {err}"))?;
    if bytes.len() as u64 > MAX_BYTES {
        return Err(format!("{shown} is larger than {MAX_BYTES} bytes"));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8 text"))?;
    parse(&text)
        .map(|named| Some((shown.clone(), named)))
        .map_err(|err| format!("{shown} is not valid JSON with comments: {err}"))
}

/// Whether `name` in the directory open at `dir` is a symbolic link (`O_DIRECTORY |
/// O_NOFOLLOW` says `ENOTDIR` for one, as for a file).
fn is_link(dir: &OwnedFd, name: &str) -> bool {
    nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// The sub-folders of the project's `.devcontainer/` (open at `root`) that hold a
/// `devcontainer.json`, in name order; links are not followed, and only the first
/// [`MAX_FOLDER_ENTRIES`] entries are looked at.
fn config_folders(root: &OwnedFd) -> Result<Vec<String>, String> {
    let dir = match nix::dir::Dir::openat(
        root,
        FOLDERS.0,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        Err(nix::errno::Errno::ENOTDIR) if !is_link(root, FOLDERS.0) => return Ok(Vec::new()),
        Err(nix::errno::Errno::ENOENT) => return Ok(Vec::new()),
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => {
            return Err(format!(
                "{} is a symbolic link, which is not followed",
                FOLDERS.0
            ))
        }
        Err(err) => return Err(format!("cannot open {}: {err}", FOLDERS.0)),
    };
    let mut found = Vec::new();
    let mut dir = dir;
    let fd = dir
        .as_fd()
        .try_clone_to_owned()
        .map_err(|err| format!("cannot read {}: {err}", FOLDERS.0))?;
    for entry in dir.iter().take(MAX_FOLDER_ENTRIES) {
        let Ok(entry) = entry else { continue };
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let Ok(sub) = openat(
            &fd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let has_config =
            nix::sys::stat::fstatat(&sub, FOLDERS.1, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok();
        if has_config {
            found.push(name.to_owned());
        }
    }
    found.sort();
    Ok(found)
}

/// What a devcontainer.json's text asks for.
pub fn parse(text: &str) -> Result<Named, String> {
    // A byte order mark, which Windows editors write and VS Code reads past.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
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
            None if image.contains("${") => default(format!(
                "{file} names the image {} with a variable, which DynoCap does not substitute \
                 (a project does not read the host's environment); name the image with \
                 --image NAME (or image over MCP)",
                printable(&image)
            )),
            // DynoCap's own name, which its built image stands for (Docker Hub's is no other).
            None if super::recipe::BUILDABLE.contains(&image.as_str()) => default(format!(
                "{file} names the image {image}, which this host has not built (`dynocap image \
                 build {image}` makes it)"
            )),
            None => match pullable(&image) {
                Some(reference) => AutoImage {
                    missing: Some(reference.clone()),
                    ..default(format!(
                        "{file} names the image {}, which this host does not have (`dynocap \
                         image pull {}` fetches it from a registry in DYNOCAP_REGISTRIES)",
                        printable(&image),
                        printable(&reference)
                    ))
                },
                None => default(format!(
                    "{file} names {}, which is not an image reference (registry/repository:tag \
                     or …@sha256:digest) nor an image on this host",
                    printable(&image)
                )),
            },
        },
    }
}

/// The reference DynoCap pulls for the image a devcontainer.json names: the name itself
/// when it writes out its registry, else Docker Hub's long form of it (`rust:1` is
/// `docker.io/library/rust:1`, `ubuntu` is `docker.io/library/ubuntu:latest`), as Docker,
/// which devcontainers run on, reads it; `None` for what is neither.
fn pullable(image: &str) -> Option<String> {
    use super::store::is_reference;
    if is_reference(image) {
        return Some(image.to_owned());
    }
    let (name, digest) = match image.split_once('@') {
        Some((name, digest)) => (name, Some(digest)),
        None => (image, None),
    };
    let first = name.split('/').next().unwrap_or(name);
    // A first part with a dot, a port or `localhost` names a registry: a reference already,
    // or not one at all.
    if name.contains('/') && (first.contains(['.', ':']) || first == "localhost") {
        return None;
    }
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = if last.contains(':') || digest.is_some() {
        ""
    } else {
        ":latest"
    };
    let namespace = if name.contains('/') { "" } else { "library/" };
    let long = match digest {
        Some(digest) => format!("docker.io/{namespace}{name}{tag}@{digest}"),
        None => format!("docker.io/{namespace}{name}{tag}"),
    };
    is_reference(&long).then_some(long)
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
    // Pulled by the long form a missing tag implies (`ubuntu`: `…/ubuntu:latest`).
    forms.extend(pullable(image));
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

    #[test]
    fn a_byte_order_mark_and_deep_or_huge_files() {
        assert_eq!(
            parse("\u{feff}// made on Windows\n{\"image\": \"tool\",}").unwrap(),
            Named::Image("tool".into())
        );
        // Nesting past the JSON reader's depth is an error, not a crash.
        let deep = format!("{{\"a\": {}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse(&deep).is_err());
        let project = tempfile::tempdir().unwrap();
        std::fs::write(
            project.path().join(".devcontainer.json"),
            format!(
                "{{\"image\": \"tool\", \"x\": \"{}\"}}",
                "a".repeat(300 * 1024)
            ),
        )
        .unwrap();
        let err = read(project.path()).unwrap_err();
        assert!(err.contains("larger than"), "{err}");
        std::fs::write(
            project.path().join(".devcontainer.json"),
            b"{\"image\": \"\xff\"}",
        )
        .unwrap();
        let err = read(project.path()).unwrap_err();
        assert!(err.contains("not UTF-8"), "{err}");
    }

    #[test]
    fn variables_and_names_that_are_no_reference_say_so() {
        let project = tempfile::tempdir().unwrap();
        let file = project.path().join(".devcontainer.json");
        std::fs::write(&file, r#"{"image": "${localEnv:REGISTRY}/tool:1"}"#).unwrap();
        let chosen = choose(project.path(), &[]);
        let note = chosen.note.unwrap();
        assert!(chosen.image.is_none() && chosen.missing.is_none(), "{note}");
        assert!(
            note.starts_with(".devcontainer.json names") && note.contains("does not substitute"),
            "{note}"
        );
        for bad in ["Registry.Example/Tool:1", "reg.example/x:1:2", "a b"] {
            std::fs::write(&file, format!("{{\"image\": \"{bad}\"}}")).unwrap();
            let chosen = choose(project.path(), &[]);
            let note = chosen.note.unwrap();
            assert!(chosen.missing.is_none(), "{bad}: {note}");
            assert!(note.contains("is not an image reference"), "{bad}: {note}");
        }
        // DynoCap's own `debian` is built, not pulled from Docker Hub.
        std::fs::write(&file, r#"{"image": "debian"}"#).unwrap();
        let chosen = choose(project.path(), &[]);
        let note = chosen.note.unwrap();
        assert!(chosen.missing.is_none(), "{note}");
        assert!(note.contains("`dynocap image build debian`"), "{note}");
        // Docker Hub's short names, as Docker reads them: what a pull would fetch.
        for (short, long) in [
            ("rust:1", "docker.io/library/rust:1"),
            ("ubuntu", "docker.io/library/ubuntu:latest"),
            ("team/tool", "docker.io/team/tool:latest"),
            ("reg.example/team/tool:2", "reg.example/team/tool:2"),
        ] {
            std::fs::write(&file, format!("{{\"image\": \"{short}\"}}")).unwrap();
            let chosen = choose(project.path(), &[]);
            assert_eq!(chosen.missing.as_deref(), Some(long), "{short}");
            let note = chosen.note.unwrap();
            assert!(
                note.contains(&format!("`dynocap image pull {long}`")),
                "{note}"
            );
            // And the host's image of that long name is the project's.
            let on_host = choose(project.path(), &[long.to_owned()]);
            assert_eq!(on_host.image.as_deref(), Some(long), "{short}");
        }
    }

    #[test]
    fn the_configuration_in_a_sub_folder_is_used_when_it_is_the_only_one() {
        let project = tempfile::tempdir().unwrap();
        let folders = project.path().join(".devcontainer");
        std::fs::create_dir_all(folders.join("python")).unwrap();
        std::fs::write(
            folders.join("python/devcontainer.json"),
            r#"{"image": "tool"}"#,
        )
        .unwrap();
        let (file, named) = read(project.path()).unwrap().unwrap();
        assert_eq!(
            (file.as_str(), named),
            (
                ".devcontainer/python/devcontainer.json",
                Named::Image("tool".into())
            )
        );
        // Several: which one is the person's choice, so none, and the note names them.
        std::fs::create_dir_all(folders.join("node")).unwrap();
        std::fs::write(folders.join("node/devcontainer.json"), r#"{"image": "x"}"#).unwrap();
        let err = read(project.path()).unwrap_err();
        assert!(
            err.contains("2 devcontainer configurations")
                && err.contains(".devcontainer/node/devcontainer.json")
                && err.contains(".devcontainer/python/devcontainer.json"),
            "{err}"
        );
        let chosen = choose(project.path(), &["tool".to_owned()]);
        assert!(chosen.image.is_none(), "{chosen:?}");
        // A sub-folder that is a link to elsewhere on the host is not looked into.
        std::fs::remove_dir_all(folders.join("node")).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(
            elsewhere.path().join("devcontainer.json"),
            r#"{"image": "y"}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), folders.join("node")).unwrap();
        let (file, _) = read(project.path()).unwrap().unwrap();
        assert_eq!(file, ".devcontainer/python/devcontainer.json");
        // The top-level file comes first, then .devcontainer.json, then the sub-folders.
        std::fs::write(
            project.path().join(".devcontainer.json"),
            r#"{"image": "b"}"#,
        )
        .unwrap();
        assert_eq!(
            read(project.path()).unwrap().unwrap().0,
            ".devcontainer.json"
        );
        std::fs::write(folders.join("devcontainer.json"), r#"{"image": "a"}"#).unwrap();
        assert_eq!(
            read(project.path()).unwrap().unwrap(),
            (
                ".devcontainer/devcontainer.json".to_owned(),
                Named::Image("a".into())
            )
        );
    }

    #[test]
    fn a_devcontainer_directory_that_is_a_link_is_not_followed() {
        let project = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(
            elsewhere.path().join("devcontainer.json"),
            r#"{"image": "y"}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), project.path().join(".devcontainer")).unwrap();
        let err = read(project.path()).unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
