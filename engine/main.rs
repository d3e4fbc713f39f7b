//! The `ralph-flow` command line: a thin layer that parses arguments, calls the engine and
//! renders what it returns.

mod cli;

fn main() {
    // Output piped into a program that stops reading (`ralph-flow presets | head`) ends
    // ralph-flow quietly, as it does other command-line tools, instead of as a panic.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to std") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default_hook(info);
    }));
    std::process::exit(cli::main());
}
