//! The Gemma 4 image processor as the reference runs it
//! (`optiq/vlm/gemma4/image_processing.py::preprocess_images`, called by
//! `optiq/vlm/diffusion_gemma/generate.py::_build_image_inputs`):
//!
//! 1. `img.convert("RGB")` ([`crate::decode`]),
//! 2. an aspect-preserving resize so that the image has at most `max_soft_tokens * pooling^2`
//!    patches and both sides are multiples of `pooling * patch` (48), with Pillow's BICUBIC
//!    filter (`resize.rs`); an image already at its target size is not resampled,
//! 3. `np.asarray(img, float32) * (1 / 255)`, channel-first; no normalization,
//! 4. `soft_tokens = (H / 16) * (W / 16) / 9`.
//!
//! The public reference path hard-codes patch 16, pooling 3 and 280 soft tokens and ignores
//! `processor_config.json`; [`ImageProcessor::default`] does the same.

use std::path::Path;

use half::bf16;

use crate::decode::{decode_rgb8, DecodeLimits, ExifOrientation, RgbImage};
use crate::error::{Result, VisionError};
use crate::resize::resize_bicubic_rgb8;

/// Most pixels an [`ImageProcessor`]'s resize target may have, `max_soft_tokens *
/// pooling_kernel_size^2 * patch_size^2` (the reference's: 645,120); 805 MB of RGB.
pub const MAX_TARGET_PIXELS: usize = 1 << 28;

/// `RESCALE_FACTOR = 1 / 255` as numpy applies it to a float32 array (rounded to f32).
pub const RESCALE_FACTOR: f32 = (1.0f64 / 255.0) as f32;

/// `np.float32(v) * np.float32(1 / 255)`: the processor's output for one u8 level.
#[inline]
pub fn rescale(v: u8) -> f32 {
    f32::from(v) * RESCALE_FACTOR
}

/// Image-processor settings. `Default` is what the reference's public path uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageProcessor {
    /// Patch side in pixels.
    pub patch_size: usize,
    /// Soft-token budget per image: the resize keeps at most `max_soft_tokens * pooling^2` patches.
    pub max_soft_tokens: usize,
    /// Side of the square of patches pooled into one soft token.
    pub pooling_kernel_size: usize,
    /// Bounds on the encoded and decoded image.
    pub limits: DecodeLimits,
    /// Whether to apply the EXIF orientation (the reference ignores it).
    pub exif: ExifOrientation,
}

impl Default for ImageProcessor {
    fn default() -> Self {
        Self {
            patch_size: 16,
            max_soft_tokens: 280,
            pooling_kernel_size: 3,
            limits: DecodeLimits::default(),
            exif: ExifOrientation::Ignore,
        }
    }
}

/// One preprocessed image: the resized RGB pixels (the processor's exact state before the
/// rescale) and its soft-token count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedImage {
    /// Resized height (a multiple of `pooling * patch`).
    pub height: usize,
    /// Resized width (a multiple of `pooling * patch`).
    pub width: usize,
    /// `height x width x 3`, row-major RGB.
    pub rgb: Vec<u8>,
    /// Placeholder tokens this image expands to: `(H/p) * (W/p) / pooling^2`.
    pub soft_tokens: usize,
    /// Patch side in pixels used to prepare this image.
    pub patch_size: usize,
    /// Pooling side used to prepare this image.
    pub pooling_kernel_size: usize,
}

impl PreparedImage {
    /// The processor's `pixel_values` for this image: `[3, H, W]` float32 in [0, 1],
    /// identical to the reference's (before `_build_image_inputs` casts them to bfloat16).
    pub fn pixel_values(&self) -> Vec<f32> {
        let n = self.height * self.width;
        let mut out = vec![0f32; 3 * n];
        for (i, px) in self.rgb.chunks_exact(3).enumerate() {
            for c in 0..3 {
                out[c * n + i] = rescale(px[c]);
            }
        }
        out
    }

    /// `pixel_values` as the tower receives them from the public path: cast to bfloat16.
    pub fn pixel_values_bf16(&self) -> Vec<bf16> {
        self.pixel_values()
            .into_iter()
            .map(bf16::from_f32)
            .collect()
    }

    /// Patch grid `(rows, cols)`.
    pub fn patch_grid(&self) -> (usize, usize) {
        (self.height / self.patch_size, self.width / self.patch_size)
    }
}

impl ImageProcessor {
    fn check(&self) -> Result<()> {
        for (option, v) in [
            ("patch_size", self.patch_size),
            ("max_soft_tokens", self.max_soft_tokens),
            ("pooling_kernel_size", self.pooling_kernel_size),
        ] {
            if v == 0 {
                return Err(VisionError::InvalidOption {
                    option,
                    message: "must be positive".into(),
                });
            }
        }
        // The resize target's pixel budget, `max_patches * patch^2`, bounds every size below
        // (and what the resize allocates); checked, as the fields are public.
        let pixels = [self.pooling_kernel_size, self.pooling_kernel_size]
            .into_iter()
            .chain([self.patch_size, self.patch_size])
            .try_fold(self.max_soft_tokens, usize::checked_mul);
        if pixels.is_none_or(|n| n > MAX_TARGET_PIXELS) {
            return Err(VisionError::InvalidOption {
                option: "max_soft_tokens / pooling_kernel_size / patch_size",
                message: format!(
                    "max_soft_tokens {} x pooling_kernel_size {}^2 x patch_size {}^2 is over \
                     {MAX_TARGET_PIXELS} pixels",
                    self.max_soft_tokens, self.pooling_kernel_size, self.patch_size
                ),
            });
        }
        Ok(())
    }

    /// Most patches an image may have: `max_soft_tokens * pooling^2` (2520); saturates at
    /// `usize::MAX` for options that [`ImageProcessor::prepare`] refuses.
    pub fn max_patches(&self) -> usize {
        self.max_soft_tokens
            .saturating_mul(self.pooling_kernel_size)
            .saturating_mul(self.pooling_kernel_size)
    }

    /// The resize target `(height, width)` for an image of `height x width`, exactly as
    /// `_aspect_ratio_preserving_resize` computes it (f64 arithmetic, like Python floats).
    pub fn target_size(&self, height: usize, width: usize) -> Result<(usize, usize)> {
        self.check()?;
        if height == 0 || width == 0 {
            return Err(VisionError::EmptyImage {
                what: "image".into(),
                width,
                height,
            });
        }
        let max_patches = self.max_patches();
        let target_px = (max_patches * self.patch_size * self.patch_size) as f64;
        let factor = (target_px / (height as f64 * width as f64)).sqrt();
        let side = self.pooling_kernel_size * self.patch_size;
        let side_f = side as f64;
        let mut th = (factor * height as f64 / side_f).floor() as usize * side;
        let mut tw = (factor * width as f64 / side_f).floor() as usize * side;
        if th == 0 && tw == 0 {
            return Err(VisionError::ImageShape {
                height,
                width,
                message: "would resize to 0 x 0".into(),
            });
        }
        let max_side = (max_patches / (self.pooling_kernel_size * self.pooling_kernel_size)) * side;
        // Saturating: a 1 x 2^60 image has a ratio whose multiple overflows (capped anyway).
        if th == 0 {
            th = side;
            tw = ((width as f64 / height as f64).floor() as usize)
                .saturating_mul(side)
                .min(max_side);
        } else if tw == 0 {
            tw = side;
            th = ((height as f64 / width as f64).floor() as usize)
                .saturating_mul(side)
                .min(max_side);
        }
        Ok((th, tw))
    }

    /// Resizes a decoded image and counts its soft tokens.
    pub fn prepare(&self, image: &RgbImage) -> Result<PreparedImage> {
        check_rgb_len(image.width, image.height, image.data.len())?;
        let (th, tw) = self.target_size(image.height, image.width)?;
        let rgb = resize_bicubic_rgb8(&image.data, image.height, image.width, th, tw);
        let n_patches = (th / self.patch_size) * (tw / self.patch_size);
        Ok(PreparedImage {
            height: th,
            width: tw,
            rgb,
            soft_tokens: n_patches / (self.pooling_kernel_size * self.pooling_kernel_size),
            patch_size: self.patch_size,
            pooling_kernel_size: self.pooling_kernel_size,
        })
    }

    /// Decodes image bytes (PNG, JPEG, WebP, GIF) and prepares them. `what` names the image
    /// in errors.
    pub fn prepare_bytes(&self, bytes: &[u8], what: &str) -> Result<PreparedImage> {
        self.check()?;
        let rgb = decode_rgb8(bytes, what, self.limits, self.exif)?;
        self.prepare(&rgb)
    }

    /// Reads, decodes and prepares an image file: a regular file of at most
    /// `limits.max_encoded_bytes` (a FIFO or a device is refused, not read until it ends).
    pub fn prepare_path(&self, path: impl AsRef<Path>) -> Result<PreparedImage> {
        use std::io::Read;
        let path = path.as_ref();
        let what = path.display().to_string();
        let io = |source| VisionError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Checked before opening: opening a FIFO would wait for a writer.
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::other("not a regular file")));
        }
        let file = std::fs::File::open(path).map_err(io)?;
        self.limits.check_encoded(&what, meta.len())?;
        let mut bytes = Vec::new();
        // The cap holds even if the file grows after the size check.
        file.take(self.limits.max_encoded_bytes.saturating_add(1))
            .read_to_end(&mut bytes)
            .map_err(io)?;
        self.prepare_bytes(&bytes, &what)
    }

    /// Prepares raw `height x width x 3` RGB bytes (already decoded by the caller), within the
    /// same size limits as a decoded image.
    pub fn prepare_rgb(&self, width: usize, height: usize, rgb: &[u8]) -> Result<PreparedImage> {
        check_rgb_len(width, height, rgb.len())?;
        self.limits
            .check_size("raw RGB image", width as u64, height as u64)?;
        self.prepare(&RgbImage {
            width,
            height,
            data: rgb.to_vec(),
        })
    }
}

/// Checks that `len` bytes are a `width x height` RGB image (with overflow-checked sizes).
pub(crate) fn check_rgb_len(width: usize, height: usize, len: usize) -> Result<()> {
    let expected = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(3))
        .ok_or_else(|| VisionError::InvalidOption {
            option: "image size",
            message: format!("{width} x {height} pixels: the size overflows"),
        })?;
    if len != expected {
        return Err(VisionError::PixelBuffer {
            width,
            height,
            expected,
            got: len,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> ImageProcessor {
        ImageProcessor::default()
    }

    #[test]
    fn sizes_that_overflow_are_errors() {
        let err = p()
            .prepare_rgb(1 << 62, 4, &[0; 48])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("image size") && err.contains("overflows"),
            "{err}"
        );
        let err = p().prepare_rgb(4, 4, &[0; 47]).unwrap_err().to_string();
        assert!(err.contains("holds 47 bytes"), "{err}");
    }

    #[test]
    fn target_sizes_match_the_reference_math() {
        // Values computed with the reference's _aspect_ratio_preserving_resize.
        assert_eq!(p().target_size(48, 64).unwrap(), (672, 912));
        assert_eq!(p().target_size(170, 24).unwrap(), (2112, 288));
        assert_eq!(p().target_size(40, 160).unwrap(), (384, 1584));
        assert_eq!(p().target_size(1, 1).unwrap(), (768, 768));
        // Extreme aspect: the short side hits 0 and is set to 48, the long one capped.
        assert_eq!(p().target_size(1000, 2).unwrap(), (13440, 48));
        assert_eq!(p().target_size(2, 1000).unwrap(), (48, 13440));
    }

    #[test]
    fn every_target_fits_the_budget() {
        for (h, w) in [
            (1, 1),
            (3, 7),
            (480, 640),
            (1080, 1920),
            (10000, 3),
            (17, 4000),
        ] {
            let (th, tw) = p().target_size(h, w).unwrap();
            assert!(th % 48 == 0 && tw % 48 == 0 && th > 0 && tw > 0);
            assert!((th / 16) * (tw / 16) <= 2520, "{h}x{w} -> {th}x{tw}");
        }
    }

    #[test]
    fn rescale_is_f32_times_f32() {
        assert_eq!(rescale(0), 0.0);
        assert_eq!(rescale(255), 255.0f32 * RESCALE_FACTOR);
        assert_eq!(RESCALE_FACTOR, 0.003_921_569_f32);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(p().target_size(0, 5).is_err());
        assert!(p().prepare_rgb(2, 2, &[0; 11]).is_err());
        let bad = ImageProcessor {
            patch_size: 0,
            ..ImageProcessor::default()
        };
        assert!(bad.target_size(10, 10).is_err());
    }
}
