//! A model file's bytes: memory-mapped (the default: no copy, pages shared
//! with the page cache) or read into memory (`--no-mmap`, as llama.cpp's
//! flag). A mapped file that another process truncates or replaces while it
//! is in use faults (SIGBUS) on the next read of a page past its new end;
//! the `ferrum` binary reports that as "the model file changed on disk", and
//! `--no-mmap` avoids it at the cost of a copy in memory.

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use ferrum_types::{FerrumError, Result};
use memmap2::Mmap;

static READ_INTO_MEMORY: AtomicBool = AtomicBool::new(false);

/// Whether model files are read into memory instead of mapped, for every
/// file opened after the call (`--no-mmap`).
pub fn set_read_into_memory(on: bool) {
    READ_INTO_MEMORY.store(on, Ordering::Relaxed);
}

pub fn reads_into_memory() -> bool {
    READ_INTO_MEMORY.load(Ordering::Relaxed)
}

pub enum FileBytes {
    Mapped(Mmap),
    Read(Vec<u8>),
}

impl FileBytes {
    /// `file`'s bytes, mapped or read as [`set_read_into_memory`] says.
    pub fn open(file: &File, path: &Path) -> Result<Self> {
        if reads_into_memory() {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut &*file, &mut bytes)
                .map_err(|e| FerrumError::io(path, e))?;
            return Ok(Self::Read(bytes));
        }
        // SAFETY: the map is read-only; a file truncated underneath us by
        // another process faults on access (see the module comment).
        let map = unsafe { Mmap::map(file) }.map_err(|e| FerrumError::io(path, e))?;
        Ok(Self::Mapped(map))
    }
}

impl std::ops::Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Mapped(m) => m,
            Self::Read(v) => v,
        }
    }
}

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}
