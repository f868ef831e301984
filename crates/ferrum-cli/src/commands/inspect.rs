//! `ferrum inspect`: what a model file is, without loading it into a
//! backend (quantized checkpoints are unpacked to say what they run as).

use anyhow::Result;
use clap::Args;
use ferrum_formats::gguf::GgufFile;
use ferrum_formats::hf_config::HfConfig;
use ferrum_formats::safetensors::SafeTensors;
use ferrum_models::llama::{checkpoint_layouts, LlamaConfig};
use ferrum_models::registry::{family, Family};
use std::collections::BTreeMap;

use crate::model_files::{resolve, ModelArg, ModelFiles};

#[derive(Args)]
pub struct InspectArgs {
    #[command(flatten)]
    model: ModelArg,
}

/// "1.23B", "494.0M" ...
fn human(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1}M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1}K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

pub fn run(args: InspectArgs) -> Result<()> {
    let files = ModelFiles::open(&resolve(args.model.name())?)?;
    let tok = files.tokenizer();
    match &files {
        ModelFiles::Gguf(g) => print_gguf(g),
        ModelFiles::HfDir(d) => {
            let cfg = HfConfig::load(d.join("config.json"))?;
            let st = SafeTensors::open_dir(d)?;
            println!("format:         Hugging Face safetensors");
            println!(
                "architecture:   {} ({})",
                cfg.model_type,
                cfg.architectures.join(", ")
            );
            let mut types: BTreeMap<String, usize> = BTreeMap::new();
            let mut params = 0u64;
            for name in st.names() {
                if let Some(t) = st.get(name) {
                    params += t.numel() as u64;
                    *types.entry(format!("{:?}", t.dtype)).or_default() += 1;
                }
            }
            println!("parameters:     {} ({params})", human(params));
            print_types(&types);
            println!(
                "layers:         {} (hidden {}, heads {}/{} kv, head_dim {})",
                cfg.num_hidden_layers,
                cfg.hidden_size,
                cfg.num_attention_heads,
                cfg.num_kv_heads(),
                cfg.head_dim()
            );
            match cfg.max_position_embeddings {
                Some(n) => println!("context length: {n}"),
                None => println!("context length: unknown"),
            }
            if matches!(family(&cfg.model_type), Ok(Family::Llama(_))) {
                print_llama(LlamaConfig::from_hf(&cfg));
            }
            let scheme = cfg
                .quant()
                .map_err(|e| anyhow::anyhow!("{}: {e}", d.join("config.json").display()))?;
            if let Some(scheme) = scheme {
                println!("quantization:   {}", scheme.describe());
                print_quant_layouts(&checkpoint_layouts(&st, &scheme)?);
            }
        }
    }
    match tok {
        Ok(t) => {
            println!("tokenizer:      {}", t.kind());
            println!("vocab size:     {}", t.vocab_size());
            let template = if t.chat_template().is_some() {
                "yes"
            } else {
                "no"
            };
            println!("chat template:  {template}");
        }
        Err(e) => println!("tokenizer:      unavailable ({e})"),
    }
    Ok(())
}

/// Each quantized weight and what it runs as, layers folded: `layers.*`
/// with a count where every layer agrees.
fn print_quant_layouts(layouts: &[(String, String)]) {
    let mut folded: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (name, layout) in layouts {
        let key = match name.split_once(".layers.") {
            Some((head, rest)) => match rest.split_once('.') {
                Some((_, tail)) => format!("{head}.layers.*.{tail}"),
                None => name.clone(),
            },
            None => name.clone(),
        };
        *folded.entry((key, layout.clone())).or_default() += 1;
    }
    println!("runs as:");
    for ((name, layout), count) in folded {
        let times = if count > 1 {
            format!(" (x{count})")
        } else {
            String::new()
        };
        println!("  {name}: {layout}{times}");
    }
}

fn print_types(types: &BTreeMap<String, usize>) {
    let list: Vec<String> = types.iter().map(|(t, n)| format!("{t} x{n}")).collect();
    println!("tensor types:   {}", list.join(", "));
}

fn print_gguf(g: &GgufFile) {
    let arch = g.architecture().unwrap_or("unknown");
    println!("format:         GGUF v{}", g.header().version);
    if let Some(name) = g.get("general.name").and_then(|v| v.as_str()) {
        println!("name:           {name}");
    }
    println!("architecture:   {arch}");
    let params: u64 = g.tensors().iter().map(|t| t.numel()).sum();
    println!("parameters:     {} ({params})", human(params));
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for t in g.tensors() {
        *types.entry(t.ty.to_string()).or_default() += 1;
    }
    print_types(&types);
    if let Ok(n) = g.get_u64(&format!("{arch}.block_count")) {
        println!("layers:         {n}");
    }
    match g.get_u64(&format!("{arch}.context_length")) {
        Ok(n) => println!("context length: {n}"),
        Err(_) => println!("context length: unknown"),
    }
    if matches!(family(arch), Ok(Family::Llama(_))) {
        print_llama(LlamaConfig::from_gguf(g));
    }
}

/// The parsed description of a Llama-shaped model, or why Ferrum cannot
/// run it (the error loading would give).
fn print_llama(cfg: ferrum_types::Result<LlamaConfig>) {
    match cfg {
        Ok(c) => c.describe().iter().for_each(|l| println!("{l}")),
        Err(e) => println!("supported:      no ({e})"),
    }
}
