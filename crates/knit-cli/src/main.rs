//! `knit`: the command-line interface.

fn main() {
    eprintln!("knit: not built yet");
    std::process::exit(2);
}
