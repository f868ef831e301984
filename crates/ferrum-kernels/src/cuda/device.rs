//! The process-wide CUDA device: context, stream, cuBLAS handle and the
//! kernels compiled from `kernels/` by NVRTC (cached on disk per source,
//! tuning and architecture, so only the first run pays the compile).
//!
//! `Backend`'s buffer functions (`alloc`, `from_slice`) take no handle, so
//! the device is a global chosen once by [`super::CudaBackend::init`].

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream};
use cudarc::nvrtc::Ptx;
use ferrum_types::{FerrumError, Result};

/// The kernels, one source in this order (later files use earlier ones).
pub(crate) const SOURCE: &str = concat!(
    include_str!("kernels/common.cuh"),
    include_str!("kernels/elementwise.cu"),
    include_str!("kernels/attention.cu"),
    include_str!("kernels/blocks.cuh"),
    include_str!("kernels/dequant.cu"),
    include_str!("kernels/mmvq.cu"),
);

/// What NVRTC compiles: [`SOURCE`], then every kernel's declaration as
/// `launch.rs` types it, so a launch that disagrees with its kernel's
/// signature fails to compile.
pub(crate) fn full_source() -> &'static str {
    static FULL: OnceLock<String> = OnceLock::new();
    FULL.get_or_init(|| format!("{SOURCE}\n{}", super::launch::declarations()))
}

/// Compile-time constants of the quantized GEMV (`MMVQ_*` in mmvq.cu) that
/// the host must know to launch it. The defaults are the source's;
/// `FERRUM_CUDA_TUNE=cols=4,threads=64` builds a variant (its own cache
/// file), which is how `scripts/gpu-check.sh` times variants against the
/// default on one card.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Tune {
    /// Output columns a block computes.
    pub cols: usize,
    /// Threads a block.
    pub threads: usize,
}

impl Default for Tune {
    /// The fastest of those timed on an H200 (docs/perf-log.md,
    /// 2026-11-28): four columns a block, 128 threads.
    fn default() -> Self {
        Tune { cols: 4, threads: 128 }
    }
}

impl Tune {
    /// `cols=N,threads=N` (either may be left out); `None` for anything
    /// else or values a kernel cannot take.
    pub fn parse(spec: &str) -> Option<Tune> {
        let mut t = Tune::default();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=')?;
            let value: usize = value.trim().parse().ok()?;
            match key.trim() {
                "cols" if (1..=8).contains(&value) => t.cols = value,
                "threads" if value.is_power_of_two() && (32..=1024).contains(&value) => {
                    t.threads = value
                }
                _ => return None,
            }
        }
        Some(t)
    }

    /// NVRTC options that build this variant (none for the default, so its
    /// PTX is the source's as written).
    fn defines(self) -> Vec<String> {
        if self == Tune::default() {
            return Vec::new();
        }
        vec![
            format!("-DMMVQ_COLS={}", self.cols),
            format!("-DMMVQ_THREADS={}", self.threads),
        ]
    }
}
pub(crate) struct Device {
    pub stream: Arc<CudaStream>,
    pub tune: Tune,
    /// f32 activations in every GEMM on blocks (`FERRUM_CUDA_F32=1`, or
    /// `CudaBackend::set_f32_activations`): the f32 GEMV kernels and the
    /// f32 SGEMM instead of the q8_1 GEMV and the bf16 GEMM. The reference
    /// the fast path is measured and tested against; slower.
    pub f32_activations: AtomicBool,
    /// Rows up to which GEMMs on blocks run the q8_1 GEMV
    /// (`FERRUM_CUDA_MMVQ_ROWS`, default `gemm::MMVQ_MAX_ROWS`).
    pub mmvq_rows: usize,
    pub blas: CudaBlas,
    /// The kernels, in `launch::names` order.
    pub funcs: Vec<CudaFunction>,
    /// Dequantized weights for `gemm_quant` at m > 8, reused across calls
    /// (stream order makes reuse safe).
    pub scratch: Mutex<Option<CudaSlice<f32>>>,
    /// Split-K attention partials.
    pub attn_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// The activation of an act-order weight in its input order.
    pub reorder_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// A GEMV's activation as q8_1 (int8 values, then a float pair a block).
    pub q8_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// A prefill GEMM's weight and activation in bf16.
    pub bf16_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// The segments and block tables of the paged ops.
    pub meta: Mutex<super::meta::Meta>,
    /// Captured decode steps.
    pub graphs: Mutex<super::graphs::Graphs>,
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

fn cache_dir() -> PathBuf {
    std::env::var_os("FERRUM_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferrum/kernels")
        })
}

/// NVRTC options for `arch` and `tune`: machine code for that exact
/// architecture (a cubin the driver loads as it is; PTX would be compiled
/// again by the driver at every start).
fn options(arch: (i32, i32), tune: Tune) -> Vec<String> {
    let mut o = vec![
        "--std=c++17".to_string(),
        format!("--gpu-architecture=sm_{}{}", arch.0, arch.1),
    ];
    o.extend(tune.defines());
    o
}

/// The cache file of the kernels built with `options`, named after the
/// source and options.
fn cache_path(options: &[String]) -> PathBuf {
    let key = fnv(&format!("{}{}", full_source(), options.join(" ")));
    let arch = options
        .iter()
        .find_map(|o| o.strip_prefix("--gpu-architecture="))
        .unwrap_or("any");
    cache_dir().join(format!("{key:016x}-{arch}.cubin"))
}

/// NVRTC's cubin of `src` (cudarc's safe API returns PTX only) and its
/// log (ptxas's report, with `--ptxas-options=-v`).
fn nvrtc_cubin(src: &str, options: &[String]) -> Result<(Vec<u8>, String)> {
    use cudarc::nvrtc::{result, sys};
    let csrc = std::ffi::CString::new(src)
        .map_err(|_| FerrumError::Device("kernel source holds a NUL byte".into()))?;
    let prog = result::create_program(&csrc, None).map_err(|e| dev_err("NVRTC", e))?;
    // SAFETY: `prog` is a live program until destroyed below; the buffer
    // is sized by NVRTC's own report.
    let out = unsafe {
        match result::compile_program(prog, options) {
            Err(e) => {
                let log = result::get_program_log(prog).unwrap_or_default();
                let log: String = log.iter().map(|&c| c as u8 as char).collect();
                Err(FerrumError::Device(format!(
                    "NVRTC could not compile the kernels ({e:?}): {log}"
                )))
            }
            Ok(()) => {
                let log = result::get_program_log(prog).unwrap_or_default();
                let log: String = log.iter().map(|&c| c as u8 as char).collect();
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .map_err(|e| dev_err("NVRTC cubin size", e))
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| (buf, log))
                            .map_err(|e| dev_err("NVRTC cubin", e))
                    })
            }
        }
    };
    // SAFETY: created above, not used after.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The kernels for `arch` as a cubin: from the cache, else compiled and
/// cached (second value: whether it came from the cache).
fn cubin(arch: (i32, i32), tune: Tune) -> Result<(Vec<u8>, bool)> {
    let options = options(arch, tune);
    let path = cache_path(&options);
    if let Ok(bin) = std::fs::read(&path) {
        return Ok((bin, true));
    }
    let (bin, _log) = nvrtc_cubin(full_source(), &options)?;
    // The cache is an optimisation: failing to write it is not an error.
    // Written under a temporary name, then renamed: a process starting
    // meanwhile never reads half a file.
    let _ = std::fs::create_dir_all(cache_dir());
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, &bin).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    Ok((bin, false))
}

/// Compiles the kernels for `arch` with the tuning `tune` (as
/// `FERRUM_CUDA_TUNE` takes it) into the kernel cache without a GPU (only
/// NVRTC is needed), so a GPU machine starts without compiling: the GPU
/// check prepares its variants this way. Returns the cache file.
pub fn precompile(arch: (i32, i32), tune: &str) -> Result<PathBuf> {
    let tune =
        Tune::parse(tune).ok_or_else(|| FerrumError::invalid(format!("bad tuning {tune:?}")))?;
    cubin(arch, tune)?;
    Ok(cache_path(&options(arch, tune)))
}

/// ptxas's report on the kernels for `arch` with the default tuning:
/// registers, stack and spills per kernel, as `ptxas -v` prints them.
/// Needs NVRTC only, no GPU; CI checks it for every architecture.
pub fn ptxas_report(arch: (i32, i32)) -> Result<String> {
    let mut options = options(arch, Tune::default());
    options.push("--ptxas-options=-v".into());
    nvrtc_cubin(full_source(), &options).map(|(_, log)| log)
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
    // One non-blocking stream (the legacy default stream cannot be
    // captured into graphs). Every op runs on it, in order, so cudarc's
    // per-buffer events (for ordering across streams) are not needed:
    // turned off before any buffer exists.
    // SAFETY: nothing else uses this context's buffers on another stream.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| dev_err("cannot create a CUDA stream", e))?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| dev_err("cannot start cuBLAS", e))?;
    let tune = match std::env::var("FERRUM_CUDA_TUNE") {
        Ok(spec) => Tune::parse(&spec).ok_or_else(|| {
            FerrumError::Device(format!(
                "FERRUM_CUDA_TUNE={spec:?}: expected cols=1..8,threads=32..1024 (a power of two)"
            ))
        })?,
        Err(_) => Tune::default(),
    };
    let (bin, cached) = cubin(arch, tune)?;
    let module = match ctx.load_module(Ptx::from_binary(bin)) {
        Ok(m) => m,
        // A cached cubin this driver does not take (another toolkit's):
        // compile afresh with this machine's NVRTC.
        Err(_) if cached => {
            let _ = std::fs::remove_file(cache_path(&options(arch, tune)));
            ctx.load_module(Ptx::from_binary(cubin(arch, tune)?.0))
                .map_err(|e| dev_err("cannot load the kernels", e))?
        }
        Err(e) => return Err(dev_err("cannot load the kernels", e)),
    };
    let funcs = super::launch::names()
        .map(|n| {
            module
                .load_function(&n)
                .map_err(|e| dev_err(&format!("kernel {n}"), e))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Device {
        stream,
        tune,
        f32_activations: AtomicBool::new(std::env::var("FERRUM_CUDA_F32").is_ok_and(|v| v == "1")),
        mmvq_rows: std::env::var("FERRUM_CUDA_MMVQ_ROWS")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(super::gemm::MMVQ_MAX_ROWS),
        blas,
        funcs,
        scratch: Mutex::new(None),
        attn_scratch: Mutex::new(None),
        reorder_scratch: Mutex::new(None),
        q8_scratch: Mutex::new(None),
        bf16_scratch: Mutex::new(None),
        meta: Mutex::new(super::meta::Meta::default()),
        graphs: Mutex::new(super::graphs::Graphs::new(
            std::env::var("FERRUM_CUDA_GRAPHS").map_or(true, |v| v != "0"),
        )),
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

    /// A kernel in the source but not in `launch.rs` could not be
    /// launched, and one in the table but not the source would fail to
    /// load on a GPU: check the table against the source's entry points
    /// (`##T` ones once per quantized type) here, without one.
    #[test]
    fn every_kernel_in_the_source_is_loaded_and_no_other() {
        let mut in_source = BTreeSet::new();
        for part in super::SOURCE.split("__global__ void ").skip(1) {
            // `__launch_bounds__(n)` may stand before the name.
            let part = match part.strip_prefix("__launch_bounds__(") {
                Some(rest) => rest[rest.find(')').unwrap_or(0) + 1..].trim_start(),
                None => part,
            };
            let name = &part[..part.find('(').unwrap_or(0)];
            match name.strip_suffix("##T") {
                Some(stem) => in_source
                    .extend(crate::GgufQuantType::all().map(|t| format!("{stem}{}", t.name()))),
                None => {
                    in_source.insert(name.to_string());
                }
            }
        }
        let loaded: BTreeSet<String> = super::super::launch::names().collect();
        assert_eq!(
            loaded.len(),
            super::super::launch::names().count(),
            "a name twice"
        );
        assert_eq!(loaded, in_source);
    }

    /// The host's launch shape follows the compiled variant, so a tuning
    /// string must name a variant the kernels can take, and only that.
    #[test]
    fn tuning_strings() {
        use super::Tune;
        assert_eq!(Tune::parse(""), Some(Tune::default()));
        assert_eq!(
            Tune::parse("cols=2, threads=64"),
            Some(Tune { cols: 2, threads: 64 })
        );
        assert_eq!(Tune::parse("threads=256").map(|t| t.cols), Some(4));
        for bad in [
            "cols=0",
            "cols=9",
            "threads=100",
            "threads=2048",
            "rows=2",
            "cols",
        ] {
            assert_eq!(Tune::parse(bad), None, "{bad}");
        }
        assert!(Tune::default().defines().is_empty());
        assert_eq!(
            Tune::parse("cols=2").unwrap().defines(),
            ["-DMMVQ_COLS=2", "-DMMVQ_THREADS=128"]
        );
    }

    /// The defaults here are the source's (mmvq.cu's `#define`s).
    #[test]
    fn default_tuning_is_the_sources() {
        let t = super::Tune::default();
        assert!(super::SOURCE.contains(&format!("#define MMVQ_COLS {} ", t.cols)));
        assert!(super::SOURCE.contains(&format!("#define MMVQ_THREADS {}\n", t.threads)));
    }
}
