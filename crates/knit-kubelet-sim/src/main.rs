//! `knit-kubelet-sim`: knit's kubelet stand-in; see the library docs.

use std::process::ExitCode;

fn main() -> ExitCode {
    let flags = match knit_kubelet_sim::flags::parse(std::env::args().skip(1)) {
        Ok(f) => f,
        Err(e) => {
            eprintln!(
                "knit-kubelet-sim: {e} ({})\n\n{}",
                e.code(),
                knit_kubelet_sim::HELP
            );
            return ExitCode::from(2);
        }
    };
    if flags.version {
        println!("{}", knit_kubelet_sim::version_line());
        return ExitCode::SUCCESS;
    }
    if flags.help {
        print!("{}", knit_kubelet_sim::HELP);
        return ExitCode::SUCCESS;
    }
    // Logs go to stderr; the node's supervisor writes them to the log file.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match flags.ensure_images.clone() {
        Some(list) => knit_kubelet_sim::ensure_only(&flags, &list),
        None => knit_kubelet_sim::run(flags),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(code = e.code(), "{e}");
            eprintln!("knit-kubelet-sim: {e} ({})", e.code());
            ExitCode::FAILURE
        }
    }
}
