//! BPE over a GGUF vocabulary: llama.cpp-compatible pre-tokenization
//! followed by rank-ordered merges.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use fancy_regex::Regex;
use ferrum_types::{FerrumError, Result};

use crate::bytes;
use crate::vocab::Vocab;

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const GPT4O: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+";
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// Character classes copied as escapes so no editor can normalise them
// (several are canonically equivalent to other code points).
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const DEEPSEEK_LLM_PUNCT: &str =
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+";
const DEEPSEEK_CJK: &str = "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+";

/// How one `tokenizer.ggml.pre` value pre-tokenizes.
pub(crate) struct PreTokenizer {
    /// Applied in turn; each splits every piece into matches and the gaps
    /// between them (both kept).
    regexes: Vec<Regex>,
    /// A word that is itself a token skips the merges (Llama 3 style).
    pub ignore_merges: bool,
    /// GPT-2 byte-level encoding (false: raw UTF-8 with `▁` for spaces).
    pub byte_encode: bool,
}

impl PreTokenizer {
    pub fn for_pre(pre: &str, model: &str) -> Result<Self> {
        let (patterns, ignore_merges): (&[&str], bool) = match pre {
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (&[LLAMA3], true),
            "dbrx" | "smaug-bpe" | "chatglm-bpe" => (&[LLAMA3], false),
            "glm4" | "glm5" => (&[LLAMA3], true),
            "deepseek-llm" => (
                &[
                    "[\r\n]",
                    DEEPSEEK_LLM_LETTERS,
                    DEEPSEEK_LLM_PUNCT,
                    r"\s+$",
                    DEEPSEEK_CJK,
                    r"\p{N}+",
                ],
                false,
            ),
            "deepseek-coder" => (
                &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", DEEPSEEK_CJK, r"\p{N}"],
                false,
            ),
            "falcon" => (&[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"], false),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => (&[r"\p{N}", GPT2], false),
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "mpt" | "olmo" | "jais" | "trillion" | "exaone4" | "roberta-bpe"
            | "jina-v1-en" | "jina-v2-code" | "mellum" | "modern-bert" | "a.x-4.0" => {
                (&[GPT2], false)
            }
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2" | "megrez"
            | "hunyuan" | "solar-open" => (&[QWEN2], false),
            "qwen35" => (&[QWEN35], false),
            "poro-chat" | "bloom" | "gpt3-finnish" => (&[r" ?[^(\s|.,!?…。，、।۔،)]+"], false),
            "viking" => (&[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"], false),
            "tekken" => (&[TEKKEN], true),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" => (&[GPT4O], false),
            "gemma4" => (&["[^\n]+|[\n]+"], false),
            "default" => (
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
                false,
            ),
            other => {
                return Err(FerrumError::unsupported(format!(
                    "BPE pre-tokenizer '{other}' (tokenizer.ggml.pre) is not supported"
                )))
            }
        };
        let regexes = patterns
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|e| FerrumError::invalid(format!("pre-tokenizer regex: {e}")))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            regexes,
            ignore_merges,
            byte_encode: !(model == "gemma4" || pre == "gemma4"),
        })
    }

    /// Hands each word of `text` to `word`, in order. Each regex splits
    /// the pieces the previous one left, depth first, so no list of words
    /// is built: a 16 MB text costs no more than its token ids.
    pub fn split<'t>(
        &self,
        text: &'t str,
        word: &mut impl FnMut(&'t str) -> Result<()>,
    ) -> Result<()> {
        self.split_from(0, text, word)
    }

    fn split_from<'t>(
        &self,
        level: usize,
        piece: &'t str,
        word: &mut impl FnMut(&'t str) -> Result<()>,
    ) -> Result<()> {
        let Some(re) = self.regexes.get(level) else {
            return word(piece);
        };
        let mut last = 0;
        for m in re.find_iter(piece) {
            let m = m.map_err(|e| {
                FerrumError::invalid(format!("pre-tokenizer on {} bytes: {e}", piece.len()))
            })?;
            if m.start() > last {
                self.split_from(level + 1, &piece[last..m.start()], word)?;
            }
            if m.end() > m.start() {
                self.split_from(level + 1, m.as_str(), word)?;
            }
            last = m.end();
        }
        if last < piece.len() {
            self.split_from(level + 1, &piece[last..], word)?;
        }
        Ok(())
    }
}

/// One symbol of a word being merged: a byte range plus its neighbours.
#[derive(Clone, Copy)]
struct Sym {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
    id: Option<u32>,
}

/// Tokenizes one pre-tokenized fragment of raw text into `out`.
pub(crate) fn encode_fragment(
    vocab: &Vocab,
    pre: &PreTokenizer,
    text: &str,
    out: &mut Vec<u32>,
) -> Result<()> {
    let escaped;
    let text = if pre.byte_encode {
        text
    } else {
        escaped = text.replace(' ', "\u{2581}");
        &escaped
    };
    pre.split(text, &mut |word| {
        let encoded;
        let word = if pre.byte_encode {
            encoded = bytes::encode(word);
            encoded.as_str()
        } else {
            word
        };
        let whole_newlines = !pre.byte_encode && word.bytes().all(|b| b == b'\n');
        if pre.ignore_merges || whole_newlines {
            if let Some(id) = vocab.id(word) {
                out.push(id);
                return Ok(());
            }
        }
        merge_word(vocab, word, pre.byte_encode, out);
        Ok(())
    })
}

fn merge_word(vocab: &Vocab, word: &str, byte_encode: bool, out: &mut Vec<u32>) {
    let mut syms: Vec<Sym> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
        let len = c.len_utf8();
        syms.push(Sym {
            start,
            len,
            prev: i.checked_sub(1),
            next: None,
            id: vocab.id(&word[start..start + len]),
        });
        if i > 0 {
            syms[i - 1].next = Some(i);
        }
    }
    // Min-heap on (rank, left index): lowest rank first, leftmost on ties.
    let mut heap: BinaryHeap<Reverse<(u32, usize, usize, usize)>> = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize, r: usize| {
        if let (Some(a), Some(b)) = (syms[l].id, syms[r].id) {
            if let Some(&rank) = vocab.merges.get(&(a, b)) {
                heap.push(Reverse((rank, l, syms[l].len, syms[r].len)));
            }
        }
    };
    for i in 1..syms.len() {
        push(&mut heap, &syms, i - 1, i);
    }
    while let Some(Reverse((_, l, llen, rlen))) = heap.pop() {
        let Some(r) = syms[l].next else { continue };
        // Stale entries: a side has grown (or was absorbed) since queued.
        if syms[l].len != llen || syms[r].len != rlen || syms[r].len == 0 {
            continue;
        }
        syms[l].len += syms[r].len;
        syms[r].len = 0;
        syms[l].next = syms[r].next;
        if let Some(n) = syms[r].next {
            syms[n].prev = Some(l);
        }
        syms[l].id = vocab.id(&word[syms[l].start..syms[l].start + syms[l].len]);
        if let Some(p) = syms[l].prev {
            push(&mut heap, &syms, p, l);
        }
        if let Some(n) = syms[l].next {
            push(&mut heap, &syms, l, n);
        }
    }
    for s in syms.iter().filter(|s| s.len > 0) {
        match s.id {
            Some(id) => out.push(id),
            None => {
                let piece = &word[s.start..s.start + s.len];
                if byte_encode {
                    // Each character is already one encoded byte.
                    out.extend(
                        piece
                            .chars()
                            .filter_map(|c| vocab.id(c.encode_utf8(&mut [0; 4]))),
                    );
                } else {
                    out.extend(piece.bytes().filter_map(|b| vocab.byte_token(b)));
                }
            }
        }
    }
}
