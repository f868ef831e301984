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
        let piece = tok.token_text(id).unwrap_or("");
        println!("{id:>8}  {piece:?}");
    }
    println!("{} tokens", ids.len());
    Ok(())
}
