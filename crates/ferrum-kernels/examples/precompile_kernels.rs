//! Compiles the CUDA kernels into the kernel cache without a GPU (NVRTC
//! alone), for `scripts/gpu-check.sh prep`: the GPU machine then loads them
//! without compiling, each tuning variant included.
//!
//!     FERRUM_KERNEL_CACHE=.gpu/kernels cargo run --features cuda \
//!         --example precompile_kernels -- 90 "" "cols=1"

#[cfg(feature = "cuda")]
fn main() {
    let mut args = std::env::args().skip(1);
    let arch = args.next().unwrap_or_else(|| "90".into());
    let Ok(cc) = arch.parse::<i32>() else {
        eprintln!("usage: precompile_kernels SM [TUNE...] (SM such as 90 for sm_90)");
        std::process::exit(2);
    };
    let tunes: Vec<String> = args.collect();
    let tunes = if tunes.is_empty() {
        vec![String::new()]
    } else {
        tunes
    };
    for tune in tunes {
        match ferrum_kernels::cuda::precompile((cc / 10, cc % 10), &tune) {
            Ok(path) => println!("{tune:?}: {}", path.display()),
            Err(e) => {
                eprintln!("{tune:?}: {e}");
                std::process::exit(1);
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("build with --features cuda");
    std::process::exit(2);
}
