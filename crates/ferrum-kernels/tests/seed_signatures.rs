//! The seed's signatures for the methods that moved out of `Backend` into
//! `SeedOps` (`src/seed_ops.rs`): each is coerced to a function pointer of
//! the seed's exact type, so a change to a signature fails to compile here.
//! The methods' behaviour is tested in `cpu_ops.rs` (GPTQ against a plain
//! dequantization, the append against a reference, latent attention's
//! documented refusal) and, on a GPU, `cuda_ops.rs`.

use ferrum_kernels::{AttnConfig, Backend, CpuBackend, SeedOps};
use ferrum_types::Result;

type Ctx<B> = <B as Backend>::Context;
type Buf<B> = <B as Backend>::Buffer;
type Store<B> = <B as SeedOps>::GptqStore;

#[allow(clippy::type_complexity)]
fn seed_signatures<B: SeedOps>() -> usize {
    let load_gptq: fn(
        &[i32],
        &[f32],
        &[i32],
        Option<&[i32]>,
        u32,
        usize,
        usize,
        usize,
    ) -> Result<Store<B>> = B::load_gptq;
    let gemm_gptq: fn(&mut Ctx<B>, &Buf<B>, &Store<B>, &mut Buf<B>, usize) -> Result<()> =
        B::gemm_gptq;
    let mla_attention: fn(
        &mut Ctx<B>,
        &Buf<B>,
        &Buf<B>,
        &Buf<B>,
        &mut Buf<B>,
        usize,
        usize,
        usize,
        usize,
        &AttnConfig,
        usize,
        usize,
    ) -> Result<()> = B::mla_attention;
    let append: fn(
        &mut Ctx<B>,
        &mut Buf<B>,
        &mut Buf<B>,
        usize,
        usize,
        &Buf<B>,
        &Buf<B>,
        usize,
        usize,
        usize,
    ) = B::kv_cache_append_head_major;
    [
        load_gptq as usize,
        gemm_gptq as usize,
        mla_attention as usize,
        append as usize,
    ]
    .iter()
    .filter(|&&p| p != 0)
    .count()
}

#[test]
fn seed_methods_keep_the_seeds_signatures() {
    assert_eq!(seed_signatures::<CpuBackend>(), 4);
}
