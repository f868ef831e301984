//! `ferrum run`'s interactive chat, as Ollama and llama-cli users expect
//! it: a line editor with history kept across runs (rustyline: arrows,
//! Home/End, Ctrl-R), `"""` blocks over several lines, and slash commands
//! that are handled here and never reach the model. What is typed during an
//! answer is neither echoed into it nor kept. Piped input (not a terminal)
//! is read line by line, with the same commands.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use ferrum_tokenizer::chat::Message;
use rustyline::error::ReadlineError;
use rustyline::DefaultEditor;
use serde_json::{json, Value};

use super::run::Session;

const HELP: &str = "\
/set temperature X | top_k N | top_p X | min_p X | repeat_penalty X | seed N
     max_tokens N (or -n N) | system TEXT     change a setting for the next answers
/show                                          the model and the settings
/save FILE                                     write the conversation as JSON
/load FILE                                     continue a conversation saved with /save
/clear                                         start over (keeps the system message)
/bye                                           quit (also /exit, /quit, Ctrl-D)
/help, /?                                      this list
\"\"\" starts a message over several lines; another \"\"\" ends it.";

/// What one read gave.
enum Input {
    Line(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    End,
}

/// Where lines come from: the line editor on a terminal, plain lines
/// from a pipe.
enum Lines {
    Editor {
        editor: Box<DefaultEditor>,
        history: Option<PathBuf>,
    },
    Plain(std::io::Stdin),
}

impl Lines {
    fn open() -> Result<Self> {
        if !std::io::stdin().is_terminal() {
            return Ok(Lines::Plain(std::io::stdin()));
        }
        let mut editor = Box::new(DefaultEditor::new().context("cannot set up the line editor")?);
        let history = history_file();
        if let Some(h) = &history {
            // A first run has none yet.
            let _ = editor.load_history(h);
        }
        Ok(Lines::Editor { editor, history })
    }

    fn read(&mut self, prompt: &str) -> Result<Input> {
        match self {
            Lines::Editor { editor, .. } => match editor.readline(prompt) {
                Ok(line) => Ok(Input::Line(line)),
                Err(ReadlineError::Interrupted) => Ok(Input::Interrupted),
                Err(ReadlineError::Eof) => Ok(Input::End),
                Err(e) => Err(anyhow!("cannot read the input: {e}")),
            },
            Lines::Plain(stdin) => {
                eprint!("{prompt}");
                let mut line = String::new();
                if stdin.lock().read_line(&mut line)? == 0 {
                    return Ok(Input::End);
                }
                Ok(Input::Line(line.trim_end_matches(['\n', '\r']).to_string()))
            }
        }
    }

    /// Adds a sent message or command to the history (saved at once, so a
    /// run that is killed keeps it).
    fn remember(&mut self, entry: &str) {
        if let Lines::Editor { editor, history } = self {
            let _ = editor.add_history_entry(entry);
            if let Some(h) = history {
                if let Some(dir) = h.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let _ = editor.save_history(h);
            }
        }
    }
}

/// `$FERRUM_HISTORY`, else `~/.cache/ferrum/history`.
fn history_file() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FERRUM_HISTORY") {
        return Some(PathBuf::from(p));
    }
    let home = PathBuf::from(std::env::var_os("HOME")?);
    Some(home.join(".cache/ferrum/history"))
}

/// Reads the rest of a `"""` block: `first` is what followed the opening
/// quotes. `None` when the input ended or Ctrl-C dropped the block.
fn block(lines: &mut Lines, first: &str) -> Result<Option<String>> {
    if let Some(done) = first.strip_suffix("\"\"\"") {
        return Ok(Some(done.to_string()));
    }
    let mut text = first.to_string();
    loop {
        match lines.read("... ")? {
            Input::Line(l) => {
                if !text.is_empty() || !l.is_empty() {
                    text.push('\n');
                }
                match l.strip_suffix("\"\"\"") {
                    Some(last) => {
                        text.push_str(last);
                        return Ok(Some(text.trim_start_matches('\n').to_string()));
                    }
                    None => text.push_str(&l),
                }
            }
            Input::Interrupted | Input::End => return Ok(None),
        }
    }
}

/// The interactive chat.
pub(super) fn chat(session: &mut Session) -> Result<()> {
    // Two short lines, so the banner fits 80 columns.
    eprintln!(
        "Chatting with {}.\n/help lists commands, /bye or Ctrl-D quits, Ctrl-C stops an answer.",
        session.args.model.name()
    );
    let mut lines = Lines::open()?;
    let mut conv = session.start();
    loop {
        let line = match lines.read(">>> ")? {
            Input::Line(l) => l,
            Input::Interrupted => {
                eprintln!("(Ctrl-D or /bye quits)");
                continue;
            }
            Input::End => {
                // Leave the terminal on a fresh line.
                eprintln!();
                break;
            }
        };
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        let text = match trimmed.strip_prefix("\"\"\"") {
            Some(first) => match block(&mut lines, first)? {
                Some(t) => t,
                None => continue,
            },
            None => trimmed.to_string(),
        };
        lines.remember(&text);
        if text.starts_with('/') {
            match command(session, &mut conv, &text) {
                Ok(Flow::Quit) => break,
                Ok(Flow::Go) => {}
                Err(e) => eprintln!("{e:#}"),
            }
            continue;
        }
        conv.push(Message::new("user", text));
        let result = {
            let _quiet = QuietInput::new();
            session.answer(&mut conv)
        };
        if let Err(e) = result {
            // Keep the session alive: drop the turn that failed.
            conv.pop();
            eprintln!("error: {e:#}");
        }
    }
    Ok(())
}

enum Flow {
    Go,
    Quit,
}

/// Runs one slash command.
fn command(session: &mut Session, conv: &mut Vec<Message>, text: &str) -> Result<Flow> {
    let (name, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
    let rest = rest.trim();
    match name {
        "/bye" | "/exit" | "/quit" => return Ok(Flow::Quit),
        "/help" | "/?" => eprintln!("{HELP}"),
        "/clear" => {
            *conv = session.start();
            eprintln!("(conversation cleared)");
        }
        "/set" => {
            set(session, rest)?;
            // A new system message starts the conversation again.
            if rest.starts_with("system") {
                *conv = session.start();
                eprintln!("(system message set; conversation cleared)");
            }
        }
        "/show" => eprintln!("{}", show(session, conv)),
        "/save" => {
            let path = file_arg(rest, "/save FILE")?;
            save(conv, path)?;
            eprintln!("(saved {} messages to {})", conv.len(), path.display());
        }
        "/load" => {
            let path = file_arg(rest, "/load FILE")?;
            *conv = load(path)?;
            eprintln!("(loaded {} messages from {})", conv.len(), path.display());
        }
        _ => bail!(
            "unknown command {name}: /help lists the commands (a message cannot start with /)"
        ),
    }
    Ok(Flow::Go)
}

fn file_arg<'a>(rest: &'a str, usage: &str) -> Result<&'a Path> {
    if rest.is_empty() {
        bail!("usage: {usage}");
    }
    Ok(Path::new(rest))
}

/// `/set NAME VALUE`: the new settings are checked as the command line's
/// are, and a bad value changes nothing.
fn set(session: &mut Session, rest: &str) -> Result<()> {
    let (name, value) = rest
        .split_once(char::is_whitespace)
        .map(|(n, v)| (n, v.trim()))
        .ok_or_else(|| anyhow!("usage: /set NAME VALUE (/help lists the names)"))?;
    let name = name.replace('-', "_");
    let number = |v: &str| -> Result<f32> {
        v.parse()
            .map_err(|_| anyhow!("{name}: {v:?} is not a number"))
    };
    let count = |v: &str| -> Result<usize> {
        v.parse()
            .map_err(|_| anyhow!("{name}: {v:?} is not a whole number of at least 0"))
    };
    let mut p = session.sampling.clone();
    match name.as_str() {
        "temperature" => p.temperature = number(value)?,
        "top_k" => p.top_k = count(value)?,
        "top_p" => p.top_p = number(value)?,
        "min_p" => p.min_p = number(value)?,
        "repeat_penalty" => p.repetition_penalty = number(value)?,
        "seed" => {
            p.seed = Some(
                value
                    .parse()
                    .map_err(|_| anyhow!("seed: {value:?} is not a whole number"))?,
            )
        }
        "max_tokens" | "_n" | "n" => {
            let n = super::at_least_one(value).map_err(|e| anyhow!("max_tokens: {e}"))?;
            session.max_tokens = n;
            eprintln!("(max_tokens {n})");
            return Ok(());
        }
        "system" => {
            session.system = Some(value.to_string());
            return Ok(());
        }
        _ => bail!("/set {name}: unknown setting (/help lists them)"),
    }
    p.validate()?;
    session.sampling = p;
    eprintln!("({name} {value})");
    Ok(())
}

fn show(session: &Session, conv: &[Message]) -> String {
    let p = &session.sampling;
    let seed = p.seed.map_or("random".to_string(), |s| s.to_string());
    format!(
        "model: {}\nmax_tokens {} | temperature {} | top_k {} | top_p {} | min_p {} | repeat_penalty {} | seed {seed}\nsystem: {}\nconversation: {} messages",
        session.args.model.name(),
        session.max_tokens,
        p.temperature,
        p.top_k,
        p.top_p,
        p.min_p,
        p.repetition_penalty,
        session.system.as_deref().unwrap_or("(none)"),
        conv.len()
    )
}

fn save(conv: &[Message], path: &Path) -> Result<()> {
    let messages: Vec<Value> = conv
        .iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    let text = serde_json::to_string_pretty(&json!({ "messages": messages }))?;
    std::fs::write(path, text + "\n").with_context(|| format!("cannot write {}", path.display()))
}

fn load(path: &Path) -> Result<Vec<Message>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let messages = v["messages"].as_array().ok_or_else(|| {
        anyhow!(
            "{}: no \"messages\" list (write one with /save)",
            path.display()
        )
    })?;
    messages
        .iter()
        .map(|m| match (m["role"].as_str(), m["content"].as_str()) {
            (Some(r @ ("system" | "user" | "assistant")), Some(c)) => Ok(Message::new(r, c)),
            _ => bail!(
                "{}: each message needs a role (system, user or assistant) and text content",
                path.display()
            ),
        })
        .collect()
}

/// While an answer streams, keys typed on the terminal are not echoed into
/// it, and are dropped when it ends (they are not the next message).
struct QuietInput {
    #[cfg(unix)]
    saved: Option<libc::termios>,
}

impl QuietInput {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            let fd = std::io::stdin().as_raw_fd();
            let mut t = std::mem::MaybeUninit::<libc::termios>::uninit();
            // SAFETY: tcgetattr fills `t` when it returns 0; the fd is stdin.
            let saved = (std::io::stdin().is_terminal()
                && unsafe { libc::tcgetattr(fd, t.as_mut_ptr()) } == 0)
                .then(|| unsafe { t.assume_init() });
            if let Some(mut quiet) = saved {
                quiet.c_lflag &= !(libc::ECHO | libc::ICANON);
                // SAFETY: a termios read from this fd, changed in two flags.
                unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
            }
            Self { saved }
        }
        #[cfg(not(unix))]
        Self {}
    }
}

impl Drop for QuietInput {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(saved) = self.saved {
            use std::os::fd::AsRawFd;
            let fd = std::io::stdin().as_raw_fd();
            // SAFETY: restores the settings read in `new`, after dropping
            // what was typed meanwhile.
            unsafe {
                libc::tcflush(fd, libc::TCIFLUSH);
                libc::tcsetattr(fd, libc::TCSANOW, &saved);
            }
        }
    }
}
