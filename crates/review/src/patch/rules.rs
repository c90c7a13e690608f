//! The sensitive-path table: every rule that flags a changed path, as data, in one place.
//! `sensitive.rs` applies it; [`markdown`] renders it for the README (a unit test keeps the
//! README's copy equal to this one).

use super::names::Component;
use super::SensitiveKind;

/// One rule: what it flags, and how a reason names the file.
pub(super) struct Rule {
    pub kind: SensitiveKind,
    /// What the file is, for a reason ("adds {what} {path}").
    pub what: &'static str,
    pub when: When,
}

/// When a rule applies. Names are compared in their normal form (see `names.rs`).
pub(super) enum When {
    /// A path that contains this run of components (the file under the directory, or an
    /// entry named like it).
    Under(&'static [&'static str]),
    /// A file with this name, in any directory.
    Named(&'static str),
    /// A file with this name directly in a directory with this name.
    NamedIn(&'static str, &'static str),
    /// A file whose name ends like this (`x.dockerfile`).
    Suffix(&'static str),
    /// A TOML file with this name, when a change touches one of these tables or keys (`*`
    /// matches one dotted part). When the host cannot compare both sides it flags the file.
    TomlKeys(&'static str, &'static [&'static str]),
    /// A rule that looks at more than the name; `sensitive.rs` implements each.
    Check(Check, &'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    GitDir,
    HooksPath,
    NpmScripts,
    NpmDependencies,
    Symlink,
    NewExecutable,
    ExecutableContent,
    UnusualName,
    UnreadableEntry,
}

impl When {
    /// Whether a path (its normal-form components) matches a name rule.
    pub fn matches(&self, components: &[Component]) -> bool {
        let Some((name, dirs)) = components.split_last() else {
            return false;
        };
        match *self {
            When::Under(run) => components
                .windows(run.len())
                .any(|w| w.iter().zip(run).all(|(c, r)| c.is(r))),
            When::Named(n) | When::TomlKeys(n, _) => name.is(n),
            When::NamedIn(dir, n) => name.is(n) && dirs.last().is_some_and(|d| d.is(dir)),
            When::Suffix(suffix) => name.ends_with(suffix),
            When::Check(..) => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            When::Under(run) => format!("`{}/`", run.join("/")),
            When::Named(n) => format!("`{n}`"),
            When::NamedIn(dir, n) => format!("`{dir}/{n}`"),
            When::Suffix(s) => format!("`*{s}`"),
            When::TomlKeys(n, keys) => {
                let keys: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
                format!("`{n}` when a change touches {}", keys.join(", "))
            }
            When::Check(_, text) => (*text).to_owned(),
        }
    }
}

const fn rule(kind: SensitiveKind, what: &'static str, when: When) -> Rule {
    Rule { kind, what, when }
}

use SensitiveKind::{
    AgentConfig, AgentInstructions, BuildConfig, CiWorkflow, ExecBit, GitConfig, GitHook,
    PackageScript, Symlink, UnreadableEntry, UnusualPath,
};
use When::{Named, NamedIn, Suffix, TomlKeys, Under};

/// The table. Order: by kind as the README lists them; a path matching several rules of one
/// kind is flagged once, with the first rule's wording.
#[rustfmt::skip]
pub(super) const RULES: &[Rule] = &[
    rule(GitHook, "git hook", Under(&[".git", "hooks"])),
    rule(GitHook, "git hook", Under(&[".husky"])),
    rule(GitHook, "pre-commit hook configuration", Named(".pre-commit-config.yaml")),
    rule(GitHook, "git hook", When::Check(Check::HooksPath,
        "a `core.hooksPath` setting added to a git config file")),
    rule(GitConfig, "git submodules file", Named(".gitmodules")),
    rule(GitConfig, "git attributes file", Named(".gitattributes")),
    rule(GitConfig, "git config file", NamedIn(".git", "config")),
    rule(GitConfig, "git config file", Named(".gitconfig")),
    rule(GitConfig, "git's own directory", When::Check(Check::GitDir,
        "any path inside a `.git` directory, in any case or look-alike spelling: the host \
         refuses the whole patch (not verified)")),
    rule(CiWorkflow, "CI configuration", Under(&[".github", "workflows"])),
    rule(CiWorkflow, "GitHub action", Under(&[".github", "actions"])),
    rule(CiWorkflow, "CI configuration", Named(".gitlab-ci.yml")),
    rule(CiWorkflow, "CI configuration", Under(&[".circleci"])),
    rule(CiWorkflow, "CI configuration", Named("azure-pipelines.yml")),
    rule(CiWorkflow, "CI configuration", Named("azure-pipelines.yaml")),
    rule(CiWorkflow, "CI configuration", Named("Jenkinsfile")),
    rule(CiWorkflow, "CI configuration", Under(&[".buildkite"])),
    rule(CiWorkflow, "CI configuration", Named(".travis.yml")),
    rule(PackageScript, "npm package", When::Check(Check::NpmScripts,
        "`package.json` when its `scripts` change")),
    rule(PackageScript, "npm package", When::Check(Check::NpmDependencies,
        "`package.json` when a dependency is added or changed to come from git, a file, a \
         link or a URL (`git+…`, `github:…`, `file:…`, `link:…`, `https:…`, `owner/repo`)")),
    rule(PackageScript, "Cargo build script", Named("build.rs")),
    rule(PackageScript, "Cargo manifest", TomlKeys("Cargo.toml", &[
        "package.build", "package.links", "lib.proc-macro", "lib.proc_macro",
        "build-dependencies", "build_dependencies", "target.*.build-dependencies",
        "target.*.build_dependencies",
    ])),
    rule(PackageScript, "Python setup script", Named("setup.py")),
    rule(PackageScript, "setuptools configuration", Named("setup.cfg")),
    rule(PackageScript, "Python project file", TomlKeys("pyproject.toml", &[
        "build-system", "project.scripts", "project.gui-scripts", "project.entry-points",
        "tool.setuptools", "tool.hatch", "tool.poetry.build", "tool.poetry.scripts",
        "tool.poetry.plugins", "tool.pdm.build", "tool.pdm.scripts", "tool.flit",
        "tool.maturin", "tool.scikit-build",
    ])),
    rule(PackageScript, "make build file", Named("Makefile")),
    rule(PackageScript, "make build file", Named("GNUmakefile")),
    rule(PackageScript, "npm configuration", Named(".npmrc")),
    rule(PackageScript, "yarn configuration (its yarnPath runs a file as yarn)",
        Named(".yarnrc.yml")),
    rule(PackageScript, "yarn configuration", Named(".yarnrc")),
    rule(PackageScript, "pnpm hook file", Named(".pnpmfile.cjs")),
    rule(PackageScript, "node-gyp build file (runs on npm install)", Named("binding.gyp")),
    rule(PackageScript, "Cargo configuration", NamedIn(".cargo", "config.toml")),
    rule(PackageScript, "Cargo configuration", NamedIn(".cargo", "config")),
    rule(BuildConfig, "direnv file (runs when you enter the directory)", Named(".envrc")),
    rule(BuildConfig, "pytest plugin file (runs with the tests)", Named("conftest.py")),
    rule(BuildConfig, "tox configuration", Named("tox.ini")),
    rule(BuildConfig, "Rust toolchain file", Named("rust-toolchain.toml")),
    rule(BuildConfig, "Rust toolchain file", Named("rust-toolchain")),
    rule(BuildConfig, "container build file", Named("Dockerfile")),
    rule(BuildConfig, "container build file", Suffix(".dockerfile")),
    rule(BuildConfig, "container build file", Named("Containerfile")),
    rule(BuildConfig, "just recipe file", Named("justfile")),
    rule(BuildConfig, "just recipe file", Named(".justfile")),
    rule(BuildConfig, "CMake build file", Named("CMakeLists.txt")),
    rule(AgentConfig, "coding-agent configuration", Named(".mcp.json")),
    rule(AgentConfig, "coding-agent configuration", Under(&[".claude"])),
    rule(AgentConfig, "coding-agent configuration", Under(&[".cursor"])),
    rule(AgentConfig, "editor configuration", Under(&[".vscode"])),
    rule(AgentConfig, "editor configuration", Under(&[".idea"])),
    rule(AgentConfig, "dev container configuration", Under(&[".devcontainer"])),
    rule(AgentConfig, "coding-agent instructions", Named("AGENTS.md")),
    rule(AgentConfig, "coding-agent instructions", Named("CLAUDE.md")),
    rule(AgentInstructions, "coding-agent instructions", Named("GEMINI.md")),
    rule(AgentInstructions, "coding-agent instructions", Named(".cursorrules")),
    rule(AgentInstructions, "coding-agent instructions", Named(".windsurfrules")),
    rule(AgentInstructions, "coding-agent instructions", Under(&[".clinerules"])),
    rule(AgentInstructions, "coding-agent instructions",
        NamedIn(".github", "copilot-instructions.md")),
    rule(AgentInstructions, "coding-agent instructions", Under(&[".github", "instructions"])),
    rule(Symlink, "symlink", When::Check(Check::Symlink,
        "a symlink added or changed (the reason names its target, and says when it leaves the \
         repository)")),
    rule(ExecBit, "executable", When::Check(Check::NewExecutable,
        "a file that becomes executable (new file with mode 755, or mode change to 755)")),
    rule(ExecBit, "executable", When::Check(Check::ExecutableContent,
        "a content change to a file that is already executable")),
    rule(UnusualPath, "unusual name", When::Check(Check::UnusualName,
        "a name with control characters (newline, tab, escape…), bytes that are not UTF-8, \
         bidirectional or invisible characters, leading or trailing spaces or a trailing dot; \
         or a look-alike of a sensitive name (it normalises onto one under Unicode case folding \
         and NFKC, an 8.3 short name such as `GITHUB~1`, or trailing dots and spaces), which is \
         flagged with the real kind too")),
    rule(UnreadableEntry, "unreadable entry", When::Check(Check::UnreadableEntry,
        "an entry of the patch the host parser cannot read: it is counted as a changed file, \
         the names it seems to touch are flagged as above, and the patch is not verified")),
];

/// The table as README markdown: one row per kind, its rules joined.
pub(crate) fn markdown() -> String {
    let mut out = String::from("| kind | flags |\n|---|---|\n");
    for kind in SensitiveKind::ALL {
        let rules: Vec<String> = RULES
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.when.describe())
            .collect();
        out.push_str(&format!("| `{}` | {} |\n", kind.as_str(), rules.join("; ")));
    }
    out
}
