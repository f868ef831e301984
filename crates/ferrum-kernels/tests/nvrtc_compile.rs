#![cfg(feature = "cuda")]
//! NVRTC needs no GPU: the kernels are compiled here exactly as a GPU
//! machine compiles them, ptxas included, for every architecture served.

use std::collections::BTreeMap;

/// CUDA reads f32 K/V only: an f16 cache is refused at load, by name, not
/// stored as f32 behind the user's back. (Needs no GPU.)
#[test]
fn cuda_refuses_kv_types_it_cannot_read() {
    use ferrum_kernels::{Backend, CudaBackend, KvDtype};
    let caps = CudaBackend::capabilities();
    assert!(caps.graphs && caps.grouped_experts);
    assert_eq!(caps.kv_dtype(None).ok(), Some(KvDtype::F32));
    let err = caps.kv_dtype(Some(KvDtype::F16)).unwrap_err();
    assert!(
        err.to_string()
            .contains("f16 KV cache is not supported on CUDA"),
        "{err}"
    );
}

/// Whether NVRTC loads; where `FERRUM_REQUIRE_NVRTC=1` (CI, once the
/// wheel is installed) its absence fails instead of skipping, so a wrong
/// library path cannot turn these tests into silent passes.
fn nvrtc_present() -> bool {
    let present = unsafe { cudarc::nvrtc::sys::is_culib_present() };
    if !present {
        let required = std::env::var("FERRUM_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "libnvrtc not found (LD_LIBRARY_PATH must name its folder by an absolute path)"
        );
        eprintln!("skipped: libnvrtc not found");
    }
    present
}

/// Spills ptxas reports today, each with its reason; any other spill in
/// any kernel fails the build, and so does an entry no longer needed.
/// `mmvq_experts_q5_1` on sm_90: ptxas aims at 128 registers for 128
/// threads and keeps one 8-byte value in local memory (L1). Raising the
/// bound (`__launch_bounds__(128, 1)`) gives every mmvq kernel 10-40 more
/// registers and fewer resident blocks, a trade to time on a GPU first.
const SPILLS_ALLOWED: &[(&str, &str, u32)] = &[("mmvq_experts_q5_1", "sm_90", 8)];

/// Registers and spill-store bytes per entry function, from `ptxas -v`.
fn parse_report(log: &str) -> BTreeMap<String, (u32, u32)> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let head = &line[..line.find(what)?];
        head.split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.insert(name.clone(), (0, 0));
            current = Some(name);
        } else if let Some(e) = current.as_ref().and_then(|n| out.get_mut(n)) {
            if let Some(s) = number_before(line, " bytes spill stores") {
                e.1 = s;
            } else if let Some(r) = number_before(line, " registers") {
                e.0 = r;
            }
        }
    }
    out
}

/// For Ampere (sm_80, sm_86), Ada (sm_89) and Hopper (sm_90): the cubin a
/// GPU of each loads, with the kernels' declarations from `launch.rs`
/// checked against their definitions (a mismatch fails to compile), and
/// ptxas's registers per kernel printed and its spills checked. Two
/// architectures at a time, each ~20 s on one core.
#[test]
fn kernels_compile_for_every_architecture_without_spills() {
    if !nvrtc_present() {
        return;
    }
    let archs = [(8, 0), (8, 6), (8, 9), (9, 0)];
    let mut reports = Vec::new();
    for pair in archs.chunks(2) {
        std::thread::scope(|s| {
            let handles: Vec<_> = pair
                .iter()
                .map(|&a| s.spawn(move || (a, ferrum_kernels::cuda::ptxas_report(a))))
                .collect();
            for h in handles {
                let (a, r) = h.join().expect("compile thread");
                let log = r.unwrap_or_else(|e| panic!("the kernels do not compile for {a:?}: {e}"));
                reports.push((format!("sm_{}{}", a.0, a.1), parse_report(&log)));
            }
        });
    }
    let kernels = &reports[0].1;
    for k in ["rms_norm", "attention", "mmvq1_q4_k", "mmvq_experts_q6_k"] {
        assert!(kernels.contains_key(k), "{k} missing from ptxas's report");
    }
    eprintln!("registers per kernel:");
    eprint!("{:<24}", "kernel");
    reports.iter().for_each(|(a, _)| eprint!("{a:>7}"));
    eprintln!();
    for name in kernels.keys() {
        eprint!("{name:<24}");
        for (_, r) in &reports {
            eprint!("{:>7}", r.get(name).map_or(0, |e| e.0));
        }
        eprintln!();
    }
    let mut wrong = Vec::new();
    for (arch, report) in &reports {
        assert_eq!(report.len(), kernels.len(), "{arch}: another kernel set");
        for (name, &(_, spill)) in report {
            let allowed = SPILLS_ALLOWED
                .iter()
                .find(|e| e.0 == name && e.1 == arch)
                .map_or(0, |e| e.2);
            if spill > allowed {
                wrong.push(format!("{name} on {arch} spills {spill} bytes"));
            }
        }
    }
    for &(name, arch, bytes) in SPILLS_ALLOWED {
        let spill = reports
            .iter()
            .find(|r| r.0 == arch)
            .and_then(|r| r.1.get(name))
            .map_or(0, |e| e.1);
        if spill < bytes {
            wrong.push(format!(
                "{name} on {arch} now spills {spill} bytes: lower SPILLS_ALLOWED"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The signature check works: NVRTC refuses a kernel whose declaration
/// differs from its definition (here two scalars swapped), and the source
/// it compiles declares every kernel.
#[test]
fn a_declaration_unlike_its_kernel_does_not_compile() {
    if !nvrtc_present() {
        return;
    }
    let source = ferrum_kernels::cuda::kernel_source();
    let decl = "extern \"C\" __global__ void rms_norm(const float * x, const float * w, \
                float * out, float eps, int dim);";
    assert!(source.contains(decl), "rms_norm is not declared");
    assert!(source.contains("void mmvq1_experts_q6_k(const unsigned long long * tiles"));
    let def = "extern \"C\" __global__ void rms_norm(const float* x, const float* w, float* out, \
               float eps, int dim) {}\n";
    let compiles = |src: String| cudarc::nvrtc::compile_ptx(src).is_ok();
    assert!(compiles(format!("{def}{decl}")));
    assert!(!compiles(format!(
        "{def}{}",
        decl.replace("float eps, int dim", "int dim, float eps")
    )));
    assert!(!compiles(format!(
        "{def}{}",
        decl.replace("const float * w", "float * w")
    )));
}
