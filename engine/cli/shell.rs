//! `ralph-flow completions SHELL` and `ralph-flow man`: generated from the command line's own
//! definitions (clap_complete, clap_mangen), so they never fall behind it.

use std::io::Write;
use std::path::PathBuf;

use clap::CommandFactory;

#[derive(clap::Args)]
pub(super) struct CompletionsArgs {
    /// The shell to write a completion script for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub(super) struct ManArgs {
    /// Write `ralph-flow.1` and a page per subcommand (`ralph-flow-run.1`, ...) into this
    /// directory, instead of the main page to stdout.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
}

pub(super) fn completions(args: &CompletionsArgs) -> i32 {
    let mut cmd = super::Cli::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "ralph-flow", &mut out);
    if args.shell == clap_complete::Shell::Bash {
        // clap_complete 4.6 names the bash cases of a binary with a `-` in its name one way
        // (`ralph__subcmd__flow__subcmd__run`) and looks them up another
        // (`ralph__flow__subcmd__run`), so no subcommand's options or values completed;
        // tests/cli.rs drives the script in bash to hold this.
        let script = String::from_utf8_lossy(&out).replace("ralph__subcmd__flow", "ralph__flow");
        return write_out(script.as_bytes());
    }
    write_out(&out)
}

pub(super) fn man(args: &ManArgs) -> i32 {
    let cmd = super::Cli::command();
    match &args.out_dir {
        Some(dir) => {
            if let Err(e) =
                std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(cmd, dir))
            {
                eprintln!(
                    "error: cannot write the man pages into {}: {e}",
                    dir.display()
                );
                return 1;
            }
            eprintln!(
                "wrote the man pages into {} (ralph-flow.1 and one per subcommand)",
                dir.display()
            );
            0
        }
        None => {
            let mut out = Vec::new();
            if let Err(e) = clap_mangen::Man::new(cmd).render(&mut out) {
                eprintln!("error: cannot render the man page: {e}");
                return 1;
            }
            write_out(&out)
        }
    }
}

fn write_out(bytes: &[u8]) -> i32 {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => 0,
        // A closed pipe (`| head`) is no error of ours.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("error: cannot write to stdout: {e}");
            1
        }
    }
}
