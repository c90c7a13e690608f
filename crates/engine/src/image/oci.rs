//! The pure part of `dynocap image import`: reading an OCI image layout's or a `docker save`
//! archive's JSON (index, manifest, image config), digests, and the rules for a layer entry's
//! path and whiteouts. No filesystem access here, so all of it is unit-tested and fuzzed;
//! `import` and `unpack` do the I/O.

use serde::{Deserialize, Serialize};

use crate::foundation::error::{Error, Result};

/// The largest manifest, index or config blob read (they are held in memory).
pub const MAX_JSON_BYTES: u64 = 4 << 20;

/// A `sha256:<64 hex>` digest (the only algorithm accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// 64 lowercase hex digits.
    pub hex: String,
}

impl Digest {
    pub fn parse(text: &str) -> Result<Digest> {
        let hex = text.strip_prefix("sha256:").ok_or_else(|| {
            Error::invalid(format!(
                "digest \"{}\" is not a sha256 digest (the only kind supported)",
                printable(text)
            ))
        })?;
        if !(hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))) {
            return Err(Error::invalid(format!(
                "digest \"{}\" is not sha256: and 64 lowercase hex digits",
                printable(text)
            )));
        }
        Ok(Digest {
            hex: hex.to_owned(),
        })
    }

    /// `blobs/sha256/<hex>` in an OCI layout.
    pub fn blob_path(&self) -> String {
        format!("blobs/sha256/{}", self.hex)
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// An OCI content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
}

/// The annotation an OCI layout's `index.json` names each image by (`skopeo copy …
/// oci:DIR:TAG` writes TAG there).
const REF_NAME: &str = "org.opencontainers.image.ref.name";

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    /// `os/architecture[/variant]`, as `docker --platform` spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let variant = self.variant.as_deref().filter(|v| !v.is_empty());
        let text = match variant {
            Some(variant) => format!("{}/{}/{variant}", self.os, self.architecture),
            None => format!("{}/{}", self.os, self.architecture),
        };
        f.write_str(&printable(&text))
    }
}

/// `index.json` of a layout, or an image index blob.
#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// One entry of a `docker save` archive's `manifest.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DockerEntry {
    pub config: String,
    #[serde(default)]
    pub layers: Vec<String>,
}

/// The parts of an image config DynoCap reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<ContainerConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

impl ImageConfig {
    /// Refuses an image whose config says it is for another platform than linux/amd64 (what
    /// DynoCap's sandboxes run; a config that names none is taken as such). `what` names the
    /// image in the error.
    pub fn check_platform(&self, what: &str) -> Result<()> {
        let other = |field: &str, want: &str| !field.is_empty() && field != want;
        if other(&self.os, "linux") || other(&self.architecture, "amd64") {
            return Err(Error::invalid(format!(
                "{what} is for {}/{} (its config says so); DynoCap's sandboxes run linux/amd64 \
                 images: use the image's linux/amd64 variant",
                printable(&self.os),
                printable(&self.architecture)
            )));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct RootFs {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// What the image's config says about running it, recorded in `image.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
}

/// The compression of a layer from its media type (may be empty: docker archives) and its
/// first bytes. zstd and unknown compressions are refused with a clear error.
pub fn compression(media_type: &str, magic: &[u8]) -> Result<Compression> {
    if media_type.ends_with("+zstd") || magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Err(Error::invalid(
            "this image has a zstd-compressed layer, which DynoCap does not unpack yet (image \
             pull and import read gzip and plain tar layers): use the image with gzip layers \
             (skopeo copy --dest-compress-format gzip recompresses one)",
        ));
    }
    if magic.starts_with(&[0x1f, 0x8b]) {
        return Ok(Compression::Gzip);
    }
    if media_type.ends_with("+gzip") || media_type.ends_with(".gzip") {
        return Err(Error::invalid(format!(
            "a layer's media type is {media_type} but its content is not gzip"
        )));
    }
    let known_plain = media_type.is_empty()
        || media_type.ends_with(".tar")
        || media_type == "application/vnd.docker.image.rootfs.diff.tar";
    if !known_plain {
        return Err(Error::invalid(format!(
            "a layer has the media type \"{}\", which DynoCap does not unpack (image pull and \
             import read gzip and plain tar layers)",
            printable(media_type)
        )));
    }
    Ok(Compression::None)
}

/// Picks the image manifest in an index: the only one, else the one for linux/amd64.
pub fn pick_manifest(index: &Index) -> Result<&Descriptor> {
    match index.manifests.as_slice() {
        [] => Err(Error::invalid("the image's index lists no manifest")),
        [only] => Ok(only),
        many => many
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            })
            .ok_or_else(|| {
                let tags: Vec<String> = many
                    .iter()
                    .filter_map(|d| d.annotations.get(REF_NAME))
                    .map(|tag| printable(tag))
                    .collect();
                if tags.is_empty() {
                    let mut platforms: Vec<String> = Vec::new();
                    for platform in many.iter().filter_map(|d| d.platform.as_ref()) {
                        let platform = platform.to_string();
                        // Attestation manifests (buildx) are marked unknown/unknown.
                        if platform != "unknown/unknown" && !platforms.contains(&platform) {
                            platforms.push(platform);
                        }
                    }
                    let listed = if platforms.is_empty() {
                        "none marked with a platform".to_owned()
                    } else {
                        platforms.join(", ")
                    };
                    return Error::invalid(format!(
                        "the image's index lists {} manifests for other platforms only \
                         ({listed}), none for linux/amd64, which DynoCap's sandboxes run: \
                         export its linux/amd64 image instead \
                         (skopeo --override-arch amd64 copy …)",
                        many.len()
                    ));
                }
                // Several images of one layout (tags), none marked with a platform: which is
                // meant is the user's to say.
                Error::invalid(format!(
                    "the OCI layout holds {} images ({}) and none is marked for linux/amd64, so \
                     which to import is not clear: copy the one you want into a layout of its \
                     own (skopeo copy oci:DIR:TAG oci:NEWDIR) and import that",
                    many.len(),
                    tags.join(", ")
                ))
            }),
    }
}

/// A descriptor's media type names an index (a nested multi-platform list).
pub fn is_index(descriptor: &Descriptor) -> bool {
    descriptor.media_type == MEDIA_INDEX || descriptor.media_type == MEDIA_DOCKER_LIST
}

/// Reads JSON of type `T`, naming `what` in the error.
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T> {
    serde_json::from_slice(bytes)
        .map_err(|err| Error::invalid(format!("the image's {what} is not valid: {err}")))
}

/// A member path inside a docker archive or an OCI layout (`blobs/sha256/…`, `abc/layer.tar`):
/// relative, no `..`, no empty or `.` components.
pub fn member_path(text: &str) -> Result<String> {
    let clean = text.strip_prefix("./").unwrap_or(text);
    let ok = !clean.is_empty()
        && !clean.starts_with('/')
        && clean
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(clean.to_owned())
    } else {
        Err(Error::invalid(format!(
            "the image names a file \"{}\" outside its own directory",
            printable(text)
        )))
    }
}

/// What one layer entry does to the root filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing: the root directory itself (`./`), or aufs bookkeeping (`.wh..wh.plnk`,
    /// `.wh..wh.aufs`, `.wh..wh.orph` and what is beneath them), which names no file of the
    /// image and which Docker and containerd skip too.
    Skip,
    /// Create or replace the entry at this path (components, none empty, `.` or `..`).
    Put(Vec<Vec<u8>>),
    /// `.wh.NAME`: remove NAME, in directory `dir`, left by lower layers.
    Whiteout { dir: Vec<Vec<u8>>, name: Vec<u8> },
    /// `.wh..wh..opq`: empty `dir` of lower layers' entries.
    Opaque { dir: Vec<Vec<u8>> },
}

const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
/// The prefix of aufs's own entries (the opaque marker shares it).
const AUFS_META: &[u8] = b".wh..wh.";

/// The components of a layer entry's path: relative to the root, never leaving it.
pub fn entry_components(raw: &[u8]) -> Result<Vec<Vec<u8>>> {
    if raw.contains(&0) {
        return Err(bad_path(raw, "has a NUL byte"));
    }
    if raw.starts_with(b"/") {
        return Err(bad_path(raw, "is absolute"));
    }
    let mut parts = Vec::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => continue,
            b".." => return Err(bad_path(raw, "has a \"..\" component")),
            name => parts.push(name.to_vec()),
        }
    }
    Ok(parts)
}

/// What a layer entry named `raw` does (see [`Action`]).
pub fn classify(raw: &[u8]) -> Result<Action> {
    let mut parts = entry_components(raw)?;
    let Some(last) = parts.pop() else {
        return Ok(Action::Skip);
    };
    if parts.iter().any(|p| p.starts_with(AUFS_META)) {
        return Ok(Action::Skip);
    }
    if last == OPAQUE {
        return Ok(Action::Opaque { dir: parts });
    }
    if last.starts_with(AUFS_META) {
        return Ok(Action::Skip);
    }
    if let Some(name) = last.strip_prefix(WHITEOUT) {
        if name.is_empty() || name == b"." || name == b".." {
            return Err(bad_path(raw, "is a whiteout of no file, \".\" or \"..\""));
        }
        return Ok(Action::Whiteout {
            dir: parts,
            name: name.to_vec(),
        });
    }
    parts.push(last);
    Ok(Action::Put(parts))
}

fn bad_path(raw: &[u8], why: &str) -> Error {
    Error::invalid(format!(
        "a layer entry \"{}\" {why}; refusing the image",
        printable(&String::from_utf8_lossy(raw))
    ))
}

/// `text` cut to a readable length with control characters escaped, for messages.
pub fn printable(text: &str) -> String {
    let cut: String = text.chars().take(200).collect();
    cut.escape_debug().to_string()
}

/// A name for an imported image from its file's name: lowercase letters, digits and `-`.
pub fn default_name(file_name: &str) -> String {
    let stem = file_name
        .strip_suffix(".tar")
        .or_else(|| file_name.strip_suffix(".tar.gz"))
        .unwrap_or(file_name);
    let mut name = String::new();
    for c in stem.chars() {
        let c = c.to_ascii_lowercase();
        let keep = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if !(keep == '-' && (name.is_empty() || name.ends_with('-'))) {
            name.push(keep);
        }
        if name.len() == 32 {
            break;
        }
    }
    let name = name.trim_end_matches('-').to_owned();
    if name.is_empty() {
        "imported".to_owned()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|p| p.as_bytes().to_vec()).collect()
    }

    #[test]
    fn entry_paths_stay_beneath_the_root() {
        assert_eq!(classify(b"./").unwrap(), Action::Skip);
        assert_eq!(
            classify(b"./usr//bin/./sh").unwrap(),
            Action::Put(parts(&["usr", "bin", "sh"]))
        );
        for bad in [
            &b"../escape"[..],
            b"/etc/passwd",
            b"a/../../b",
            b"a/..",
            b"x\0y",
        ] {
            assert!(classify(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn whiteouts_and_opaque_dirs() {
        assert_eq!(
            classify(b"etc/.wh.gone").unwrap(),
            Action::Whiteout {
                dir: parts(&["etc"]),
                name: b"gone".to_vec()
            }
        );
        assert_eq!(
            classify(b"opt/.wh..wh..opq").unwrap(),
            Action::Opaque {
                dir: parts(&["opt"])
            }
        );
        for bad in [&b"etc/.wh..."[..], b".wh..", b"a/.wh.", b"../.wh.x"] {
            assert!(classify(bad).is_err(), "{bad:?}");
        }
        // aufs's bookkeeping (layers Docker made on aufs have it) names no file: skipped, as
        // Docker and containerd skip it, and so is what lies beneath it.
        for aufs in [
            &b".wh..wh.plnk/"[..],
            b".wh..wh.aufs",
            b"./.wh..wh.orph/",
            b".wh..wh.plnk/12345.67",
            b"a/.wh..wh.plnk",
            b".wh..wh.plnk/.wh..wh..opq",
        ] {
            assert_eq!(classify(aufs).unwrap(), Action::Skip, "{aufs:?}");
        }
        assert!(classify(b".wh..wh.plnk/../../x").is_err());
    }

    /// Names made of the characters that matter (separators, dots, whiteout prefixes, NUL):
    /// whatever the name, an accepted entry stays beneath the root.
    #[test]
    fn no_generated_name_escapes_the_root() {
        use rand::{Rng, SeedableRng};
        let pieces: [&[u8]; 9] = [
            b"/",
            b".",
            b"..",
            b".wh.",
            b".wh..wh..opq",
            b"a",
            b"\0",
            b"//",
            b"./",
        ];
        let mut rng = rand::rngs::StdRng::seed_from_u64(33);
        for _ in 0..20_000 {
            let mut name = Vec::new();
            for _ in 0..rng.random_range(0..8) {
                name.extend_from_slice(pieces[rng.random_range(0..pieces.len())]);
            }
            let plain = |parts: &[Vec<u8>]| {
                parts.iter().all(|p| {
                    !p.is_empty()
                        && p != b"."
                        && p != b".."
                        && !p.contains(&b'/')
                        && !p.contains(&0)
                })
            };
            match classify(&name) {
                Err(_) | Ok(Action::Skip) => {}
                Ok(Action::Put(parts)) => assert!(!parts.is_empty() && plain(&parts), "{name:?}"),
                Ok(Action::Opaque { dir }) => assert!(plain(&dir), "{name:?}"),
                Ok(Action::Whiteout { dir, name: gone }) => {
                    assert!(plain(&dir) && plain(&[gone]), "{name:?}")
                }
            }
        }
    }

    #[test]
    fn digests_and_member_paths() {
        let hex = "ab".repeat(32);
        assert_eq!(Digest::parse(&format!("sha256:{hex}")).unwrap().hex, hex);
        assert!(Digest::parse(&format!("sha512:{hex}")).is_err());
        assert!(Digest::parse("sha256:../../etc").is_err());
        assert_eq!(member_path("./blobs/sha256/x").unwrap(), "blobs/sha256/x");
        assert!(member_path("../x").is_err() && member_path("/x").is_err());
        assert!(member_path("a//b").is_err());
    }

    #[test]
    fn compressions() {
        assert_eq!(
            compression("application/vnd.oci.image.layer.v1.tar+gzip", &[0x1f, 0x8b]).unwrap(),
            Compression::Gzip
        );
        assert_eq!(compression("", b"usr/").unwrap(), Compression::None);
        assert_eq!(
            compression("", &[0x1f, 0x8b, 8]).unwrap(),
            Compression::Gzip
        );
        let zstd = compression("application/vnd.oci.image.layer.v1.tar+zstd", b"x").unwrap_err();
        assert!(zstd.message.contains("zstd"), "{zstd}");
        assert!(compression("", &[0x28, 0xb5, 0x2f, 0xfd]).is_err());
        assert!(compression("application/x-weird", b"").is_err());
    }

    #[test]
    fn manifests_configs_and_names() {
        let index: Index = parse_json(
            br#"{"schemaVersion":2,"manifests":[
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1","size":1,
               "platform":{"architecture":"arm64","os":"linux"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2","size":2,
               "platform":{"architecture":"amd64","os":"linux"}}]}"#,
            "index",
        )
        .unwrap();
        assert_eq!(pick_manifest(&index).unwrap().digest, "sha256:2");
        assert!(pick_manifest(&Index { manifests: vec![] }).is_err());
        // A list of other platforms only: they are named.
        let arm: Index = parse_json(
            br#"{"schemaVersion":2,"manifests":[
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1","size":1,
               "platform":{"architecture":"arm64","os":"linux","variant":"v8"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2","size":2,
               "platform":{"architecture":"arm","os":"linux","variant":"v7"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:3","size":3,
               "platform":{"architecture":"unknown","os":"unknown"}}]}"#,
            "index",
        )
        .unwrap();
        let err = pick_manifest(&arm).unwrap_err();
        assert!(
            err.message
                .contains("(linux/arm64/v8, linux/arm/v7), none for linux/amd64"),
            "{err}"
        );
        // A layout of several tagged images, none with a platform: the tags are named.
        let tagged: Index = parse_json(
            br#"{"schemaVersion":2,"manifests":[
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1","size":1,
               "annotations":{"org.opencontainers.image.ref.name":"base"}},
              {"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:2","size":2,
               "annotations":{"org.opencontainers.image.ref.name":"app"}}]}"#,
            "index",
        )
        .unwrap();
        let err = pick_manifest(&tagged).unwrap_err();
        assert!(
            err.message.contains("2 images (base, app)") && err.message.contains("oci:DIR:TAG"),
            "{err}"
        );
        let config: ImageConfig = parse_json(
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["A=1"],"WorkingDir":"/w",
                "Cmd":["sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:x"]}}"#,
            "config",
        )
        .unwrap();
        config.check_platform("the image").expect("linux/amd64");
        let unnamed: ImageConfig = parse_json(b"{}", "config").unwrap();
        unnamed
            .check_platform("the image")
            .expect("no platform named");
        let arm: ImageConfig =
            parse_json(br#"{"architecture":"arm64","os":"linux"}"#, "config").unwrap();
        let err = arm.check_platform("the image").unwrap_err();
        assert!(err.message.contains("is for linux/arm64"), "{err}");
        let run = config.config.unwrap();
        assert_eq!(run.env, Some(vec!["A=1".to_owned()]));
        assert_eq!(run.working_dir.as_deref(), Some("/w"));
        assert!(run.entrypoint.is_none());
        let docker: Vec<DockerEntry> = parse_json(
            br#"[{"Config":"c.json","RepoTags":["x:1"],"Layers":["a/layer.tar"]}]"#,
            "manifest.json",
        )
        .unwrap();
        assert_eq!(docker[0].layers, ["a/layer.tar"]);
        assert_eq!(default_name("My_Image.tar"), "my-image");
        assert_eq!(default_name("..."), "imported");
        assert!(default_name(&"x".repeat(80)).len() <= 32);
    }
}
