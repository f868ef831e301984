//! Captured decode steps (CUDA graphs), kept per key (see the graph
//! hooks of `Backend`).
//!
//! A graph holds the addresses of every buffer its launches used, so it is
//! dropped whenever one of the backend's own scratch buffers is replaced
//! (`invalidate`); the model resets them when it replaces its own.

use std::collections::HashMap;

use cudarc::driver::CudaGraph;

pub(crate) struct Graphs {
    /// `FERRUM_CUDA_GRAPHS=0` turns capture off.
    pub enabled: bool,
    by_key: HashMap<u64, CudaGraph>,
    /// The key of the capture in progress.
    pub capturing: Option<u64>,
}

// SAFETY: a CUDA graph may be used from any thread as long as uses are not
// concurrent; every use goes through the device's mutex.
unsafe impl Send for Graphs {}

impl Graphs {
    pub fn new(enabled: bool) -> Self {
        Graphs {
            enabled,
            by_key: HashMap::new(),
            capturing: None,
        }
    }

    pub fn get(&self, key: u64) -> Option<&CudaGraph> {
        self.by_key.get(&key)
    }

    pub fn insert(&mut self, key: u64, graph: CudaGraph) {
        self.by_key.insert(key, graph);
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Drops every graph: a buffer they may use is being replaced.
    pub fn invalidate(&mut self) {
        self.by_key.clear();
    }
}
