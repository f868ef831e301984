//! `ferrum`: run, serve, embed and benchmark LLMs from one binary.

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// Ferrum: a Rust-native LLM inference engine.
///
/// Runs GGUF and Hugging Face models on the CPU (and NVIDIA GPUs with the
/// `cuda` feature). Set RUST_LOG (e.g. RUST_LOG=debug) for detailed logs.
#[derive(Parser)]
#[command(name = "ferrum", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the compute capabilities Ferrum detected on this machine.
    SystemInfo,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::SystemInfo => system_info(),
    }
    Ok(())
}

fn system_info() {
    println!("ferrum {}", env!("CARGO_PKG_VERSION"));
    println!("cpu simd: {}", ferrum_kernels::cpu::simd_level());
    println!("threads: {}", ferrum_kernels::cpu::threads());
}
