//! `ralph-flow serve`: the live web monitor.

use std::time::Duration;

use ralph_flow::diag::error_chain;
use ralph_flow::serve::{Options, serve};

#[derive(clap::Args)]
#[command(mut_arg("state_dir", |a| a.help("The state directory whose runs are shown")))]
pub(super) struct Args {
    /// Where to listen: an address or a host name and a port (`127.0.0.1:7700`,
    /// `localhost:7700`, `[::1]:7700`); a name listens on every address it resolves to.
    /// Loopback only, unless --allow-remote. Port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7700")]
    addr: String,
    #[command(flatten)]
    store: super::store::StoreArgs,
    /// Serve other machines too (an address that is not loopback). Needs an access token of
    /// your own in RALPH_FLOW_TOKEN: at least 16 letters, digits or `-._~`, not one character
    /// repeated (`openssl rand -hex 16` makes one).
    #[arg(long)]
    allow_remote: bool,
    /// A host name the monitor answers to (the `Host` of a request), besides loopback's, the
    /// addresses it listens on and --addr's name; repeat it for more. Others get 421
    /// (DNS-rebinding protection).
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_host: Vec<String>,
    /// How often the store is asked whether something changed (`500ms`, `2s`).
    #[arg(long, value_name = "DURATION", default_value = "300ms", value_parser = super::run::duration)]
    poll: Duration,
}

pub(super) fn run(args: &Args) -> i32 {
    let cwd = std::env::current_dir().unwrap_or_default();
    let store = match args.store.location_in(&cwd) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            return ralph_flow::exit::CONFIG;
        }
    };
    let opts = Options {
        addr: args.addr.clone(),
        store,
        allow_remote: args.allow_remote,
        token: std::env::var("RALPH_FLOW_TOKEN")
            .ok()
            .filter(|t| !t.is_empty()),
        allowed_hosts: args.allow_host.clone(),
        poll: args.poll,
    };
    let shown = opts.store.to_string();
    let result = serve(opts, |url| {
        use std::io::Write as _;
        println!("{url}");
        let _ = std::io::stdout().flush();
        eprintln!("ralph-flow monitor of {shown}: open {url} (Ctrl-C stops it)");
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ralph_flow::exit::CONFIG
        }
    }
}
