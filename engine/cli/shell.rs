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
    let script = String::from_utf8_lossy(&out);
    let script = match args.shell {
        clap_complete::Shell::Bash => bash(&script),
        clap_complete::Shell::Fish => format!("{script}{FISH_PRESETS}"),
        clap_complete::Shell::Zsh => zsh(&script),
        _ => script.into_owned(),
    };
    write_out(script.as_bytes())
}

/// Preset names beside files for the first word after `run`, `check`, `graph` and `explain`
/// (the subcommands whose workflow may be a preset's name): the generated function completes
/// it to files only (`-o default`).
const BASH_PRESETS: &str = r#"
# Preset names beside files for the workflow of `run`, `check`, `graph` and `explain`
# (`ralph-flow presets --names` lists them without loading them).
_ralph__flow_presets() {
    _ralph__flow "$@"
    local cur="${COMP_WORDS[COMP_CWORD]}"
    if [[ ${COMP_CWORD} -eq 2 && ${cur} != -* ]]; then
        case "${COMP_WORDS[1]}" in
            run|check|graph|explain)
                COMPREPLY=( $(compgen -W "$("${COMP_WORDS[0]}" presets --names 2>/dev/null)" -- "${cur}") $(compgen -f -- "${cur}") )
                ;;
        esac
    fi
}

"#;

/// The same for fish, whose conditions add candidates to the files it offers anyway.
const FISH_PRESETS: &str = r#"
# Preset names beside files for the workflow of `run`, `check`, `graph` and `explain`.
complete -c ralph-flow -n "__fish_ralph_flow_using_subcommand run check graph explain; and not string match -q -- '-*' (commandline -ct)" -a "(ralph-flow presets --names 2>/dev/null)" -d 'preset'
"#;

/// The same for zsh: the workflow's argument offers presets and files.
const ZSH_PRESETS: &str = r#"(( $+functions[_ralph_flow_workflows] )) ||
_ralph_flow_workflows() {
    local -a presets
    presets=(${(f)"$(ralph-flow presets --names 2>/dev/null)"})
    _alternative 'presets:preset:compadd -a presets' 'files:workflow file:_files'
}

"#;

fn bash(script: &str) -> String {
    // clap_complete 4.6 names the bash cases of a binary with a `-` in its name one way
    // (`ralph__subcmd__flow__subcmd__run`) and looks them up another
    // (`ralph__flow__subcmd__run`), so no subcommand's options or values completed;
    // tests/cli.rs drives the script in bash to hold this.
    let script = script.replace("ralph__subcmd__flow", "ralph__flow");
    let script = script.replace(
        "complete -F _ralph__flow ",
        "complete -F _ralph__flow_presets ",
    );
    match script.rfind("\nif [[ \"${BASH_VERSINFO[0]}\"") {
        Some(at) => format!("{}{BASH_PRESETS}{}", &script[..at], &script[at + 1..]),
        None => script,
    }
}

fn zsh(script: &str) -> String {
    let script = script
        .replace(
            "':file -- The workflow file:_files'",
            "':file -- The workflow file or preset:_ralph_flow_workflows'",
        )
        .replace(
            "'*::files -- The workflow files to check:_files'",
            "'*::files -- The workflow files or presets to check:_ralph_flow_workflows'",
        );
    match script.rfind("\nif [ \"$funcstack[1]\"") {
        Some(at) => format!("{}{ZSH_PRESETS}{}", &script[..at + 1], &script[at + 1..]),
        None => script,
    }
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
