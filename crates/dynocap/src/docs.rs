//! `dynocap completions SHELL` and `dynocap man`: shell completion scripts and the manual
//! page, generated from the same clap definition as the parser, so they cannot drift from it.

use std::io::Write;
use std::process::ExitCode;

use clap::CommandFactory;

use crate::cli::Cli;

pub fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "dynocap", &mut script);
    write_out(&script)
}

pub fn man_page() -> ExitCode {
    let mut page = Vec::new();
    if let Err(err) = clap_mangen::Man::new(Cli::command()).render(&mut page) {
        eprintln!("dynocap: cannot render the manual page: {err}");
        return ExitCode::FAILURE;
    }
    write_out(&page)
}

fn write_out(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        // A reader that stopped early (`| head`) is not an error worth a message; the exit
        // code says it as SIGPIPE would have.
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::from(crate::exec_output::READER_GONE_EXIT)
        }
        Err(err) => {
            eprintln!("dynocap: cannot write to stdout: {err}");
            ExitCode::FAILURE
        }
    }
}
