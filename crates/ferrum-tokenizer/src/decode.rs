//! Turning token ids back into text, incrementally.

use crate::Tokenizer;

/// Appends a SentencePiece-style piece: `▁` becomes a space and `<0xXX>`
/// the byte it names.
pub(crate) fn metaspace_into(piece: &str, out: &mut Vec<u8>) {
    if let Some(hex) = piece.strip_prefix("<0x").and_then(|p| p.strip_suffix('>')) {
        if let (2, Ok(b)) = (hex.len(), u8::from_str_radix(hex, 16)) {
            out.push(b);
            return;
        }
    }
    out.extend_from_slice(piece.replace('\u{2581}', " ").as_bytes());
}

/// Streams generated tokens as text. Bytes that do not yet form a complete
/// UTF-8 character are held back until the token that completes them
/// arrives, so no output ever contains half a character.
pub struct IncrementalDecoder<'t> {
    tok: &'t Tokenizer,
    pending: Vec<u8>,
    started: bool,
}

impl<'t> IncrementalDecoder<'t> {
    pub(crate) fn new(tok: &'t Tokenizer) -> Self {
        Self { tok, pending: Vec::new(), started: false }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.tok.append_piece(id, !self.started, &mut self.pending);
        self.started = true;
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // An invalid sequence (not just an unfinished one) can never
            // complete: emit it lossily rather than stall the stream.
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return s;
            }
        };
        let rest = self.pending.split_off(valid);
        let done = std::mem::replace(&mut self.pending, rest);
        // `done` is valid UTF-8 by construction.
        String::from_utf8(done).unwrap_or_default()
    }

    /// Whatever is still held back (an unfinished character at the end of
    /// generation), lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
