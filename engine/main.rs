//! The `ralph-flow` command line: a thin layer that parses arguments, calls the engine and
//! renders what it returns.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
