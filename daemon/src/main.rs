//! The `moshid` binary: see `moshid --help`.

fn main() -> std::process::ExitCode {
    moshid::cli::main()
}
