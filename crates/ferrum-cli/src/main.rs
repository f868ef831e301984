//! `ferrum`: run, serve, embed and benchmark LLMs from one binary.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

mod commands;
mod model_files;
mod pull;

/// Ferrum: a Rust-native LLM inference engine.
///
/// Runs GGUF and Hugging Face models on the CPU (and NVIDIA GPUs with the
/// `cuda` feature). Set RUST_LOG (e.g. RUST_LOG=debug) for detailed logs.
#[derive(Parser)]
#[command(name = "ferrum", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Read model files into memory instead of mapping them (more memory;
    /// a model file truncated or replaced while in use then changes
    /// nothing, where a mapped one stops the process with an error).
    #[arg(long, global = true, env = "FERRUM_NO_MMAP")]
    no_mmap: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a model file is: architecture, size, tensor types, tokenizer.
    Inspect(commands::inspect::InspectArgs),
    /// Chat with a model, or complete one --prompt.
    // Negative numbers are values (`-n -5` gets a range error, not
    // "unexpected argument"), here and below.
    #[command(allow_negative_numbers = true)]
    Run(commands::run::RunArgs),
    /// Measure prompt-processing and generation speed (like llama-bench).
    #[command(allow_negative_numbers = true)]
    Bench(commands::bench::BenchArgs),
    /// Embed texts with an encoder model (default: all-MiniLM-L6-v2).
    Embed(commands::embed::EmbedArgs),
    /// Measure perplexity on a text file (llama-perplexity's method).
    #[command(allow_negative_numbers = true)]
    Perplexity(commands::perplexity::PerplexityArgs),
    /// Serve a model over an OpenAI-compatible HTTP API.
    #[command(allow_negative_numbers = true)]
    Serve(commands::serve::ServeArgs),
    /// Download a model: an alias (smollm2, qwen2.5-coder:0.5b, ...) or owner/repo:file.
    Pull {
        /// What to fetch.
        model: String,
    },
    /// List the models fetched to this machine, with format, quantization and size.
    List(commands::cache::ListArgs),
    /// Delete a fetched model (as `ferrum list` names it) and free its space.
    Rm(commands::cache::RmArgs),
    /// List what a running `ferrum serve` has loaded (as `ollama ps`).
    Ps(commands::ps::PsArgs),
    /// Print the token ids of a text.
    Tokenize(commands::tokenize::TokenizeArgs),
    /// Print the compute capabilities Ferrum detected on this machine.
    SystemInfo,
}

impl Command {
    /// The log filter when RUST_LOG is not set. A server's log is its
    /// record, so `serve` logs requests and start-up at info; everything
    /// else prints its answer, and only warnings join it (on stderr).
    fn default_log(&self) -> &'static str {
        match self {
            Command::Serve(_) => "warn,ferrum=info",
            _ => "warn",
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command;
    ferrum_formats::file_bytes::set_read_into_memory(cli.no_mmap);
    #[cfg(unix)]
    if !cli.no_mmap {
        report_model_file_faults();
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(command.default_log())),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log file or a pipe gets plain text.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .init();
    // Commands drive the model from a CPU pool worker (see `on_pool`).
    let result = ferrum_kernels::cpu::on_pool(None, || dispatch(command))
        .map_err(anyhow::Error::from)
        .and_then(|r| r);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the problem, no backtrace.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A mapped model file that another process truncates or replaces faults
/// (SIGBUS) on the next read past its new end, which would kill the process
/// without a word: say what happened and exit with status 74 (EX_IOERR).
#[cfg(unix)]
fn report_model_file_faults() {
    extern "C" fn on_sigbus(_: libc::c_int) {
        const MSG: &[u8] =
            b"\nerror: a model file changed on disk while in use (truncated or replaced); \
            restart, or run with --no-mmap to read models into memory\n";
        // SAFETY: write(2) and _exit(2) are async-signal-safe.
        unsafe {
            libc::write(2, MSG.as_ptr().cast(), MSG.len());
            libc::_exit(74);
        }
    }
    // SAFETY: a zeroed sigaction with our handler and an empty mask; the
    // handler calls async-signal-safe functions only.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Embed(a) => commands::embed::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::List(a) => commands::cache::list(a),
        Command::Rm(a) => commands::cache::rm(a),
        Command::Ps(a) => commands::ps::ps(a),
        Command::Pull { model } => pull::pull(&model).map(|p| println!("{}", p.display())),
        Command::SystemInfo => {
            system_info();
            Ok(())
        }
    }
}

fn system_info() {
    println!("ferrum {}", env!("CARGO_PKG_VERSION"));
    println!("cpu simd: {}", ferrum_kernels::cpu::simd_level());
    println!("threads: {}", ferrum_kernels::cpu::threads());
    #[cfg(feature = "cuda")]
    println!(
        "cuda: {}",
        ferrum_kernels::CudaBackend::describe().unwrap_or_else(|| "no usable GPU found".into())
    );
}
