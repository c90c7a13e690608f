//! Unit tests of the MCP host policy: roots, homes, git hosts, flags, images and allowHosts.

use super::*;
use base64::Engine as _;

fn policy_with(inputs: PolicyInputs) -> (Policy, Vec<String>) {
    let mut warnings = Vec::new();
    let policy = Policy::new(&inputs, &mut |w| warnings.push(w));
    (policy, warnings)
}

/// A temp tree: `home/` (with `.ssh/`), `projects/app`, `projects/app2`, `other/`.
struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        for sub in [
            "home/.ssh",
            "home/work/proj",
            "projects/app/src",
            "projects/app2",
            "other",
        ] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        Self { dir }
    }
    fn path(&self, rel: &str) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap().join(rel)
    }
    fn inputs(&self, roots: Option<&str>) -> PolicyInputs {
        PolicyInputs {
            roots: roots.map(str::to_owned),
            cwd: Some(self.path("projects")),
            homes: vec![self.path("home")],
            ..PolicyInputs::default()
        }
    }
}

fn s(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn default_root_is_the_working_directory() {
    let tree = Tree::new();
    let (policy, _) = policy_with(tree.inputs(None));
    assert_eq!(policy.roots(), &Roots::Dirs(vec![tree.path("projects")]));
    let app = tree.path("projects/app");
    assert_eq!(policy.check_project_path(&s(&app)).unwrap().path(), app);
    let err = policy
        .check_project_path(&s(&tree.path("other")))
        .unwrap_err();
    assert_eq!(
        (err.code, err.rule),
        (ErrorCode::PolicyDenied, "roots.outside")
    );
    assert!(err.message.contains(ENV_ROOTS), "{err}");
}

#[test]
fn roots_compare_by_components() {
    let tree = Tree::new();
    let root = tree.path("projects/app");
    let (policy, _) = policy_with(tree.inputs(Some(&s(&root))));
    assert!(policy.check_project_path(&s(&root.join("src"))).is_ok());
    let err = policy
        .check_project_path(&s(&tree.path("projects/app2")))
        .unwrap_err();
    assert_eq!(err.rule, "roots.outside");
}

#[test]
fn dot_dot_and_symlinks_resolve_before_the_check() {
    let tree = Tree::new();
    let root = tree.path("projects/app");
    let (policy, _) = policy_with(tree.inputs(Some(&s(&root))));
    let escape = format!("{}/../app2", s(&root));
    assert_eq!(
        policy.check_project_path(&escape).unwrap_err().rule,
        "roots.outside"
    );
    let inside = format!("{}/src/..", s(&root));
    assert_eq!(policy.check_project_path(&inside).unwrap().path(), root);
    // A symlink inside the root pointing at ~/.ssh.
    std::os::unix::fs::symlink(tree.path("home/.ssh"), root.join("keys")).unwrap();
    let err = policy
        .check_project_path(&s(&root.join("keys")))
        .unwrap_err();
    assert_eq!(err.rule, "roots.refused-home");
    assert!(err.message.contains(".ssh"), "{err}");
}

#[test]
fn home_its_ancestors_and_dot_dirs_are_always_refused() {
    let tree = Tree::new();
    let root = tree.path("");
    let (policy, warnings) =
        policy_with(tree.inputs(Some(&format!("{}:{}:/", s(&root), s(&tree.path("home"))))));
    // All three roots are refused paths themselves: ignored with a warning each.
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(matches!(policy.roots(), Roots::None { .. }));

    let (policy, _) = policy_with(tree.inputs(Some(&s(&tree.path("home/work")))));
    assert!(policy
        .check_project_path(&s(&tree.path("home/work/proj")))
        .is_ok());
    let homes = vec![tree.path("home")];
    for refused in ["home", "home/.ssh", "home/.aws/x", ""] {
        assert!(
            refused_reason(&tree.path(refused), &homes).is_some(),
            "{refused}"
        );
    }
    assert!(refused_reason(Path::new("/"), &homes).is_some());
    assert!(refused_reason(Path::new("/"), &[]).is_some());
    assert!(refused_reason(&tree.path("home/work/.git"), &homes).is_none());
}

#[test]
fn every_accounts_home_is_refused_and_other_peoples_whole() {
    let tree = Tree::new();
    for dir in [
        "users/alice/.ssh",
        "users/alice/proj",
        "srv/www/site",
        "srv/www/.cache",
        "users/shared/app",
    ] {
        std::fs::create_dir_all(tree.path(dir)).unwrap();
    }
    let mut inputs = tree.inputs(Some(&format!(
        "{}:{}",
        s(&tree.path("users")),
        s(&tree.path("srv"))
    )));
    inputs.accounts = vec![
        Account {
            home: tree.path("users/alice"),
            person: true,
        },
        Account {
            home: tree.path("srv/www"),
            person: false,
        },
        Account {
            home: PathBuf::from("/"),
            person: false,
        },
        Account {
            home: tree.path("nonexistent"),
            person: true,
        },
    ];
    let (policy, warnings) = policy_with(inputs);
    // `users` is an ancestor of alice's home: refused as a project, fine as a root.
    assert!(warnings.is_empty(), "{warnings:?}");
    for refused in [
        "users",
        "users/alice",
        "users/alice/.ssh",
        "users/alice/proj",
        "srv/www",
        "srv/www/.cache",
    ] {
        let err = policy
            .check_project_path(&s(&tree.path(refused)))
            .unwrap_err();
        assert_eq!(err.rule, "roots.refused-home", "{refused}: {err}");
    }
    for allowed in ["users/shared/app", "srv/www/site"] {
        assert!(
            policy.check_project_path(&s(&tree.path(allowed))).is_ok(),
            "{allowed}"
        );
    }
}

#[test]
fn started_from_home_or_root_has_no_default_root() {
    let tree = Tree::new();
    for cwd in [
        tree.path("home"),
        PathBuf::from("/"),
        tree.path("home/.config"),
    ] {
        let mut inputs = tree.inputs(None);
        inputs.cwd = Some(cwd.clone());
        let (policy, _) = policy_with(inputs);
        let err = policy
            .check_project_path(&s(&tree.path("projects/app")))
            .unwrap_err();
        assert_eq!(err.rule, "roots.none", "{cwd:?}");
        assert!(err.message.contains(ENV_ROOTS), "{err}");
    }
}

#[test]
fn an_empty_roots_variable_refuses_everything() {
    let tree = Tree::new();
    let (policy, _) = policy_with(tree.inputs(Some("")));
    let err = policy
        .check_project_path(&s(&tree.path("projects/app")))
        .unwrap_err();
    assert_eq!(err.rule, "roots.none");
    assert!(err.message.contains("empty"), "{err}");
}

#[test]
fn a_root_that_is_a_symlink_is_resolved() {
    let tree = Tree::new();
    let link = tree.path("other/link");
    std::os::unix::fs::symlink(tree.path("projects/app"), &link).unwrap();
    let (policy, _) = policy_with(tree.inputs(Some(&s(&link))));
    assert_eq!(
        policy.roots(),
        &Roots::Dirs(vec![tree.path("projects/app")])
    );
    assert!(policy
        .check_project_path(&s(&tree.path("projects/app/src")))
        .is_ok());
    assert!(policy.check_project_path(&s(&link.join("src"))).is_ok());
}

#[test]
fn malformed_and_missing_paths() {
    let tree = Tree::new();
    let (policy, _) = policy_with(tree.inputs(None));
    let err = policy.check_project_path("relative/path").unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    let missing = tree.path("projects/nope");
    let err = policy.check_project_path(&s(&missing)).unwrap_err();
    assert_eq!(
        (err.code, err.rule),
        (ErrorCode::InvalidArgument, "roots.missing")
    );
    // Outside the roots a missing path is refused like any other.
    let err = policy
        .check_project_path(&s(&tree.path("other/nope")))
        .unwrap_err();
    assert_eq!(err.rule, "roots.outside");
    let file = tree.path("projects/file");
    std::fs::write(&file, "x").unwrap();
    assert_eq!(
        policy.check_project_path(&s(&file)).unwrap_err().rule,
        "roots.not-directory"
    );
}

fn git_policy(hosts: Option<&str>) -> Policy {
    let inputs = PolicyInputs {
        git_hosts: hosts.map(str::to_owned),
        ..PolicyInputs::default()
    };
    policy_with(inputs).0
}

#[test]
fn git_urls_good() {
    let policy = git_policy(None);
    for (url, normalized) in [
        ("https://github.com/o/r.git", "https://github.com/o/r.git"),
        ("HTTPS://GitHub.COM/o/r", "https://github.com/o/r"),
        ("https://github.com./o/r", "https://github.com/o/r"),
        (
            "https://gitlab.com:443/group/sub/r.git",
            "https://gitlab.com:443/group/sub/r.git",
        ),
        (
            "ssh://git@github.com/o/r.git",
            "ssh://git@github.com/o/r.git",
        ),
        ("ssh://github.com:22/o/r.git", "ssh://github.com:22/o/r.git"),
        ("git@github.com:o/r.git", "git@github.com:o/r.git"),
        ("git@bitbucket.org:o/r", "git@bitbucket.org:o/r"),
    ] {
        assert_eq!(
            policy.check_repository_url(url).map(|u| u.to_string()),
            Ok(normalized.to_owned()),
            "{url}"
        );
    }
}

#[test]
fn git_urls_bad() {
    let policy = git_policy(None);
    for (url, rule) in [
        ("http://github.com/o/r", "git.transport"),
        ("git://github.com/o/r", "git.transport"),
        ("file:///etc/passwd", "git.transport"),
        ("ext::sh -c touch% /tmp/x", "git.characters"),
        ("ext::sh", "git.transport"),
        ("fd::3", "git.transport"),
        ("/srv/repo.git", "git.local"),
        ("./repo", "git.local"),
        ("~/repo", "git.local"),
        ("repo", "git.local"),
        ("-uhttps://github.com/o/r", "git.option"),
        ("--upload-pack=touch /tmp/x", "git.characters"),
        ("https://github.com@evil.example/o/r", "git.userinfo"),
        ("https://user:pw@github.com/o/r", "git.userinfo"),
        ("ssh://a@b@github.com/o/r", "git.userinfo"),
        ("ssh://-oProxyCommand=x@github.com/o/r", "git.userinfo"),
        ("https://evil.example/o/r", "git.host"),
        ("https://github.com.evil.example/o/r", "git.host"),
        ("https://github%2ecom/o/r", "git.host"),
        ("https://127.0.0.1/o/r", "git.host"),
        ("https://[::1]/o/r", "git.host"),
        ("https://0x7f.1/o/r", "git.host"),
        ("https://github.com", "git.shape"),
        ("https://github.com/", "git.shape"),
        ("https://github.com#@evil.example/o/r", "git.shape"),
        ("https://github.com:0/o/r", "git.shape"),
        ("https://github.com:99999/o/r", "git.shape"),
        ("https://github.com:x/o/r", "git.shape"),
        ("https://github.com/o/r\n", "git.characters"),
        ("https://github.com/o r", "git.characters"),
        ("https://github.com/o/r\u{7f}", "git.characters"),
        ("https://github.com\\@evil.example/o/r", "git.shape"),
        ("github.com:o/r", "git.shape"),
        ("git@github.com:-oProxyCommand=x", "git.shape"),
        ("git@evil.example:o/r", "git.host"),
        ("https://github.com/o/r\u{200b}", "git.characters"),
        ("https://github.com/o/\u{e9}", "git.characters"),
        ("", "git.empty"),
    ] {
        let err = policy.check_repository_url(url).unwrap_err();
        assert_eq!(err.rule, rule, "{url:?}: {err}");
    }
}

#[test]
fn git_hosts_variable_and_idna() {
    let (policy, warnings) = policy_with(PolicyInputs {
        git_hosts: Some(
            " Git.Example.COM. , bücher.example,127.0.0.1,[::1],bad host,a-.example".into(),
        ),
        ..PolicyInputs::default()
    });
    assert_eq!(
        policy.git_hosts(),
        &["git.example.com", "xn--bcher-kva.example"]
    );
    // Every ignored entry is named in a warning: IP addresses are not git hosts.
    for ignored in ["127.0.0.1", "[::1]", "bad host", "a-.example"] {
        assert!(
            warnings.iter().any(|w| w.contains(&format!("{ignored:?}"))),
            "{ignored}: {warnings:?}"
        );
    }
    assert!(policy
        .check_repository_url("https://git.example.com/o/r")
        .is_ok());
    assert_eq!(
        policy
            .check_repository_url("https://BÜCHER.example/o/r")
            .unwrap()
            .to_string(),
        "https://xn--bcher-kva.example/o/r"
    );
    // Listed or not, an IP literal is not a host the clone's egress proxy opens.
    assert_eq!(
        policy
            .check_repository_url("https://127.0.0.1/o/r")
            .unwrap_err()
            .rule,
        "git.host"
    );
    assert!(policy
        .check_repository_url("https://github.com/o/r")
        .is_err());
    let none = git_policy(Some(""));
    assert!(none.git_hosts().is_empty());
    assert!(none.check_repository_url("https://github.com/o/r").is_err());
}

#[test]
fn network_flags() {
    let (closed, _) = policy_with(PolicyInputs::default());
    assert!(closed.check_network("none").is_ok());
    let err = closed.check_network("filtered").unwrap_err();
    assert!(err.message.contains(ENV_ALLOW_FILTERED), "{err}");
    let err = closed.check_network("nat").unwrap_err();
    assert!(err.message.contains(ENV_ALLOW_NAT), "{err}");
    let (open, warnings) = policy_with(PolicyInputs {
        allow_filtered: Some("1".into()),
        allow_nat: Some("yes".into()),
        ..PolicyInputs::default()
    });
    assert!(open.check_network("filtered").is_ok());
    assert!(open.check_network("nat").is_err());
    assert_eq!(warnings.len(), 1);
}

/// An OpenSSH-format key as ssh-keygen lays it out (magic, then the key blobs).
fn openssh_key() -> String {
    let mut blob = b"openssh-key-v1\0".to_vec();
    blob.extend_from_slice(&[0, 0, 0, 4]);
    blob.extend_from_slice(b"none");
    blob.extend_from_slice(&[7u8; 100]);
    let body = base64::engine::general_purpose::STANDARD.encode(blob);
    let lines: Vec<String> = body
        .as_bytes()
        .chunks(70)
        .map(|c| String::from_utf8(c.to_vec()).unwrap())
        .collect();
    format!(
        "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
        lines.join("\n")
    )
}

#[test]
fn ssh_key_shapes() {
    let openssh = openssh_key();
    assert!(is_ssh_private_key(openssh.as_bytes()));
    let body = base64::engine::general_purpose::STANDARD.encode([0x30u8; 40]);
    let rsa = format!("-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----\n");
    assert!(is_ssh_private_key(rsa.as_bytes()));
    let encrypted = format!(
        "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\n{body}\n-----END EC PRIVATE KEY-----"
    );
    assert!(is_ssh_private_key(encrypted.as_bytes()));
    for bad in [
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB user@host".to_owned(),
        "-----BEGIN OPENSSH PRIVATE KEY-----\n!!!!\n-----END OPENSSH PRIVATE KEY-----".to_owned(),
        openssh.replace("b3Blbn", "AAAAAA"),
        format!("{openssh}trailing"),
        rsa.replace("RSA PRIVATE KEY-----\n", "RSA PRIVATE KEY-----\n-----"),
        "secret".to_owned(),
    ] {
        assert!(!is_ssh_private_key(bad.as_bytes()), "{bad}");
    }
}

#[test]
fn ssh_key_file_rules() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id");
    std::fs::write(&key, openssh_key()).unwrap();
    let not_key = dir.path().join("notes");
    std::fs::write(&not_key, "TOP-SECRET-CONTENT").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&key, &link).unwrap();

    let (closed, _) = policy_with(PolicyInputs::default());
    assert_eq!(
        closed.check_ssh_key(&s(&key)).unwrap_err().rule,
        "ssh-key.flag"
    );
    let (open, _) = policy_with(PolicyInputs {
        allow_ssh_key: Some("1".into()),
        ..PolicyInputs::default()
    });
    assert_eq!(open.check_ssh_key(&s(&key)).unwrap(), key);
    let err = open.check_ssh_key(&s(&not_key)).unwrap_err();
    assert_eq!(
        (err.code, err.rule),
        (ErrorCode::PolicyDenied, "ssh-key.format")
    );
    assert!(!err.message.contains("TOP-SECRET"), "{err}");
    assert_eq!(
        open.check_ssh_key(&s(&link)).unwrap_err().rule,
        "ssh-key.format"
    );
    assert_eq!(
        open.check_ssh_key(&s(dir.path())).unwrap_err().rule,
        "ssh-key.format"
    );
    assert_eq!(
        open.check_ssh_key(&s(&dir.path().join("missing")))
            .unwrap_err()
            .rule,
        "ssh-key.file"
    );
    assert_eq!(
        open.check_ssh_key("id").unwrap_err().code,
        ErrorCode::InvalidArgument
    );
}

fn images_policy(value: Option<&str>) -> (Policy, Vec<String>) {
    policy_with(PolicyInputs {
        images: value.map(str::to_owned),
        ..PolicyInputs::default()
    })
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

/// Images on the host, all built here.
fn built_images(list: &[&str]) -> HostImages {
    HostImages {
        names: names(list),
        built: names(list),
    }
}

#[test]
fn images_default_to_those_on_the_host() {
    let (policy, _) = images_policy(None);
    let on_host = built_images(&["debian", "tools"]);
    for name in ["host", "debian", "tools"] {
        assert_eq!(policy.check_image(name, &on_host).unwrap(), name);
    }
    // `host` is always there, whatever the store lists.
    assert_eq!(
        policy.check_image("host", &HostImages::default()).unwrap(),
        "host"
    );
    for refused in ["debian", "registry.example/team/tool:1"] {
        let err = policy
            .check_image(refused, &HostImages::default())
            .unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::PolicyDenied, "image.not-on-host"),
            "{refused}"
        );
        assert!(err.message.contains(ENV_IMAGES), "{err}");
        assert!(err.message.contains("(host)"), "{err}");
    }
    let err = policy.check_image("alpine", &on_host).unwrap_err();
    assert!(err.message.contains("host, debian, tools"), "{err}");
    // A name with two builds (a tag pulled again after it moved) is offered once.
    let err = policy
        .check_image("alpine", &built_images(&["tools", "debian", "tools"]))
        .unwrap_err();
    assert!(err.message.contains("(host, tools, debian)"), "{err}");
    assert!(
        policy.summary().contains("images=(unset"),
        "{}",
        policy.summary()
    );
}

#[test]
fn the_images_variable_names_built_and_prefixes() {
    let (policy, warnings) = images_policy(Some(
        " debian , @BUILT, registry.example/team/ ,,tool.example/x:1",
    ));
    assert!(warnings.is_empty(), "{warnings:?}");
    let on_host = built_images(&["tools", "registry.example/team/app:2"]);
    // A listed name passes whether or not it is built (the engine says how to build it).
    assert_eq!(
        policy
            .check_image("debian", &HostImages::default())
            .unwrap(),
        "debian"
    );
    // @built: what was built here, not the host image.
    assert_eq!(policy.check_image("tools", &on_host).unwrap(), "tools");
    let err = policy.check_image("host", &on_host).unwrap_err();
    assert_eq!(err.rule, "image.not-allowed", "{err}");
    assert!(
        err.message
            .contains("DYNOCAP_MCP_IMAGES=debian,@built,registry.example/team/,tool.example/x:1"),
        "{err}"
    );
    // A reference under a prefix: used when on the host, else allowed for the caller to
    // pull (within DYNOCAP_REGISTRIES, the engine's check).
    for wanted in [
        "registry.example/team/app:2",
        "registry.example/team/app:3",
        "registry.example/team/sub/app@sha256:00ff",
        "tool.example/x:1",
    ] {
        assert_eq!(policy.check_image(wanted, &on_host).unwrap(), wanted);
    }
    // Not under the prefix: a sibling repository, another registry, a look-alike.
    for outside in [
        "registry.example/teamx/app:1",
        "registry.example/app:1",
        "registry.example.evil/team/app:1",
        "tool.example/x:2",
        "alpine",
    ] {
        let err = policy.check_image(outside, &on_host).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::PolicyDenied, "image.not-allowed"),
            "{outside}"
        );
    }
    let summary = policy.summary();
    assert!(
        summary.contains("images=debian,@built,registry.example/team/,tool.example/x:1"),
        "{summary}"
    );
}

/// An entry that looks like a prefix but lacks its `/` is an exact name, which no image can
/// have: said at start, and a sibling with the same start is not admitted by it.
#[test]
fn a_prefix_without_its_slash_is_a_name_and_is_said_to_admit_nothing() {
    let (policy, warnings) = images_policy(Some(
        "reg.example/team,reg.example:5000/x/,reg.example/ok/tool:1",
    ));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(ENV_IMAGES) && warnings[0].contains("reg.example/team/"),
        "{warnings:?}"
    );
    for outside in [
        "reg.example/team-evil/x:1",
        "reg.example/teamx:1",
        "reg.example/team/x:1",
        "reg.example:50001/x/y:1",
        "reg.example/x/y:1",
    ] {
        let err = policy
            .check_image(outside, &HostImages::default())
            .unwrap_err();
        assert_eq!(err.rule, "image.not-allowed", "{outside}");
    }
    for inside in [
        "reg.example:5000/x/y:1",
        "reg.example:5000/x/y@sha256:00ff",
        "reg.example/ok/tool:1",
    ] {
        assert_eq!(
            policy.check_image(inside, &HostImages::default()).unwrap(),
            inside
        );
    }
}

#[test]
fn malformed_images_are_invalid_and_bad_entries_ignored() {
    let (policy, warnings) = images_policy(Some(
        "@all,registry.example/../x/,a b,registry.example//,ok/",
    ));
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    for warning in &warnings {
        assert!(warning.starts_with(ENV_IMAGES), "{warning}");
    }
    assert_eq!(
        policy
            .check_image("ok/app", &HostImages::default())
            .unwrap(),
        "ok/app"
    );
    for bad in [
        "",
        "-x",
        ".hidden",
        "registry.example/team/../../other/app",
        "registry.example/team/./app",
        "registry.example/team//app",
        "registry.example/team/",
        "a b",
        "deb\u{ed}an",
        "x\n",
        &"a".repeat(256),
    ] {
        let err = policy.check_image(bad, &HostImages::default()).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::InvalidArgument, "image.shape"),
            "{bad:?}"
        );
    }
    // Set but empty: the caller may not choose; the default still applies.
    let (empty, _) = images_policy(Some(""));
    let err = empty
        .check_image("host", &HostImages::default())
        .unwrap_err();
    assert_eq!(err.rule, "image.not-allowed");
    assert!(err.message.contains("is empty"), "{err}");
    assert!(
        empty.summary().contains("images=(none"),
        "{}",
        empty.summary()
    );
}

fn hosts_policy(value: Option<&str>) -> (Policy, Vec<String>) {
    policy_with(PolicyInputs {
        egress_allow: value.map(str::to_owned),
        ..PolicyInputs::default()
    })
}

fn allow(policy: &Policy, network: &str, hosts: &[&str]) -> Result<Vec<String>, Refusal> {
    let parsed = policy.parse_allow_hosts(network, &names(hosts))?;
    policy.check_allow_hosts(&parsed)
}

#[test]
fn allow_hosts_need_the_hosts_variable() {
    let (policy, _) = hosts_policy(None);
    assert_eq!(
        allow(&policy, "filtered", &[]).unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(allow(&policy, "none", &[]).unwrap(), Vec::<String>::new());
    let err = allow(&policy, "filtered", &["example.com"]).unwrap_err();
    assert_eq!(
        (err.code, err.rule),
        (ErrorCode::PolicyDenied, "allow-hosts.none")
    );
    assert!(err.message.contains(ENV_EGRESS_ALLOW), "{err}");
    assert!(policy.summary().contains("egress_allow=(none)"));
}

#[test]
fn allow_hosts_lie_within_the_hosts_variable() {
    let (policy, warnings) = hosts_policy(Some(
        "api.example.com, *.cdn.example, @pypi, Bücher.example",
    ));
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        allow(
            &policy,
            "filtered",
            &[
                "API.example.com.",
                "a.cdn.example",
                "*.cdn.example",
                "*.img.cdn.example",
                "@PyPI",
                "files.pythonhosted.org",
                "xn--bcher-kva.example",
            ]
        )
        .unwrap(),
        names(&[
            "api.example.com",
            "a.cdn.example",
            "*.cdn.example",
            "*.img.cdn.example",
            "pypi.org",
            "files.pythonhosted.org",
            "xn--bcher-kva.example",
        ])
    );
    for outside in [
        "example.com",
        "*.example.com",
        "cdn.example",
        "evil-cdn.example",
        "api.example.com.evil",
        "@npm",
    ] {
        let err = allow(&policy, "filtered", &[outside]).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::PolicyDenied, "allow-hosts.outside"),
            "{outside}"
        );
        assert!(
            err.message.contains(
                "not within DYNOCAP_MCP_EGRESS_ALLOW \
                 (api.example.com,*.cdn.example,@pypi,Bücher.example)"
            ),
            "{err}"
        );
    }
    // A registry is covered only when every host it stands for is.
    let (partial, _) = hosts_policy(Some("pypi.org"));
    let err = allow(&partial, "filtered", &["@pypi"]).unwrap_err();
    assert!(err.message.contains("files.pythonhosted.org"), "{err}");
    let (wild, _) = hosts_policy(Some("*.pythonhosted.org,pypi.org"));
    assert_eq!(
        allow(&wild, "filtered", &["@pypi"]).unwrap(),
        names(&["pypi.org", "files.pythonhosted.org"])
    );
}

#[test]
fn allow_hosts_malformed_or_without_filtered_are_invalid() {
    let (policy, warnings) = hosts_policy(Some("example.com,@nope,10.0.0.1,*.com"));
    assert_eq!(warnings.len(), 3, "{warnings:?}");
    assert!(policy.summary().ends_with(" egress_allow=example.com"));
    for network in ["none", "nat"] {
        let err = allow(&policy, network, &["example.com"]).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::InvalidArgument, "allow-hosts.network"),
            "{network}"
        );
        assert!(err.message.contains("\"filtered\""), "{err}");
    }
    for bad in [
        "",
        "@nope",
        "10.0.0.1",
        "https://example.com/",
        "*.com",
        "a*.example.com",
    ] {
        let err = allow(&policy, "filtered", &[bad]).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::InvalidArgument, "allow-hosts.entry"),
            "{bad:?}"
        );
    }
    let many: Vec<String> = (0..65).map(|i| format!("h{i}.example.com")).collect();
    let err = policy.parse_allow_hosts("filtered", &many).unwrap_err();
    assert_eq!(err.rule, "allow-hosts.count");
}

#[test]
fn built_admits_only_images_built_here() {
    let (policy, _) = images_policy(Some("@built"));
    let on_host = HostImages {
        names: names(&["debian", "tools", "registry.example/team/app:2", "saved"]),
        built: names(&["debian", "tools"]),
    };
    for built in ["debian", "tools"] {
        assert_eq!(policy.check_image(built, &on_host).unwrap(), built);
    }
    // Pulled or imported as it came: someone else's build, which the host names itself.
    for other in ["registry.example/team/app:2", "saved", "host"] {
        let err = policy.check_image(other, &on_host).unwrap_err();
        assert_eq!(
            (err.code, err.rule),
            (ErrorCode::PolicyDenied, "image.not-allowed"),
            "{other}"
        );
        assert!(err.message.contains("dynocap image build"), "{err}");
    }
    // Not on the host at all: nothing for @built to admit, and no word about builds.
    let err = policy.check_image("tools2", &on_host).unwrap_err();
    assert!(!err.message.contains("dynocap image build"), "{err}");
}

/// A name counts as built by its newest image, the one a start by that name boots: an import
/// made over a build under the same name is not admitted by `@built`, a rebuild over an
/// import is.
#[test]
fn built_goes_by_a_names_newest_image() {
    let (policy, _) = images_policy(Some("@built"));
    // Oldest first, as `dynocap image ls` lists them.
    let on_host = HostImages::from_listing([
        ("tool".to_owned(), true),
        ("app".to_owned(), false),
        ("tool".to_owned(), false),
        ("app".to_owned(), true),
        ("debian".to_owned(), true),
    ]);
    assert_eq!(on_host.built, names(&["app", "debian"]));
    assert_eq!(on_host.names.len(), 5);
    let err = policy.check_image("tool", &on_host).unwrap_err();
    assert_eq!(
        (err.code, err.rule),
        (ErrorCode::PolicyDenied, "image.not-allowed")
    );
    for built in ["app", "debian"] {
        assert_eq!(policy.check_image(built, &on_host).unwrap(), built);
    }
}
