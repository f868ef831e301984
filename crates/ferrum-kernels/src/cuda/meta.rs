//! The segments and block tables the paged kernels read, on the device.
//!
//! Every paged op of a step describes the same sequences (each layer's
//! K/V append, Q/K/V rows and attention), so the words are uploaded only
//! when they differ from what the device already holds: once a step, not
//! once a call. A pageable upload may wait for the stream; once a step it
//! costs little, and the decode graphs of the CUDA decode work will read
//! these from device memory they own.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DriverError};

use crate::{encode_segments, AttnSegment};

/// The device buffer's least size: 64 sequences' tables to 16K positions
/// each in blocks of 16, so it is rarely replaced (which drops the
/// captured steps).
const MIN_WORDS: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct Meta {
    /// What the device buffer holds.
    held: Vec<u32>,
    /// The words of the current call (kept to reuse its allocation).
    next: Vec<u32>,
    dev: Option<CudaSlice<u32>>,
}

impl Meta {
    /// The device words for `segs` (see [`encode_segments`]), uploading
    /// them unless the device holds them already. Stream order keeps an
    /// upload behind the kernels that read the words before.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        segs: &[AttnSegment],
    ) -> Result<&CudaSlice<u32>, DriverError> {
        encode_segments(&mut self.next, segs);
        super::attention::set_step_shape(segs);
        let fresh = self.dev.is_some() && self.next == self.held;
        if !fresh {
            if self.dev.as_ref().is_none_or(|d| d.len() < self.next.len()) {
                // Captured steps hold the old buffer's address.
                super::lock(&super::device::get().graphs).invalidate();
                self.dev = None; // freed before the larger one is taken
                let len = self.next.len().next_power_of_two().max(MIN_WORDS);
                self.dev = Some(stream.alloc_zeros::<u32>(len)?);
            }
            if let Some(dev) = self.dev.as_mut() {
                let mut head = dev.slice_mut(..self.next.len());
                stream.memcpy_htod(&self.next, &mut head)?;
            }
            std::mem::swap(&mut self.held, &mut self.next);
        }
        match self.dev.as_ref() {
            Some(d) => Ok(d),
            None => Err(DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_UNKNOWN,
            )),
        }
    }
}
