//! Pillow's BICUBIC resampling of 8-bit RGB images, bit for bit (`src/libImaging/Resample.c`:
//! `precompute_coeffs`, `normalize_coeffs_8bpc`, `ImagingResampleHorizontal_8bpc` /
//! `Vertical_8bpc`, `ImagingResampleInner`). The reference resizes with
//! `Image.resize((w, h), resample=Image.BICUBIC)` on an RGB image.
//!
//! Pillow computes the filter weights in f64, rounds them to 22-bit fixed point, then runs two
//! integer passes with rounding and clipping to u8 after each, horizontal first unless the
//! height shrinks much more than the width (Pillow 13.0's rule, [`vertical_first`]).
//! Reproducing those steps, not "a bicubic", is what makes the pixels identical. Checked
//! against Pillow 13.0.0 (the reference venv's); Pillow 12 and older always go horizontal
//! first.

use rayon::prelude::*;

/// Fixed-point precision of the 8-bit kernels: `32 - 8 - 2`.
const PRECISION_BITS: u32 = 22;

/// The Keys cubic with a = -0.5, support 2 (`bicubic_filter`).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per output pixel: the first input index, the tap count, and the fixed-point weights.
struct Coeffs {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

/// `precompute_coeffs` + `normalize_coeffs_8bpc` for the box `[0, in_size)`.
fn coeffs(in_size: usize, out_size: usize) -> Coeffs {
    const SUPPORT: f64 = 2.0;
    // `(double)(in1 - in0) / outSize` with the box edges as C floats (exact for sizes < 2^24).
    let scale = (in_size as f32 - 0.0f32) as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let inv_filterscale = 1.0 / filterscale;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = 0.0 + (xx as f64 + 0.5) * scale;
        // C `(int)` truncates toward zero; negatives clamp to 0 right after.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let taps = xmax.saturating_sub(xmin).min(ksize);
        let mut ww = 0.0f64;
        for (x, kx) in k.iter_mut().enumerate().take(taps) {
            let w = bicubic(((x + xmin) as f64 - center + 0.5) * inv_filterscale);
            *kx = w;
            ww += w;
        }
        let row = &mut weights[xx * ksize..(xx + 1) * ksize];
        for (x, out) in row.iter_mut().enumerate().take(taps) {
            let v = if ww != 0.0 { k[x] / ww } else { k[x] };
            let scaled = v * f64::from(1u32 << PRECISION_BITS);
            *out = if v < 0.0 {
                (-0.5 + scaled) as i32
            } else {
                (0.5 + scaled) as i32
            };
        }
        bounds.push((xmin, taps));
    }
    Coeffs {
        ksize,
        bounds,
        weights,
    }
}

/// `clip8`: the accumulator (with its 0.5 rounding bias) shifted down and clamped to u8.
#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Horizontal pass over `rows` rows of width `in_w`.
fn horizontal(src: &[u8], in_w: usize, rows: usize, out_w: usize) -> Vec<u8> {
    let c = coeffs(in_w, out_w);
    let mut out = vec![0u8; rows * out_w * 3];
    out.par_chunks_mut(out_w * 3)
        .zip(src.par_chunks(in_w * 3))
        .for_each(|(line_out, line_in)| {
            for (xx, px) in line_out.chunks_exact_mut(3).enumerate() {
                let (xmin, taps) = c.bounds[xx];
                let k = &c.weights[xx * c.ksize..xx * c.ksize + taps];
                let (mut s0, mut s1, mut s2) = (HALF, HALF, HALF);
                for (x, &w) in k.iter().enumerate() {
                    let p = &line_in[(x + xmin) * 3..(x + xmin) * 3 + 3];
                    s0 += i32::from(p[0]) * w;
                    s1 += i32::from(p[1]) * w;
                    s2 += i32::from(p[2]) * w;
                }
                px[0] = clip8(s0);
                px[1] = clip8(s1);
                px[2] = clip8(s2);
            }
        });
    out
}

/// Vertical pass over `width` columns of height `in_h`.
fn vertical(src: &[u8], width: usize, in_h: usize, out_h: usize) -> Vec<u8> {
    let c = coeffs(in_h, out_h);
    let stride = width * 3;
    let mut out = vec![0u8; out_h * stride];
    out.par_chunks_mut(stride)
        .enumerate()
        .for_each(|(yy, line_out)| {
            let (ymin, taps) = c.bounds[yy];
            let k = &c.weights[yy * c.ksize..yy * c.ksize + taps];
            for (i, o) in line_out.iter_mut().enumerate() {
                let mut s = HALF;
                for (y, &w) in k.iter().enumerate() {
                    s += i32::from(src[(y + ymin) * stride + i]) * w;
                }
                *o = clip8(s);
            }
        });
    out
}

/// Whether Pillow runs the vertical pass first: since Pillow 13.0 (`ImagingResampleInner`),
/// when the height shrinks by more than twice as many pixels as the width does. The two orders
/// round differently, so this matters for bit-identical output.
fn vertical_first(in_h: usize, in_w: usize, out_h: usize, out_w: usize) -> bool {
    let dy = in_h as i64 - out_h as i64;
    let dx = in_w as i64 - out_w as i64;
    dy > 0 && dy > dx * 2
}

/// Resizes a packed RGB8 image (`in_h x in_w x 3`, row-major) to `out_h x out_w` exactly as
/// Pillow 13's `Image.resize(..., BICUBIC)` does. Sizes must be positive (checked by callers).
pub(crate) fn resize_bicubic_rgb8(
    src: &[u8],
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
) -> Vec<u8> {
    debug_assert_eq!(src.len(), in_h * in_w * 3);
    if in_h == out_h && in_w == out_w {
        // Image.resize returns a copy for an identical size.
        return src.to_vec();
    }
    let h_pass = |img: &[u8], rows: usize| horizontal(img, in_w, rows, out_w);
    let v_pass = |img: &[u8], width: usize| vertical(img, width, in_h, out_h);
    // Pillow's horizontal-first pass covers only the rows the vertical pass reads; computing
    // all rows gives the same values for those rows.
    match (out_w != in_w, out_h != in_h) {
        (true, true) if vertical_first(in_h, in_w, out_h, out_w) => {
            h_pass(&v_pass(src, in_w), out_h)
        }
        (true, true) => v_pass(&h_pass(src, in_h), out_w),
        (true, false) => h_pass(src, in_h),
        (false, true) => v_pass(src, in_w),
        (false, false) => src.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(7, 48), (50, 20), (1, 5), (640, 48)] {
            let c = coeffs(i, o);
            for xx in 0..o {
                let (_, taps) = c.bounds[xx];
                let s: i64 = c.weights[xx * c.ksize..xx * c.ksize + taps]
                    .iter()
                    .map(|&w| i64::from(w))
                    .sum();
                assert!(
                    (s - (1 << PRECISION_BITS)).abs() <= taps as i64,
                    "{i}->{o} @{xx}: {s}"
                );
            }
        }
    }

    #[test]
    fn constant_image_stays_constant() {
        let src = vec![77u8; 5 * 9 * 3];
        let out = resize_bicubic_rgb8(&src, 5, 9, 48, 96);
        assert!(out.iter().all(|&v| v == 77));
    }

    #[test]
    fn pass_order_follows_pillow_13() {
        assert!(vertical_first(50, 37, 20, 30)); // 30 > 2 * 7
        assert!(!vertical_first(31, 64, 96, 48)); // height grows
        assert!(!vertical_first(1080, 1920, 576, 1056)); // 504 < 2 * 864
        assert!(!vertical_first(4032, 3024, 1104, 576)); // 2928 < 2 * 2448
        assert!(vertical_first(3000, 100, 480, 48)); // a tall strip
    }

    #[test]
    fn same_size_is_a_copy() {
        let src: Vec<u8> = (0..4 * 4 * 3).map(|v| v as u8).collect();
        assert_eq!(resize_bicubic_rgb8(&src, 4, 4, 4, 4), src);
    }
}
