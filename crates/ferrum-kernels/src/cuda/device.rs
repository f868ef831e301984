//! The process-wide CUDA device: context, stream, cuBLAS handle and the
//! kernels compiled from `kernels.cu` by NVRTC (cached on disk per source
//! hash and architecture, so only the first run pays the compile).
//!
//! `Backend`'s buffer functions (`alloc`, `from_slice`) take no handle, so
//! the device is a global chosen once by [`super::CudaBackend::init`].

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use ferrum_types::{FerrumError, Result};

const SOURCE: &str = include_str!("kernels.cu");

pub(crate) struct Device {
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub funcs: HashMap<String, CudaFunction>,
    /// Dequantized weights for `gemm_quant` at m > 8, reused across calls
    /// (stream order makes reuse safe).
    pub scratch: Mutex<Option<CudaSlice<f32>>>,
    /// Split-K attention partials.
    pub attn_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// The activation of an act-order weight in its input order.
    pub reorder_scratch: Mutex<Option<CudaSlice<f32>>>,
    pub name: String,
    pub arch: (i32, i32),
}

static DEVICE: OnceLock<Device> = OnceLock::new();

fn dev_err(what: &str, e: impl std::fmt::Debug) -> FerrumError {
    FerrumError::Device(format!("{what}: {e:?}"))
}

/// FNV-1a, to name the kernel cache file after the source it came from.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}

fn cache_path(arch: (i32, i32)) -> PathBuf {
    let base = std::env::var_os("FERRUM_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferrum/kernels")
        });
    base.join(format!("{:016x}-sm{}{}.ptx", fnv(SOURCE), arch.0, arch.1))
}

fn compile(arch: (i32, i32)) -> Result<Ptx> {
    let path = cache_path(arch);
    if let Ok(src) = std::fs::read_to_string(&path) {
        return Ok(Ptx::from_src(src));
    }
    let arch_flag: &'static str =
        Box::leak(format!("compute_{}{}", arch.0, arch.1).into_boxed_str());
    let opts = CompileOptions {
        arch: Some(arch_flag),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(SOURCE, opts)
        .map_err(|e| dev_err("NVRTC could not compile the kernels", e))?;
    // The cache is an optimisation: failing to write it is not an error.
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(&path, ptx.to_src());
    }
    Ok(ptx)
}

/// Kernel names in `kernels.cu`.
const KERNELS: &[&str] = &[
    "rms_norm",
    "fused_add_rms_norm",
    "layer_norm",
    "add_inplace",
    "scale_add_rows",
    "gather_add_rows",
    "add_bias",
    "gelu_erf",
    "silu_mul",
    "gelu_tanh_mul",
    "split_qkv",
    "embedding",
    "gather_columns",
    "head_to_token",
    "kv_append",
    "qk_norm_rope",
    "attention",
    "attention_combine",
];
pub(crate) const QUANT_TYPES: &[&str] = &[
    "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
];

/// Every kernel `open` loads: the fixed ones and each quantized type's.
fn kernel_names() -> impl Iterator<Item = String> {
    KERNELS
        .iter()
        .map(|k| k.to_string())
        .chain(QUANT_TYPES.iter().flat_map(|t| {
            [
                format!("dequant_{t}"),
                format!("gemv_{t}"),
                format!("gemv_experts_{t}"),
            ]
        }))
}

/// Whether the CUDA libraries load and at least one GPU is visible.
pub(crate) fn present() -> bool {
    // SAFETY: probing for shared libraries has no preconditions.
    let libs = unsafe {
        cudarc::driver::sys::is_culib_present()
            && cudarc::nvrtc::sys::is_culib_present()
            && cudarc::cublas::sys::is_culib_present()
    };
    libs && catch_unwind(CudaContext::device_count).is_ok_and(|c| c.is_ok_and(|n| n > 0))
}

fn open(ordinal: usize) -> Result<Device> {
    if !present() {
        return Err(FerrumError::Device(
            "no CUDA GPU found (a driver with libcuda, libnvrtc and libcublas is needed); use the CPU (the default)"
                .into(),
        ));
    }
    let count = CudaContext::device_count().map_err(|e| dev_err("cannot query CUDA devices", e))?;
    if ordinal >= count.max(0) as usize {
        return Err(FerrumError::Device(format!(
            "cuda:{ordinal} does not exist ({count} CUDA device(s) found)"
        )));
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| dev_err("cannot open the CUDA device", e))?;
    let arch = ctx
        .compute_capability()
        .map_err(|e| dev_err("cannot read the compute capability", e))?;
    let name = ctx.name().unwrap_or_else(|_| "CUDA device".into());
    let stream = ctx.default_stream();
    let blas = CudaBlas::new(stream.clone()).map_err(|e| dev_err("cannot start cuBLAS", e))?;
    let module = ctx
        .load_module(compile(arch)?)
        .map_err(|e| dev_err("cannot load the kernels", e))?;
    let mut funcs = HashMap::new();
    for n in kernel_names() {
        let f = module
            .load_function(&n)
            .map_err(|e| dev_err(&format!("kernel {n}"), e))?;
        funcs.insert(n, f);
    }
    Ok(Device {
        stream,
        blas,
        funcs,
        scratch: Mutex::new(None),
        attn_scratch: Mutex::new(None),
        reorder_scratch: Mutex::new(None),
        name,
        arch,
    })
}

/// Opens `cuda:ordinal` once per process; later calls must name the same
/// device. Never panics: a missing driver or GPU is an error.
pub(crate) fn init(ordinal: usize) -> Result<&'static Device> {
    if let Some(d) = DEVICE.get() {
        return Ok(d);
    }
    let opened = catch_unwind(AssertUnwindSafe(|| open(ordinal)))
        .map_err(|_| FerrumError::Device("the CUDA libraries failed to load".into()))??;
    Ok(DEVICE.get_or_init(|| opened))
}

/// The device every op runs on.
///
/// # Panics
/// When no device was opened: callers must `CudaBackend::init` first (a
/// programming error, not bad input).
pub(crate) fn get() -> &'static Device {
    match DEVICE.get() {
        Some(d) => d,
        None => panic!("CudaBackend used before CudaBackend::init succeeded"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    /// Launches look kernels up by name, so a kernel missing from the list
    /// fails only on a GPU: check the list against the source's entry
    /// points (`##T` ones once per quantized type) here, without one.
    #[test]
    fn every_kernel_in_the_source_is_loaded_and_no_other() {
        let mut in_source = BTreeSet::new();
        for part in super::SOURCE.split("__global__ void ").skip(1) {
            let name = &part[..part.find('(').unwrap_or(0)];
            match name.strip_suffix("##T") {
                Some(stem) => {
                    in_source.extend(super::QUANT_TYPES.iter().map(|t| format!("{stem}{t}")))
                }
                None => {
                    in_source.insert(name.to_string());
                }
            }
        }
        let loaded: BTreeSet<String> = super::kernel_names().collect();
        assert_eq!(loaded, in_source);
    }
}
