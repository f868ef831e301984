//! Criterion benchmarks of the CPU kernels, in `benches/`: dense and
//! quantized GEMM at LLM shapes (`gemm`), attention (`attention`) and the
//! CPU's multiply-add ceiling (`ceiling`). Run them with `cargo bench -p
//! ferrum-benches --bench NAME`. This library is empty: the benchmarks live
//! apart from the kernels so that the kernels' tests do not compile
//! criterion.
