#![cfg(feature = "cuda")]
//! NVRTC needs no GPU: compile kernels.cu exactly as device.rs does.
#[test]
fn kernels_compile_with_nvrtc() {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        eprintln!("skipped: libnvrtc not found");
        return;
    }
    let opts = cudarc::nvrtc::CompileOptions {
        arch: Some("compute_90"),
        options: vec!["--std=c++17".into()],
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(include_str!("../src/cuda/kernels.cu"), opts)
        .unwrap_or_else(|e| panic!("kernels.cu does not compile: {e:?}"));
    let src = ptx.to_src();
    for k in [
        "rms_norm",
        "attention",
        "attention_combine",
        "gemv_q4_k",
        "dequant_q6_k",
        "scale_add_rows",
    ] {
        assert!(src.contains(&format!(".entry {k}(")), "{k} missing");
    }
    eprintln!("ptx {} bytes", src.len());
}
