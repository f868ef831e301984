//! `ferrum tokenize`: print the token ids of a text.

use anyhow::Result;
use clap::Args;

use crate::model_files::{resolve, ModelFiles, DEFAULT_MODEL};

#[derive(Args)]
pub struct TokenizeArgs {
    /// Model whose tokenizer to use: a .gguf file, a Hugging Face folder or an alias.
    #[arg(long, short = 'm', default_value = DEFAULT_MODEL)]
    model: String,
    /// Print one JSON array of ids on the last line instead of a table.
    #[arg(long)]
    json: bool,
    /// Add the model's BOS/EOS (or CLS/SEP) tokens.
    #[arg(long)]
    add_special: bool,
    /// Turn special-token text such as <|im_start|> into its token.
    #[arg(long)]
    parse_special: bool,
    /// Show each token's vocabulary string (byte-level pieces such as
    /// "Ġworld") instead of the text it stands for (" world").
    #[arg(long)]
    raw: bool,
    /// The text (put it after `--` if it starts with a dash).
    #[arg(required = true, num_args = 1..)]
    text: Vec<String>,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let tok = ModelFiles::open(&resolve(&args.model)?)?.tokenizer()?;
    let text = args.text.join(" ");
    let ids = tok.encode(&text, args.add_special, args.parse_special)?;
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
        return Ok(());
    }
    for &id in &ids {
        let piece = match args.raw {
            true => format!("{:?}", tok.token_text(id).unwrap_or("")),
            false => shown(&tok.token_bytes(id)),
        };
        println!("{id:>8}  {piece}");
    }
    println!("{} tokens", ids.len());
    Ok(())
}

/// A token's text, quoted: UTF-8 as it reads, and a piece that is part of
/// a character (byte fallback, one byte of a multi-byte character) as its
/// bytes in `\x` escapes.
fn shown(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => format!("{s:?}"),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
            format!("\"{hex}\"")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn pieces_read_as_text_and_partial_characters_as_bytes() {
        assert_eq!(shown(b" world"), "\" world\"");
        assert_eq!(shown(b"\n"), "\"\\n\"");
        assert_eq!(shown(&[0xe4, 0xb8]), "\"\\xe4\\xb8\"");
    }
}
