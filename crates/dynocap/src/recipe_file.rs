//! An image recipe as the user gives it, `dynocap image build NAME --from BASE` with step
//! flags or `--file recipe.toml`, made into the engine's [`RecipeRequest`].
//!
//! The file is strict: a key this format does not have is refused by name, so a typo never
//! silently builds another image.
//!
//! ```toml
//! from = "busybox"             # the base image (or --from)
//! network = "none"             # none, filtered or nat (or --network)
//! allow-hosts = ["@debian"]
//! timeout = 7200               # seconds for the whole build (or --timeout)
//! [[step]]
//! copy = "files/app.conf:/etc/app.conf"   # relative host paths: from the file's directory
//! [[step]]
//! env = "APP_MODE=test"
//! [[step]]
//! apt = ["jq"]
//! [[step]]
//! run = "echo built > /etc/built-by"
//! ```

use std::path::Path;

use dynocap_engine::image::recipe_layer::Step;
use dynocap_engine::image::unpack::Limits;
use dynocap_engine::image_recipe::RecipeRequest;
use dynocap_engine::Error;
use serde::Deserialize;

use crate::cli::ImageBuildArgs;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RecipeFile {
    from: Option<String>,
    network: Option<String>,
    #[serde(default)]
    allow_hosts: Vec<String>,
    /// Seconds the whole build may take (`--timeout` wins).
    timeout: Option<u64>,
    #[serde(default)]
    step: Vec<FileStep>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
enum FileStep {
    Run(String),
    Apt(Packages),
    Copy(String),
    Env(String),
}

/// An `apt` step's packages: a list, or one package as a string (`apt = "jq"`), as the
/// `--apt` flag takes one at a time.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Packages {
    One(String),
    Many(Vec<String>),
}

impl Packages {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(package) => vec![package],
            Self::Many(packages) => packages,
        }
    }
}

/// The TOML parser's words for a `[[step]]` with more than one key, which it says as a
/// count of elements; the error adds what a step may hold.
const ONE_KEY_PER_STEP: &str = "wanted exactly 1 element";

/// The request `args` (a recipe build: `--from` or `--file`) make.
pub fn request(args: &ImageBuildArgs) -> Result<RecipeRequest, Error> {
    let limits = Limits {
        max_bytes: args.max_bytes,
        max_files: args.max_files,
    };
    let mut allow_hosts = args.allow_hosts.clone();
    let (base, network, steps, timeout) = match &args.file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|err| {
                Error::invalid(format!("--file {}: reading it: {err}", path.display()))
            })?;
            let file: RecipeFile = toml::from_str(&text).map_err(|err| {
                let said = err.to_string();
                let hint = if said.contains(ONE_KEY_PER_STEP) {
                    "\neach [[step]] holds exactly one of run, apt, copy or env: give each its \
                     own [[step]]"
                } else {
                    ""
                };
                Error::invalid(format!(
                    "--file {}: {}{hint}",
                    path.display(),
                    said.trim_end()
                ))
            })?;
            let dir = path.parent().unwrap_or(Path::new("."));
            let mut steps = Vec::new();
            for step in file.step {
                steps.push(match step {
                    FileStep::Run(command) => Step::Run(command),
                    FileStep::Apt(packages) => Step::Apt(packages.into_vec()),
                    FileStep::Copy(pair) => copy_step(&pair, Some(dir))?,
                    FileStep::Env(pair) => env_step(&pair)?,
                });
            }
            allow_hosts.extend(file.allow_hosts);
            let base = args.from.clone().or(file.from).ok_or_else(|| {
                Error::invalid(format!(
                    "--file {}: name the base image (from = \"…\" or --from)",
                    path.display()
                ))
            })?;
            let timeout = match (args.timeout, file.timeout) {
                (Some(flag), _) => Some(flag),
                (None, Some(seconds)) => Some(file_timeout(path, seconds)?),
                (None, None) => None,
            };
            (base, args.network.clone().or(file.network), steps, timeout)
        }
        None => {
            let base = args.from.clone().ok_or_else(|| {
                Error::invalid("a recipe needs its base image: --from BASE (or --file)")
            })?;
            let mut steps = Vec::new();
            for pair in &args.copy {
                steps.push(copy_step(pair, None)?);
            }
            for pair in &args.env {
                steps.push(env_step(pair)?);
            }
            if !args.apt.is_empty() {
                steps.push(Step::Apt(args.apt.clone()));
            }
            steps.extend(args.run.iter().cloned().map(Step::Run));
            (base, args.network.clone(), steps, args.timeout)
        }
    };
    Ok(RecipeRequest {
        name: args.name.clone(),
        base,
        steps,
        network,
        allow_hosts,
        limits,
        memory_mb: args.memory_mb,
        disk_mb: args.disk_mb,
        timeout_seconds: timeout,
        sandbox: dynocap_engine::image_recipe::build_sandbox_name(),
    })
}

/// A recipe file's `timeout`, checked here so its error names the file's key rather than the
/// flag (the engine checks the flag's).
fn file_timeout(path: &Path, seconds: u64) -> Result<u64, Error> {
    dynocap_engine::image_recipe::recipe_timeout(Some(seconds)).map_err(|_| {
        Error::invalid(format!(
            "--file {}: timeout = {seconds} is out of range; give seconds from {} to {} \
             (default {})",
            path.display(),
            dynocap_engine::image_recipe::RECIPE_TIMEOUT_MIN,
            dynocap_engine::image_recipe::RECIPE_TIMEOUT_MAX,
            dynocap_engine::image_recipe::RECIPE_TIMEOUT_DEFAULT,
        ))
    })
}

/// `HOSTPATH:GUESTPATH`, the host path made absolute (from `dir` for a file's relative path).
fn copy_step(pair: &str, dir: Option<&Path>) -> Result<Step, Error> {
    let Some((host, guest)) = pair.rsplit_once(":/") else {
        return Err(Error::invalid(format!(
            "copy {pair:?}: give HOSTPATH:GUESTPATH, the guest path absolute"
        )));
    };
    let host = match dir {
        Some(dir) if Path::new(host).is_relative() => dir.join(host),
        _ => Path::new(host).to_path_buf(),
    };
    let host = std::path::absolute(&host)
        .map_err(|err| Error::invalid(format!("copy {}: {err}", host.display())))?;
    Ok(Step::Copy(host.display().to_string(), format!("/{guest}")))
}

fn env_step(pair: &str) -> Result<Step, Error> {
    match pair.split_once('=') {
        Some((key, value)) => Ok(Step::Env(key.to_owned(), value.to_owned())),
        None => Err(Error::invalid(format!("env {pair:?}: give K=V"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RecipeFile, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn a_recipe_file_reads_in_order_and_refuses_unknown_keys_by_name() {
        let file = parse(
            "from = \"bb\"\n[[step]]\nrun = \"true\"\n[[step]]\nenv = \"A=1\"\n\
             [[step]]\napt = [\"jq\"]\n",
        )
        .expect("parses");
        assert_eq!(file.from.as_deref(), Some("bb"));
        assert!(matches!(file.step[0], FileStep::Run(_)));
        assert!(matches!(file.step[1], FileStep::Env(_)));
        let err = parse("from = \"bb\"\nnetwrok = \"nat\"\n").expect_err("typo");
        assert!(err.contains("netwrok"), "{err}");
        let err = parse("[[step]]\nrum = \"true\"\n").expect_err("typo");
        assert!(err.contains("rum"), "{err}");
        let err = parse("[[step]]\nrun = \"true\"\nenv = \"A=1\"\n").expect_err("two keys");
        assert!(err.contains(ONE_KEY_PER_STEP), "{err}");
        let file = parse("[[step]]\napt = \"jq\"\n").expect("one package as a string");
        let FileStep::Apt(packages) = file.step.into_iter().next().expect("step") else {
            panic!("not apt");
        };
        assert_eq!(packages.into_vec(), vec!["jq".to_owned()]);
    }

    /// `image build` parsed as the command line would be.
    fn build_args(line: &[&str]) -> Result<ImageBuildArgs, clap::Error> {
        use clap::Parser as _;
        let words = ["dynocap", "image", "build"].iter().chain(line);
        match crate::cli::Cli::try_parse_from(words)?.command {
            crate::cli::Command::Image(crate::cli::ImageCommand::Build(args)) => Ok(args),
            other => panic!("not image build: {other:?}"),
        }
    }

    #[test]
    fn the_build_timeout_comes_from_the_flag_else_the_file() {
        let args = build_args(&["t", "--from", "bb", "--run", "true"]).expect("parses");
        assert_eq!(request(&args).expect("request").timeout_seconds, None);
        let args = build_args(&["t", "--from", "bb", "--timeout", "7200"]).expect("parses");
        assert_eq!(request(&args).expect("request").timeout_seconds, Some(7200));
        let err = build_args(&["t", "--from", "bb", "--timeout", "1h"]).expect_err("not a number");
        assert!(err.to_string().contains("not a whole number"), "{err}");
        // The range is the engine's (one check for every caller): see `recipe_timeout`.
        let args = build_args(&["t", "--from", "bb", "--timeout", "59"]).expect("parses");
        assert_eq!(request(&args).expect("request").timeout_seconds, Some(59));

        let dir = tempfile::tempdir().expect("tempdir");
        let recipe = dir.path().join("r.toml");
        let file = recipe.to_str().expect("utf8");
        std::fs::write(&recipe, "from = \"bb\"\ntimeout = 7200\n").expect("write");
        let args = build_args(&["t", "--file", file]).expect("parses");
        assert_eq!(request(&args).expect("request").timeout_seconds, Some(7200));
        // The flag wins over the file, as --from and --network do.
        let args = build_args(&["t", "--file", file, "--timeout", "120"]).expect("parses");
        assert_eq!(request(&args).expect("request").timeout_seconds, Some(120));
        for bad in ["59", "86401"] {
            std::fs::write(&recipe, format!("from = \"bb\"\ntimeout = {bad}\n")).expect("write");
            let args = build_args(&["t", "--file", file]).expect("parses");
            let err = request(&args).expect_err("out of range");
            assert!(
                err.message.contains(&format!(
                    "timeout = {bad} is out of range; give seconds \
                                               from 60 to 86400"
                )),
                "{err}"
            );
        }
        std::fs::write(&recipe, "from = \"bb\"\ntimeout = \"1h\"\n").expect("write");
        let args = build_args(&["t", "--file", file]).expect("parses");
        let err = request(&args).expect_err("not a number");
        assert!(err.message.contains("timeout"), "{err}");
    }

    #[test]
    fn copies_name_an_absolute_guest_path() {
        let step = copy_step("a.conf:/etc/a.conf", Some(Path::new("/srv/r"))).expect("ok");
        assert_eq!(
            step,
            Step::Copy("/srv/r/a.conf".into(), "/etc/a.conf".into())
        );
        assert!(copy_step("a.conf:etc/a", None).is_err());
        assert_eq!(
            env_step("K=a=b").expect("ok"),
            Step::Env("K".into(), "a=b".into())
        );
    }
}
