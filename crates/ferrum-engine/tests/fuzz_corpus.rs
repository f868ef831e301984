//! The fuzz targets, run on stable in CI: every seed in `fuzz/seeds/<target>/`
//! (written by `scripts/make_fuzz_corpus.py`: a tiny valid file of each kind
//! and the hostile cases found so far) and a fixed number of deterministic
//! mutations of each. A model file or chat template, however malformed, is
//! loaded (and runs) or is refused with an error: never a panic, an abort
//! or an allocation sized by the file.
//!
//! `cargo fuzz run <target>` in `fuzz/` explores the same targets with
//! coverage guidance, which needs nightly's instrumentation and too long a
//! build for CI; what it finds goes into `fuzz/seeds/` and is then run here on
//! every commit. A failing input is written to `target/fuzz-failures/`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../../../fuzz/targets.rs"]
mod targets;

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds");

/// xorshift64*: the same mutations on every run and machine.
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// One to four edits of `seed`: bit flips, boundary bytes and words
    /// (sizes a file states), deleted and repeated ranges, and numbers in
    /// text swapped for extreme ones (sizes a config states).
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        const WORDS: [u64; 6] = [0, 1, u32::MAX as u64, 1 << 31, u64::MAX, 1 << 40];
        const NUMBERS: [&str; 7] = ["0", "-1", "4294967295", "1e308", "65536", "1.5", "null"];
        let mut v = seed.to_vec();
        for _ in 0..1 + self.below(4) {
            if v.is_empty() {
                v.push(b'{');
            }
            let at = self.below(v.len());
            match self.below(6) {
                0 => v[at] ^= 1 << self.below(8),
                1 => v[at] = [0, 0xff, 0x7f, 0x80, b'"', b'{', b'}', b'%'][self.below(8)],
                2 => {
                    let word = WORDS[self.below(WORDS.len())].to_le_bytes();
                    let n = [4, 8][self.below(2)].min(v.len() - at);
                    v[at..at + n].copy_from_slice(&word[..n]);
                }
                3 => {
                    let n = self.below(64).min(v.len() - at);
                    v.drain(at..at + n);
                }
                4 => {
                    let n = self.below(64).min(v.len() - at);
                    let piece = v[at..at + n].to_vec();
                    v.splice(at..at, piece);
                }
                _ => {
                    // The next run of ASCII digits from `at`, if any.
                    if let Some(s) = v[at..].iter().position(u8::is_ascii_digit) {
                        let s = at + s;
                        let e = s + v[s..].iter().take_while(|b| b.is_ascii_digit()).count();
                        let n = NUMBERS[self.below(NUMBERS.len())].bytes();
                        v.splice(s..e, n);
                    }
                }
            }
        }
        v
    }
}

/// Runs `target` on every seed of `name` and `per_seed` mutations of each.
/// `target` says whether it accepted its input (loaded and ran it): the
/// seed named `valid` must be accepted, or the mutations would test only
/// the first check they meet.
fn run(name: &str, per_seed: usize, target: impl Fn(&[u8], &Path) -> bool) {
    let dir = Path::new(CORPUS).join(name);
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a readable seed folder").path())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    let scratch = targets::scratch(name);
    let mut m = Mutator(0x9e37_79b9_7f4a_7c15);
    let (mut runs, mut accepted) = (0, 0);
    for seed in &seeds {
        let bytes = std::fs::read(seed).expect("a readable seed");
        for i in 0..=per_seed {
            let input = if i == 0 {
                bytes.clone()
            } else {
                m.mutate(&bytes)
            };
            let outcome = catch_unwind(AssertUnwindSafe(|| target(&input, &scratch)));
            runs += 1;
            match outcome {
                Ok(true) => accepted += 1,
                Ok(false) => assert!(
                    i > 0 || !seed.ends_with("valid"),
                    "{name}: the valid seed {} was refused",
                    seed.display()
                ),
                Err(_) => {
                    let out =
                        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/fuzz-failures");
                    std::fs::create_dir_all(&out).expect("target/ is writable");
                    let file = out.join(format!(
                        "{name}-{}-{i}",
                        seed.file_name().unwrap_or_default().to_string_lossy()
                    ));
                    std::fs::write(&file, &input).expect("target/ is writable");
                    panic!(
                        "{name} panicked on {} (mutation {i} of {})",
                        file.display(),
                        seed.display()
                    );
                }
            }
        }
    }
    eprintln!("{name}: {runs} inputs, {accepted} accepted");
    let _ = std::fs::remove_dir_all(&scratch);
}

#[test]
fn gguf_files_load_or_fail_cleanly() {
    run("gguf_file", 1000, targets::gguf_file);
}

#[test]
fn hf_checkpoints_load_or_fail_cleanly() {
    run("hf_checkpoint", 1000, targets::hf_checkpoint);
}

#[test]
fn chat_templates_render_or_fail_cleanly() {
    run("chat_template", 2000, |input, _| {
        targets::chat_template(input)
    });
}
