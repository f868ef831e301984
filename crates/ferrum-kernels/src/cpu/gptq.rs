//! GPTQ weights on the CPU: dequantized once at load into f32 rows and run
//! through the dense GEMM. CPU inference with GPTQ checkpoints is a
//! compatibility path; the f32 copy trades memory for reusing the fastest
//! kernel we have.

use ferrum_types::{FerrumError, Result};

/// A GPTQ weight dequantized to a dense `[n, k]` f32 matrix.
pub struct CpuGptqWeight {
    pub(crate) w: Vec<f32>,
    pub(crate) n: usize,
    pub(crate) k: usize,
}

impl CpuGptqWeight {
    /// Output features.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Input features.
    pub fn k(&self) -> usize {
        self.k
    }
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<()> {
    if cond {
        Ok(())
    } else {
        Err(FerrumError::invalid(format!("GPTQ weight: {}", what())))
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn load(
    qweight: &[i32],
    scales: &[f32],
    qzeros: &[i32],
    g_idx: Option<&[i32]>,
    bits: u32,
    group_size: usize,
    k: usize,
    n: usize,
) -> Result<CpuGptqWeight> {
    check(matches!(bits, 2 | 4 | 8), || {
        format!("{bits}-bit packing is not supported (2, 4 or 8)")
    })?;
    check(group_size > 0, || "group_size must be positive".into())?;
    let pack = (32 / bits) as usize;
    check(k.is_multiple_of(pack) && n.is_multiple_of(pack), || {
        format!("k = {k} and n = {n} must be multiples of {pack} for {bits}-bit packing")
    })?;
    check(n > 0 && scales.len().is_multiple_of(n), || {
        format!(
            "{} scales is not a whole number of rows of {n}",
            scales.len()
        )
    })?;
    let groups = scales.len() / n;
    check(qweight.len() == k / pack * n, || {
        format!(
            "qweight has {} words, expected {} for k = {k}, n = {n}",
            qweight.len(),
            k / pack * n
        )
    })?;
    check(qzeros.len() == groups * (n / pack), || {
        format!(
            "qzeros has {} words, expected {}",
            qzeros.len(),
            groups * (n / pack)
        )
    })?;
    if let Some(g) = g_idx {
        check(g.len() == k, || {
            format!("g_idx has {} entries, expected k = {k}", g.len())
        })?;
        check(g.iter().all(|&x| x >= 0 && (x as usize) < groups), || {
            format!("g_idx refers to a group outside 0..{groups}")
        })?;
    } else {
        check(k.div_ceil(group_size) <= groups, || {
            format!("{groups} scale groups cannot cover k = {k} with group_size {group_size}")
        })?;
    }

    let mask = (1u32 << bits) - 1;
    let mut w = vec![0f32; n * k];
    for kk in 0..k {
        let g = g_idx.map_or(kk / group_size, |g| g[kk] as usize);
        let shift = (kk % pack) as u32 * bits;
        for j in 0..n {
            let q = ((qweight[(kk / pack) * n + j] as u32) >> shift) & mask;
            let zshift = (j % pack) as u32 * bits;
            // v1 checkpoints store zero - 1.
            let z = (((qzeros[g * (n / pack) + j / pack] as u32) >> zshift) & mask) + 1;
            w[j * k + kk] = (q as f32 - z as f32) * scales[g * n + j];
        }
    }
    Ok(CpuGptqWeight { w, n, k })
}
