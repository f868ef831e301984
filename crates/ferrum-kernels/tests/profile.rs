//! `cpu::profile` counts what runs, per op, only while it is enabled. A
//! test binary of its own: the counters are process-wide, and other tests
//! running ops beside it would be counted too.

#![allow(clippy::unwrap_used)] // tests may unwrap: a failure is the report

use std::time::Duration;

use ferrum_kernels::cpu::{on_pool, profile};
use ferrum_kernels::{Backend, CpuBackend, Gemm, Mat};

type B = CpuBackend;

/// Four float GEMMs and a norm on a two-thread pool.
fn run_ops() {
    let (m, n, k) = (64, 512, 512);
    let a = B::from_slice(&vec![0.5; m * k]);
    let w = B::from_slice(&vec![0.25; n * k]);
    let mut out = B::alloc(m * n);
    let ctx = &mut B::new_context();
    for _ in 0..4 {
        B::gemm(ctx, &a, &w, &mut out, Gemm { m, n, k });
    }
    let mut normed = B::alloc(m * n);
    let ones = B::from_slice(&vec![1.0; n]);
    B::rms_norm(
        ctx,
        &out,
        &ones,
        1e-6,
        &mut normed,
        Mat { rows: m, cols: n },
    );
    // Every output is 512 · 0.5 · 0.25; normed, each is 1.
    assert_eq!(B::to_vec(&out, 1), [64.0]);
    assert!((B::to_vec(&normed, 1)[0] - 1.0).abs() < 1e-6);
}

#[test]
fn profiles_count_each_op_while_enabled() {
    on_pool(Some(2), || {
        run_ops();
        assert_eq!(
            profile::take(),
            profile::Profile::default(),
            "off by default"
        );

        profile::set_enabled(true);
        run_ops();
        profile::set_enabled(false);
        let p = profile::take();
        let calls: Vec<_> = p.ops.iter().map(|o| (o.0, o.2)).collect();
        assert_eq!(calls, [("float GEMM", 4), ("norms", 1)]);
        assert!(p.ops.iter().all(|o| o.1 > Duration::ZERO));

        run_ops();
        assert_eq!(profile::take(), profile::Profile::default(), "off again");
    })
    .unwrap();
}
