//! Kernel dispatch: the SIMD body when the CPU has it (checked at run time), else the
//! portable scalar reference. Callers pass validated slices.

use half::bf16;

use crate::QuantSpec;

pub mod gemm;
pub mod scalar;
#[cfg(target_arch = "x86_64")]
pub mod x86_64;

/// Whether the AVX2 + FMA kernels run: the CPU has them and `DG_QUANT_FORCE_SCALAR` is not
/// set (a debugging and testing switch: `DG_QUANT_FORCE_SCALAR=1 cargo test -p dg-quant`
/// runs every test on the portable kernels).
#[inline]
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static SIMD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *SIMD.get_or_init(|| {
            x86_64::available() && std::env::var_os("DG_QUANT_FORCE_SCALAR").is_none()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One dequantized row (bit-identical on every path).
#[inline]
pub fn dequant_row(
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(spec.bits, 2 | 4 | 8) && has_avx2_fma() {
        return x86_64::dequant_row(words, scales, biases, spec.bits, spec.group_size, out);
    }
    scalar::dequant_row(words, scales, biases, spec, out)
}

/// Whether the fused dot products of this width run in SIMD.
fn simd_dot(spec: QuantSpec) -> bool {
    cfg!(target_arch = "x86_64") && matches!(spec.bits, 4 | 8) && has_avx2_fma()
}

/// One activation row in the form the fused dot-product kernels consume: its group sums and
/// its elements in the kernel's order (built once, reused for every weight row).
pub struct PreparedX {
    x: Vec<f32>,
    sums: Vec<f32>,
}

/// Prepares `x` (one row of `W.cols` elements) for `dot_rows` with weights of `spec`.
pub fn prepare_x(x: &[f32], spec: QuantSpec) -> PreparedX {
    let mut sums = vec![0.0f32; x.len() / spec.group_size];
    scalar::group_sums(x, spec.group_size, &mut sums);
    #[cfg(target_arch = "x86_64")]
    if spec.bits == 4 && simd_dot(spec) {
        let mut xp = vec![0.0f32; x.len()];
        x86_64::permute_x_4bit(x, &mut xp);
        return PreparedX { x: xp, sums };
    }
    PreparedX {
        x: x.to_vec(),
        sums,
    }
}

/// Fused dot products of a prepared `x` with consecutive rows of a quantized matrix:
/// `out[i] = x . W[i]`; `words`, `scales`, `biases` hold `out.len()` rows.
pub fn dot_rows(
    x: &PreparedX,
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd_dot(spec) {
        return x86_64::dot_rows(
            &x.x,
            &x.sums,
            words,
            scales,
            biases,
            spec.bits,
            spec.group_size,
            out,
        );
    }
    let cols = x.x.len();
    let wpr = spec.words_per_row(cols);
    let gpr = cols / spec.group_size;
    for (i, o) in out.iter_mut().enumerate() {
        *o = scalar::dot_row(
            &x.x,
            &x.sums,
            &words[i * wpr..(i + 1) * wpr],
            &scales[i * gpr..(i + 1) * gpr],
            &biases[i * gpr..(i + 1) * gpr],
            spec,
        );
    }
}

/// `dot_rows` for two activation rows sharing each decoded weight row.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows2(
    xa: &PreparedX,
    xb: &PreparedX,
    words: &[u32],
    scales: &[bf16],
    biases: &[bf16],
    spec: QuantSpec,
    out_a: &mut [f32],
    out_b: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd_dot(spec) {
        return x86_64::dot_rows2(
            (&xa.x, &xa.sums),
            (&xb.x, &xb.sums),
            words,
            scales,
            biases,
            spec.bits,
            spec.group_size,
            out_a,
            out_b,
        );
    }
    dot_rows(xa, words, scales, biases, spec, out_a);
    dot_rows(xb, words, scales, biases, spec, out_b);
}

/// See `scalar::tiles` (bit-identical on every path).
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tiles(
    kc: usize,
    xt: &[f32],
    ldx: usize,
    m8: usize,
    w: &[f32],
    ldw: usize,
    nr: usize,
    ct: &mut [f32],
    ldc: usize,
    load: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::tiles(kc, xt, ldx, m8, w, ldw, nr, ct, ldc, load);
    }
    scalar::tiles(kc, xt, ldx, m8, w, ldw, nr, ct, ldc, load)
}

/// See `scalar::tiles_n` (bit-identical on every path; `ncols` a multiple of 16).
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn tiles_n(
    kc: usize,
    x: &[f32],
    ldx: usize,
    m: usize,
    w: &[f32],
    ldw: usize,
    ncols: usize,
    p: &mut [f32],
    ldp: usize,
    load: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::tiles_n(kc, x, ldx, m, w, ldw, ncols, p, ldp, load);
    }
    scalar::tiles_n(kc, x, ldx, m, w, ldw, ncols, p, ldp, load)
}

/// `out[j] = fma(a, v[j], out[j])` (bit-identical on every path).
#[inline]
pub fn axpy(a: f32, v: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        return x86_64::axpy(a, v, out);
    }
    scalar::axpy(a, v, out)
}

/// Prefetch hint for data needed soon (no-op off x86-64).
#[inline]
pub fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    x86_64::prefetch(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}
