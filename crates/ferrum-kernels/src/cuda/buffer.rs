//! The CUDA backend's buffer: device f32 words and what they hold.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, SyncOnDrop};

use super::device;
use super::launch::{Ptr, PtrMut};
use crate::Dtype;

/// Device memory of f32 words tagged with what they hold. Launches check
/// the tag against each pointer parameter's C type (`launch::accepts`),
/// and `gemm_quant` against the kind it is given, so that no kernel reads
/// one layout as another. Dereferences to the slice for the slicing and
/// copies that do not care what the words mean.
pub struct CudaBuffer {
    data: CudaSlice<f32>,
    dtype: Dtype,
}

impl CudaBuffer {
    pub(super) fn new(data: CudaSlice<f32>, dtype: Dtype) -> Self {
        Self { data, dtype }
    }

    pub fn dtype(&self) -> Dtype {
        self.dtype
    }
}

/// `len` zeroed floats (at least one) on the device.
///
/// Running out of device memory panics, as a failed host allocation
/// aborts: the seed's `alloc` has no error, and callers allocate at load
/// or when scratch grows, never per step (the engine's step fence turns
/// it into failed requests).
pub(super) fn zeros(len: usize) -> CudaSlice<f32> {
    match device::get().stream.alloc_zeros::<f32>(len.max(1)) {
        Ok(b) => b,
        Err(e) => panic!("CUDA allocation of {len} floats failed: {e:?}"),
    }
}

/// A copy of `data` on the device (one zero where it is empty); panics
/// as [`zeros`] does.
pub(super) fn upload(data: &[f32]) -> CudaSlice<f32> {
    if data.is_empty() {
        return zeros(1);
    }
    match device::get().stream.clone_htod(data) {
        Ok(b) => b,
        Err(e) => panic!("CUDA upload of {} floats failed: {e:?}", data.len()),
    }
}

impl Deref for CudaBuffer {
    type Target = CudaSlice<f32>;
    fn deref(&self) -> &CudaSlice<f32> {
        &self.data
    }
}

impl DerefMut for CudaBuffer {
    fn deref_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.data
    }
}

impl Ptr for CudaBuffer {
    fn raw<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.data.device_ptr(stream)
    }

    fn held(&self) -> Option<Dtype> {
        Some(self.dtype)
    }
}

impl PtrMut for CudaBuffer {
    fn raw_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.data.device_ptr_mut(stream)
    }
}

impl DeviceSlice<f32> for CudaBuffer {
    fn len(&self) -> usize {
        self.data.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.data.stream()
    }
}

impl DevicePtr<f32> for CudaBuffer {
    fn device_ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.data.device_ptr(stream)
    }
}

impl DevicePtrMut<f32> for CudaBuffer {
    fn device_ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.data.device_ptr_mut(stream)
    }
}
