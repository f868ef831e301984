//! SentencePiece-style tokenization over a GGUF vocabulary: adjacent pieces
//! merge greedily by the score of the merged token, with byte fallback.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Highest score first; on ties the leftmost pair.
    fn cmp(&self, o: &Self) -> Ordering {
        self.score.total_cmp(&o.score).then(o.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already replaced by `▁`) into `out`.
pub(crate) fn encode(vocab: &Vocab, text: &str, out: &mut Vec<u32>) {
    // (start, len, prev, next); len 0 marks a symbol merged away.
    let mut syms: Vec<(usize, usize, Option<usize>, Option<usize>)> = Vec::new();
    for (i, (start, c)) in text.char_indices().enumerate() {
        syms.push((start, c.len_utf8(), i.checked_sub(1), None));
        if i > 0 {
            syms[i - 1].3 = Some(i);
        }
    }
    let mut heap = BinaryHeap::new();
    let try_add = |heap: &mut BinaryHeap<Bigram>,
                   syms: &[(usize, usize, Option<usize>, Option<usize>)],
                   l: usize,
                   r: usize| {
        let (start, size) = (syms[l].0, syms[l].1 + syms[r].1);
        if let Some(id) = vocab.id(&text[start..start + size]) {
            heap.push(Bigram {
                score: vocab.scores[id as usize],
                left: l,
                right: r,
                size,
            });
        }
    };
    for i in 1..syms.len() {
        try_add(&mut heap, &syms, i - 1, i);
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (b.left, b.right);
        if syms[l].1 == 0
            || syms[r].1 == 0
            || syms[l].3 != Some(r)
            || syms[l].1 + syms[r].1 != b.size
        {
            continue;
        }
        syms[l].1 += syms[r].1;
        syms[r].1 = 0;
        syms[l].3 = syms[r].3;
        if let Some(n) = syms[r].3 {
            syms[n].2 = Some(l);
        }
        if let Some(p) = syms[l].2 {
            try_add(&mut heap, &syms, p, l);
        }
        if let Some(n) = syms[l].3 {
            try_add(&mut heap, &syms, l, n);
        }
    }
    for &(start, len, _, _) in syms.iter().filter(|s| s.1 > 0) {
        let piece = &text[start..start + len];
        match vocab.id(piece) {
            Some(id) => out.push(id),
            // Only single characters can be missing (merges produce vocab
            // tokens): fall back to their UTF-8 bytes.
            None => out.extend(piece.bytes().filter_map(|byte| {
                vocab
                    .byte_token(byte)
                    .or_else(|| vocab.id(&(byte as char).to_string()))
            })),
        }
    }
}
