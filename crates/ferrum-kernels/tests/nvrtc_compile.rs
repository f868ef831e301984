#![cfg(feature = "cuda")]
//! NVRTC needs no GPU: compile kernels.cu exactly as device.rs does.
/// For Ampere (sm_80, sm_86), Ada (sm_89) and Hopper (sm_90): the PTX a
/// driver of each would load. Two at a time, each ~10 s on one core.
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

#[test]
fn kernels_compile_with_nvrtc() {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found");
        return;
    }
    let compile = |arch: &'static str| {
        let opts = cudarc::nvrtc::CompileOptions {
            arch: Some(arch),
            options: vec!["--std=c++17".into()],
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(ferrum_kernels::cuda::kernel_source(), opts)
            .unwrap_or_else(|e| panic!("the kernels do not compile for {arch}: {e:?}"));
        let src = ptx.to_src();
        for k in [
            "rms_norm",
            "attention",
            "attention_combine",
            "rows_qkv",
            "quantize_q8_1",
            "mmvq1_q4_k",
            "mmvq_experts_q6_k",
            "dequant_bf16_q6_k",
            "scale_add_rows",
        ] {
            assert!(src.contains(&format!(".entry {k}(")), "{arch}: {k} missing");
        }
        eprintln!("{arch}: ptx {} bytes", src.len());
    };
    for pair in [["compute_80", "compute_86"], ["compute_89", "compute_90"]] {
        std::thread::scope(|s| {
            for arch in pair {
                s.spawn(move || compile(arch));
            }
        });
    }
}
