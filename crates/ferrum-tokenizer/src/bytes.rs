//! GPT-2's reversible byte → printable character mapping.
//!
//! Byte-level BPE vocabularies store tokens as strings of these characters
//! so that every byte sequence is representable: printable Latin-1 bytes map
//! to themselves, the other 68 to U+0100 upwards.

use std::sync::OnceLock;

fn tables() -> &'static ([char; 256], std::collections::HashMap<char, u8>) {
    static T: OnceLock<([char; 256], std::collections::HashMap<char, u8>)> = OnceLock::new();
    T.get_or_init(|| {
        let mut enc = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            enc[b as usize] = if printable {
                b as char
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        let dec = enc.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        (enc, dec)
    })
}

/// Encodes raw bytes as byte-level BPE characters.
pub(crate) fn encode(text: &str) -> String {
    let enc = &tables().0;
    text.bytes().map(|b| enc[b as usize]).collect()
}

/// Decodes byte-level characters back to bytes; characters outside the
/// table (added tokens written in plain text) pass through as UTF-8.
pub(crate) fn decode_into(token: &str, out: &mut Vec<u8>) {
    let dec = &tables().1;
    for c in token.chars() {
        match dec.get(&c) {
            Some(&b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let text = String::from_utf8_lossy(&all).into_owned();
        let mut back = Vec::new();
        super::decode_into(&super::encode(&text), &mut back);
        assert_eq!(back, text.as_bytes());
        assert_eq!(super::encode(" a\n"), "Ġa\u{10a}");
    }
}
