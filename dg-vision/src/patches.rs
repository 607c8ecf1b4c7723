//! Patchify: the resized image cut into `patch x patch` tiles, each flattened `(dy, dx, c)`,
//! with the reference's exact value path (`VisionPatchEmbedder._patchify`):
//!
//! * the public path hands the tower `pixel_values.astype(bfloat16)`,
//! * `2 * (patches - 0.5)` is evaluated in bfloat16,
//! * the result is cast to `input_proj.weight.dtype` before the projection. With a plain
//!   (bf16 / f32) `input_proj` that is exact. With a **quantized** `input_proj` the weight is the
//!   packed uint32 array, so the patches are cast to **uint32** (as the reference does): values
//!   are truncated toward zero and wrapped, so -1.0 (a 0 pixel) becomes 4294967295, 1.0 (a 255
//!   pixel) becomes 1 and everything in between becomes 0. The quantized matmul then converts
//!   them to its float type: 4294967296.0, 1.0 and 0.0. The inline-4-bit tower really computes
//!   on that, so we do too.

use half::bf16;

use crate::preprocess::rescale;

/// `2 * (bf16(pixel) - 0.5)` in bfloat16, as f32: what a plain `input_proj` multiplies.
#[inline]
pub fn patch_value(level: u8) -> f32 {
    let x = bf16::from_f32(rescale(level));
    let centered = bf16::from_f32(x.to_f32() - 0.5);
    bf16::from_f32(2.0 * centered.to_f32()).to_f32()
}

/// MLX's float -> uint32 cast on x86-64: truncate toward zero to a 64-bit integer, keep the
/// low 32 bits (`-1.0 -> 4294967295`, `-2.0 -> 4294967294`, `0.99 -> 0`).
#[inline]
pub fn mlx_f32_to_u32(v: f32) -> u32 {
    v as i64 as u32
}

/// What a quantized `input_proj` multiplies: the patch value cast to uint32, then to f32.
#[inline]
pub fn patch_value_quantized(level: u8) -> f32 {
    mlx_f32_to_u32(patch_value(level)) as f32
}

/// The 256-entry lookup from u8 level to the projection input.
pub(crate) fn patch_value_table(quantized_input_proj: bool) -> [f32; 256] {
    let mut t = [0f32; 256];
    for (level, v) in t.iter_mut().enumerate() {
        *v = if quantized_input_proj {
            patch_value_quantized(level as u8)
        } else {
            patch_value(level as u8)
        };
    }
    t
}

/// Patches of a `height x width x 3` RGB image, `[n_patches, patch * patch * 3]`, patches in
/// row-major grid order, features `(dy * patch + dx) * 3 + c`, each mapped through `table`.
pub(crate) fn patchify(
    rgb: &[u8],
    height: usize,
    width: usize,
    patch: usize,
    table: &[f32; 256],
) -> Vec<f32> {
    let (ph, pw) = (height / patch, width / patch);
    let dim = patch * patch * 3;
    let mut out = vec![0f32; ph * pw * dim];
    for py in 0..ph {
        for px in 0..pw {
            let dst = &mut out[(py * pw + px) * dim..(py * pw + px + 1) * dim];
            for dy in 0..patch {
                let row = (py * patch + dy) * width + px * patch;
                let src = &rgb[row * 3..(row + patch) * 3];
                for (d, &s) in dst[dy * patch * 3..(dy + 1) * patch * 3]
                    .iter_mut()
                    .zip(src)
                {
                    *d = table[s as usize];
                }
            }
        }
    }
    out
}

/// `(x, y)` grid positions of the real patches in the same order (`np.meshgrid(..., "xy")`).
pub(crate) fn patch_positions(ph: usize, pw: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(ph * pw);
    for y in 0..ph {
        for x in 0..pw {
            v.push((x, y));
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturated_levels_under_the_uint32_cast() {
        assert_eq!(patch_value(0), -1.0);
        assert_eq!(patch_value(255), 1.0);
        assert_eq!(patch_value_quantized(0), 4_294_967_296.0);
        assert_eq!(patch_value_quantized(255), 1.0);
        for level in 1..255u8 {
            assert_eq!(patch_value_quantized(level), 0.0, "level {level}");
        }
        assert_eq!(mlx_f32_to_u32(-2.0), 4_294_967_294);
    }

    #[test]
    fn patch_layout_is_dy_dx_c() {
        // 2 x 4 image, patch 2: two patches side by side.
        let rgb: Vec<u8> = (0..2 * 4 * 3).map(|v| v as u8).collect();
        let mut ident = [0f32; 256];
        for (i, v) in ident.iter_mut().enumerate() {
            *v = i as f32;
        }
        let p = patchify(&rgb, 2, 4, 2, &ident);
        // Patch 1 (x = 1): pixels (0,2), (0,3), (1,2), (1,3).
        let want: Vec<f32> = [6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23]
            .iter()
            .map(|&v| v as f32)
            .collect();
        assert_eq!(&p[12..24], &want[..]);
        assert_eq!(patch_positions(2, 3)[4], (1, 1));
    }
}
