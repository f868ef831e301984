//! Every CUDA kernel, declared once: its name and C parameters. From that
//! one table come the load list (`names`), a typed launch function per
//! kernel (`launch::rms_norm(ctx, cfg, x, w, out, eps, dim)`), and the C
//! declarations that NVRTC compiles after the kernels' definitions
//! ([`declarations`]): a Rust side that disagrees with a `.cu` signature
//! (a parameter added, reordered, or made `const`) fails every compile,
//! CI's included, instead of reading garbage on a GPU.
//!
//! Kernels written once per GGUF block format (`mmvq1_##T` in the source)
//! are families: their launch functions take the [`GgufQuantType`], and
//! the load list holds one kernel per family and type.
//!
//! A pointer parameter takes any device slice or view of any element type:
//! the `Backend` buffer is f32 words, and GGUF blocks, u32 orders and q8_1
//! activations travel in it as raw bits. What the table types is the
//! kernel's arity, which arguments are pointers, which of those it writes,
//! and the scalars' C types.

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg, SyncOnDrop,
};

use super::{device, CudaContext};
use crate::{Dtype, GgufQuantType};

/// A device pointer a kernel reads (a `const T*` parameter).
pub(super) trait Ptr {
    /// The raw pointer; `stream` waits for earlier writes, and the guard
    /// records this use when dropped after the launch.
    fn raw<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>);

    /// What the memory holds, where it says (a `Backend` buffer); `None`
    /// for the backend's own scratch and metadata.
    fn held(&self) -> Option<Dtype> {
        None
    }
}

/// A device pointer a kernel writes (a `T*` parameter).
pub(super) trait PtrMut: Ptr {
    fn raw_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>);
}

/// Whether a buffer holding `held` may be passed for a pointer of C type
/// `c` (as the table writes it: `const float *`, `u8 *`, ...): floats are
/// f32 values (the CUDA KV pools included), bytes are GGUF blocks (or
/// words the caller packed them into: the seed's route), `u32`/`unsigned`
/// are u32 values. Other pointer types are scratch the backend makes
/// itself, which carries no tag.
pub(super) fn accepts(c: &str, held: Dtype) -> bool {
    let pointee = c.trim_start_matches("const ").trim_end_matches('*').trim();
    match pointee {
        "float" => held == Dtype::F32,
        "u8" => matches!(held, Dtype::Blocks(_) | Dtype::F32),
        "u32" | "unsigned" => held == Dtype::U32,
        _ => held == Dtype::F32,
    }
}

/// A launch's argument whose tag its parameter's C type does not accept,
/// as an error message; checked for every pointer before a launch.
macro_rules! check_arg {
    ($ctx:ident, $kernel:expr, $a:ident, $($c:ident)+ *) => {
        if let Some(held) = Ptr::held(&*$a) {
            let c = stringify!($($c)+ *);
            if !accepts(c, held) {
                $ctx.fail(format!(
                    "CUDA {}: parameter `{}` ({c}) was given {}",
                    $kernel,
                    stringify!($a),
                    held.describe()
                ));
                return;
            }
        }
    };
    ($ctx:ident, $kernel:expr, $a:ident, $($c:ident)+) => {};
}

impl<T> Ptr for CudaSlice<T> {
    fn raw<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr(stream)
    }
}

impl<T> Ptr for CudaView<'_, T> {
    fn raw<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr(stream)
    }
}

impl<T> Ptr for CudaViewMut<'_, T> {
    fn raw<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr(stream)
    }
}

impl<T> PtrMut for CudaSlice<T> {
    fn raw_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr_mut(stream)
    }
}

impl<T> PtrMut for CudaViewMut<'_, T> {
    fn raw_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.device_ptr_mut(stream)
    }
}

/// The Rust type of a parameter with C type `$c`.
macro_rules! rust_type {
    (const $($c:ident)+ *) => { &impl Ptr };
    ($($c:ident)+ *) => { &mut impl PtrMut };
    (int) => { i32 };
    (float) => { f32 };
}

/// Pushes argument `$a` (C type `$c`) onto launch `$b`, keeping a pointer's
/// guard alive until the function returns.
macro_rules! push_arg {
    ($b:ident, $s:ident, $a:ident, const $($c:ident)+ *) => {
        let $a = $a.raw($s);
        $b.arg(&$a.0);
    };
    ($b:ident, $s:ident, $a:ident, $($c:ident)+ *) => {
        let $a = $a.raw_mut($s);
        $b.arg(&$a.0);
    };
    ($b:ident, $s:ident, $a:ident, $($c:ident)+) => {
        $b.arg(&$a);
    };
}

/// The table: kernels with one definition, then the families written once
/// per block format. Generates the launch functions, [`names`] and
/// [`declarations`].
macro_rules! kernels {
    (
        fixed { $( $name:ident ( $( $arg:ident : [$($c:tt)+] ),* ); )* }
        per_quant { $( $fam:ident ( $( $farg:ident : [$($fc:tt)+] ),* ); )* }
    ) => {
        #[allow(non_camel_case_types)]
        enum Fixed { $($name),* }
        const FIXED: &[(&str, &[&str])] = &[
            $( (stringify!($name), &[ $( concat!(stringify!($($c)+), " ", stringify!($arg)) ),* ]) ),*
        ];

        #[allow(non_camel_case_types)]
        enum Family { $($fam),* }
        const FAMILIES: &[(&str, &[&str])] = &[
            $( (stringify!($fam), &[ $( concat!(stringify!($($fc)+), " ", stringify!($farg)) ),* ]) ),*
        ];

        $(
            #[allow(clippy::too_many_arguments)]
            pub(super) fn $name(ctx: &mut CudaContext, cfg: LaunchConfig, $( $arg: rust_type!($($c)+) ),*) {
                if ctx.error.is_some() {
                    return;
                }
                $( check_arg!(ctx, stringify!($name), $arg, $($c)+); )*
                let stream = ctx.stream.clone();
                let s: &CudaStream = &stream;
                let mut b = s.launch_builder(&device::get().funcs[Fixed::$name as usize]);
                $( push_arg!(b, s, $arg, $($c)+); )*
                // SAFETY: the arguments match the kernel's C signature (the
                // declarations NVRTC checks), and callers pass buffers that
                // cover what the kernel touches (the Backend's shapes).
                let r = unsafe { b.launch(cfg) };
                ctx.check(r, stringify!($name));
            }
        )*

        $(
            #[allow(clippy::too_many_arguments)]
            pub(super) fn $fam(
                ctx: &mut CudaContext,
                t: GgufQuantType,
                cfg: LaunchConfig,
                $( $farg: rust_type!($($fc)+) ),*
            ) {
                if ctx.error.is_some() {
                    return;
                }
                $( check_arg!(ctx, format!("{}_{}", stringify!($fam), t.name()), $farg, $($fc)+); )*
                let stream = ctx.stream.clone();
                let s: &CudaStream = &stream;
                let f = &device::get().funcs[family_index(Family::$fam as usize, t)];
                let mut b = s.launch_builder(f);
                $( push_arg!(b, s, $farg, $($fc)+); )*
                // SAFETY: as for the fixed kernels above.
                let r = unsafe { b.launch(cfg) };
                if let Err(e) = r {
                    ctx.fail(format!("CUDA {}_{} failed: {e:?}", stringify!($fam), t.name()));
                }
            }
        )*
    };
}

kernels! {
    fixed {
        rms_norm(x: [const float *], w: [const float *], out: [float *], eps: [float], dim: [int]);
        fused_add_rms_norm(
            res: [float *], x: [const float *], w: [const float *], out: [float *], eps: [float],
            dim: [int]
        );
        layer_norm(
            x: [const float *], g: [const float *], b: [const float *], out: [float *], eps: [float],
            dim: [int]
        );
        add_inplace(r: [float *], x: [const float *], n: [int]);
        scale_add_rows(
            src: [const float *], rows: [const unsigned *], w: [const float *], dst: [float *],
            n: [int], dim: [int]
        );
        gather_add_rows(
            src: [const float *], rows: [const unsigned *], w: [const float *], dst: [float *],
            tokens: [int], per: [int], dim: [int]
        );
        add_bias(d: [float *], b: [const float *], rows: [int], cols: [int]);
        gelu_erf(x: [const float *], out: [float *], n: [int]);
        silu_mul(gu: [const float *], out: [float *], tokens: [int], im: [int]);
        gelu_tanh_mul(gu: [const float *], out: [float *], tokens: [int], im: [int]);
        split_qkv(
            qkv: [const float *], q: [float *], k: [float *], v: [float *], tokens: [int],
            qd: [int], kvd: [int]
        );
        embedding(table: [const float *], ids: [const u32 *], out: [float *], tokens: [int], dim: [int]);
        gather_columns(x: [const float *], order: [const u32 *], out: [float *], m: [int], k: [int]);
        head_to_token(src: [const float *], dst: [float *], tokens: [int], heads: [int], dim: [int]);
        kv_append(
            ck: [float *], cv: [float *], nk: [const float *], nv: [const float *],
            cache_len: [int], cap: [int], nt: [int], nkv: [int], hd: [int]
        );
        qk_norm_rope(
            input: [const float *], nw: [const float *], cs: [const float *], sn: [const float *],
            out: [float *], tokens: [int], heads: [int], hd: [int], pos_offset: [int], eps: [float],
            mode: [int]
        );
        paged_kv_append(
            kp: [float *], vp: [float *], nk: [const float *], nv: [const float *],
            segs: [const int *], tables: [const u32 *], nt: [int], nkv: [int], hd: [int], bs: [int]
        );
        rows_qkv(
            q: [const float *], k: [const float *], v: [const float *], qn: [const float *],
            kn: [const float *], cs: [const float *], sn: [const float *], q_out: [float *],
            kp: [float *], vp: [float *], segs: [const int *], tables: [const u32 *], nh: [int],
            nkv: [int], hd: [int], bs: [int], eps: [float], mode: [int]
        );
        attention(
            q: [const float *], kp: [const float *], vp: [const float *], out: [float *],
            part: [float *], segs: [const int *], tables: [const u32 *], qblocks: [int], nh: [int],
            nkv: [int], hd: [int], bs: [int], causal: [int], scale: [float], window: [int],
            tile: [int], softcap: [float]
        );
        attention_combine(
            part: [const float *], out: [float *], segs: [const int *], nh: [int], splits: [int],
            hd: [int]
        );
        quantize_q8_1(x: [const float *], xq: [signed char *], xd: [float2 *], blocks: [int]);
        to_bf16(x: [const float *], out: [u16 *], n: [int]);
    }
    per_quant {
        dequant(w: [const u8 *], out: [float *], n: [int], k: [int]);
        dequant_bf16(w: [const u8 *], out: [u16 *], n: [int], k: [int]);
        gemv(w: [const u8 *], x: [const float *], out: [float *], m: [int], n: [int], k: [int]);
        gemv_experts(
            tiles: [const unsigned long long *], x: [const float *], out: [float *], n: [int],
            k: [int]
        );
        mmvq(
            w: [const u8 *], xq: [const int *], xd: [const float2 *], out: [float *], m: [int],
            n: [int], k: [int]
        );
        mmvq1(
            w: [const u8 *], xq: [const int *], xd: [const float2 *], out: [float *], m: [int],
            n: [int], k: [int]
        );
        mmvq_experts(
            tiles: [const unsigned long long *], xq: [const int *], xd: [const float2 *],
            out: [float *], n: [int], k: [int]
        );
        mmvq1_experts(
            tiles: [const unsigned long long *], xq: [const int *], xd: [const float2 *],
            out: [float *], n: [int], k: [int]
        );
    }
}

/// Where family `fam`'s kernel for `t` sits in the load list.
fn family_index(fam: usize, t: GgufQuantType) -> usize {
    let types = GgufQuantType::all().count();
    let pos = GgufQuantType::all().position(|q| q == t).unwrap_or(0);
    FIXED.len() + fam * types + pos
}

/// Every kernel's name and C parameter list, in load-list order.
fn kernels() -> impl Iterator<Item = (String, &'static [&'static str])> {
    let fixed = FIXED.iter().map(|&(n, p)| (n.to_string(), p));
    let families = FAMILIES
        .iter()
        .flat_map(|&(f, p)| GgufQuantType::all().map(move |t| (format!("{f}_{}", t.name()), p)));
    fixed.chain(families)
}

/// The kernels to load, in the order the launch functions index them.
pub(super) fn names() -> impl Iterator<Item = String> {
    kernels().map(|(n, _)| n)
}

/// A C declaration of every kernel as the table types it. Compiled after
/// the definitions, a declaration that differs from its definition is an
/// error ("more than one instance of overloaded function has C linkage").
pub(super) fn declarations() -> String {
    kernels()
        .map(|(n, p)| format!("extern \"C\" __global__ void {n}({});\n", p.join(", ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::accepts;
    use crate::Dtype;
    use ferrum_types::GgmlType;

    #[test]
    fn pointer_types_take_only_what_they_read() {
        let blocks = Dtype::Blocks(GgmlType::Q4_K);
        for (c, held, ok) in [
            ("const float *", Dtype::F32, true),
            ("float *", Dtype::F32, true),
            ("const float *", blocks, false),
            ("float *", Dtype::U32, false),
            ("const float *", Dtype::F16, false),
            ("const u8 *", blocks, true),
            ("const u8 *", Dtype::F32, true),
            ("const u8 *", Dtype::U32, false),
            ("const u32 *", Dtype::U32, true),
            ("const u32 *", Dtype::F32, false),
            ("const unsigned *", Dtype::U32, true),
            ("u16 *", Dtype::F32, true),
            ("u16 *", blocks, false),
        ] {
            assert_eq!(accepts(c, held), ok, "{c} given {held:?}");
        }
    }

    /// Every pointer type the table uses is one `accepts` decides on
    /// purpose: a new one must be added there, not fall to the default.
    #[test]
    fn the_table_uses_known_pointer_types() {
        let known = [
            "float",
            "u8",
            "u32",
            "unsigned",
            "u16",
            "int",
            "signed char",
            "float2",
            "unsigned long long",
        ];
        for (name, params) in super::kernels() {
            for p in params.iter().filter(|p| p.contains('*')) {
                let c = p.rsplit_once('*').map_or("", |(c, _)| c);
                let pointee = c.trim_start_matches("const ").trim();
                assert!(known.contains(&pointee), "{name}: {p}");
            }
        }
    }
}
