//! `moshid-model`: checkpoint tools.
//!
//! * `check-checkpoint DIR` validates a checkpoint folder from the safetensors
//!   headers alone (config, every tensor name, shape and dtype) and prints
//!   what it found; exits non-zero with the reason otherwise.
//! * `write-demo DIR [--seed N]` writes the random-weight demo checkpoint.
//! * `write-header-only DIR` writes a header-only Moshi 7B folder ([`moshid_model::header_only`]).

use clap::{Parser, Subcommand};
use moshid_model::checkpoint::{CheckpointDir, DirError};
use moshid_model::config::{LmConfig, MimiConfig};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "moshid-model", about = "moshid model tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a checkpoint folder from its headers (fast, reads no weights).
    CheckCheckpoint {
        /// The checkpoint folder.
        dir: PathBuf,
    },
    /// Write a header-only Moshi 7B folder (published layout; the weights
    /// are a hole in sparse files: for checks of real shapes, never to serve).
    WriteHeaderOnly {
        /// Destination folder.
        dir: PathBuf,
        /// An LM config.json to write the folder for (with the real Mimi)
        /// instead of Moshi 7B.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Write the random-weight demo checkpoint.
    WriteDemo {
        /// Destination folder (replaced).
        dir: PathBuf,
        /// Seed of the random weights.
        #[arg(long, default_value_t = moshid_model::demo::DEMO_SEED)]
        seed: u64,
    },
}

fn header_only(dir: &Path, config: Option<&Path>) -> Result<(), DirError> {
    let Some(path) = config else {
        return moshid_model::header_only::write_moshi_7b(dir);
    };
    let text = std::fs::read_to_string(path).map_err(|source| DirError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| DirError::Io {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    let lm = LmConfig::from_json(&json)?;
    moshid_model::header_only::write_published_dir(
        dir,
        &lm,
        &MimiConfig::mimi_default(),
        Some(&json),
        None,
    )
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::CheckCheckpoint { dir } => moshid_model::checkpoint::check_command(&dir),
        Command::WriteHeaderOnly { dir, config } => match header_only(&dir, config.as_deref()) {
            Ok(()) => {
                println!("wrote a header-only checkpoint folder to {}", dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::WriteDemo { dir, seed } => match moshid_model::demo::write_demo(&dir, seed) {
            Ok(()) => {
                println!(
                    "wrote the demo checkpoint (random weights) to {}",
                    dir.display()
                );
                let _ = CheckpointDir::open(&dir);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
