//! Image decoding to 8-bit RGB the way the reference gets its pixels:
//! `PIL.Image.open(src).convert("RGB")`.
//!
//! Pillow's conversions, reproduced: alpha is dropped, not composited (RGBA, LA); grayscale is
//! replicated; palette images are expanded; 16-bit RGB(A) and LA keep the most significant byte
//! (Pillow unpacks them with `RGB;16B`-style raw modes); 16-bit grayscale (`I;16`) clips to 255.
//! The reference never calls `ImageOps.exif_transpose`, so an EXIF orientation tag is ignored
//! by default: the stored pixels are used as stored. [`ExifOrientation::Apply`] opts in.
//!
//! PNG, GIF and lossless WebP decode bit-identically to Pillow. JPEG does not: the image
//! crate's decoder (zune-jpeg) rounds its IDCT, chroma upsampling and YCbCr conversion
//! differently from Pillow's libjpeg-turbo (measured: a few percent to a quarter of the
//! values off by 1-4 levels). Lossy WebP is untested against libwebp.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageReader};

use crate::error::{Result, VisionError};

/// What to do with an EXIF orientation tag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ExifOrientation {
    /// Use the pixels as stored (the reference's behaviour).
    #[default]
    Ignore,
    /// Rotate / flip the image upright, as `PIL.ImageOps.exif_transpose` would.
    Apply,
}

/// Decoder safety limits: an image over one is refused with [`VisionError::TooLarge`] naming
/// the field, before its pixels are decoded. Set them on dg-engine's loader with
/// `LoadBuilder::image_limits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DecodeLimits {
    /// Most bytes an encoded image (or an image file) may have. Default 128 MiB.
    pub max_encoded_bytes: u64,
    /// Most pixels (width x height) an image may have. Default: Pillow's
    /// `DecompressionBombError` threshold, `2 * Image.MAX_IMAGE_PIXELS` = 178,956,970.
    pub max_pixels: u64,
    /// Widest image in pixels. Default: no limit beyond `max_pixels`.
    pub max_width: u64,
    /// Tallest image in pixels. Default: no limit beyond `max_pixels`.
    pub max_height: u64,
    /// Most bytes the decoder may allocate. Default 1 GiB.
    pub max_alloc_bytes: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self {
            max_encoded_bytes: 128 << 20,
            max_pixels: 2 * 89_478_485,
            max_width: u64::MAX,
            max_height: u64::MAX,
            max_alloc_bytes: 1 << 30,
        }
    }
}

impl DecodeLimits {
    /// Limits with the given pixel budget and the defaults otherwise.
    pub fn with_max_pixels(max_pixels: u64) -> Self {
        Self {
            max_pixels,
            ..Self::default()
        }
    }

    /// Sets [`max_encoded_bytes`](Self::max_encoded_bytes).
    pub fn max_encoded_bytes(mut self, bytes: u64) -> Self {
        self.max_encoded_bytes = bytes;
        self
    }

    /// Sets [`max_pixels`](Self::max_pixels).
    pub fn max_pixels(mut self, pixels: u64) -> Self {
        self.max_pixels = pixels;
        self
    }

    /// Sets [`max_width`](Self::max_width) and [`max_height`](Self::max_height).
    pub fn max_size(mut self, width: u64, height: u64) -> Self {
        self.max_width = width;
        self.max_height = height;
        self
    }

    /// Sets [`max_alloc_bytes`](Self::max_alloc_bytes).
    pub fn max_alloc_bytes(mut self, bytes: u64) -> Self {
        self.max_alloc_bytes = bytes;
        self
    }

    /// Refuses an encoded image of `len` bytes over [`max_encoded_bytes`](Self::max_encoded_bytes).
    pub fn check_encoded(&self, what: &str, len: u64) -> Result<()> {
        match len > self.max_encoded_bytes {
            true => Err(too_large(
                what,
                "max_encoded_bytes",
                format!("{len} bytes"),
                self.max_encoded_bytes,
            )),
            false => Ok(()),
        }
    }

    /// Refuses a `width x height` image over [`max_width`](Self::max_width),
    /// [`max_height`](Self::max_height) or [`max_pixels`](Self::max_pixels).
    pub fn check_size(&self, what: &str, width: u64, height: u64) -> Result<()> {
        let size = format!("{width} x {height} pixels");
        if width > self.max_width {
            return Err(too_large(what, "max_width", size, self.max_width));
        }
        if height > self.max_height {
            return Err(too_large(what, "max_height", size, self.max_height));
        }
        if width.saturating_mul(height) > self.max_pixels {
            return Err(too_large(what, "max_pixels", size, self.max_pixels));
        }
        Ok(())
    }
}

fn too_large(what: &str, limit: &str, size: String, value: u64) -> VisionError {
    VisionError::TooLarge {
        what: what.to_string(),
        message: format!(
            "{size}, over the limit DecodeLimits::{limit} = {value} (dg-engine: \
             LoadBuilder::image_limits)"
        ),
    }
}

/// A decoded image: `height x width x 3` bytes, row-major RGB.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `height x width x 3` bytes, row-major RGB.
    pub data: Vec<u8>,
}

fn map_err(what: &str, e: ImageError) -> VisionError {
    match e {
        ImageError::Unsupported(_) => VisionError::UnsupportedFormat {
            what: what.to_string(),
        },
        ImageError::Limits(l) => VisionError::TooLarge {
            what: what.to_string(),
            message: l.to_string(),
        },
        other => VisionError::Decode {
            what: what.to_string(),
            message: other.to_string(),
        },
    }
}

/// Decodes PNG, JPEG, WebP or GIF bytes (the format is sniffed from the content; a GIF gives
/// its first frame). `what` names the source in errors (a path, "request image 2", ...).
pub fn decode_rgb8(
    bytes: &[u8],
    what: &str,
    limits: DecodeLimits,
    exif: ExifOrientation,
) -> Result<RgbImage> {
    limits.check_encoded(what, bytes.len() as u64)?;
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| VisionError::Decode {
            what: what.to_string(),
            message: e.to_string(),
        })?;
    if reader.format().is_none() {
        return Err(VisionError::UnsupportedFormat {
            what: what.to_string(),
        });
    }
    let mut reader = reader;
    let mut l = image::Limits::default();
    l.max_alloc = Some(limits.max_alloc_bytes);
    reader.limits(l);
    let mut decoder = reader.into_decoder().map_err(|e| map_err(what, e))?;
    let (w, h) = decoder.dimensions();
    if w == 0 || h == 0 {
        return Err(VisionError::EmptyImage {
            what: what.to_string(),
            width: w as usize,
            height: h as usize,
        });
    }
    limits.check_size(what, w.into(), h.into())?;
    let orientation = match exif {
        ExifOrientation::Ignore => None,
        // A damaged EXIF block is not worth failing the image for; PIL's exif_transpose
        // likewise leaves such an image alone.
        ExifOrientation::Apply => decoder.orientation().ok(),
    };
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| map_err(what, e))?;
    if let Some(o) = orientation {
        img.apply_orientation(o);
    }
    to_rgb8_like_pillow(img, what)
}

/// `Image.convert("RGB")` for each pixel layout the decoders produce.
fn to_rgb8_like_pillow(img: DynamicImage, what: &str) -> Result<RgbImage> {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let n = width * height;
    let mut data = Vec::with_capacity(n * 3);
    match img {
        DynamicImage::ImageRgb8(b) => data = b.into_raw(),
        DynamicImage::ImageRgba8(b) => {
            for p in b.as_raw().chunks_exact(4) {
                data.extend_from_slice(&p[..3]);
            }
        }
        DynamicImage::ImageLuma8(b) => {
            for &v in b.as_raw() {
                data.extend_from_slice(&[v, v, v]);
            }
        }
        DynamicImage::ImageLumaA8(b) => {
            for p in b.as_raw().chunks_exact(2) {
                data.extend_from_slice(&[p[0], p[0], p[0]]);
            }
        }
        DynamicImage::ImageRgb16(b) => data.extend(b.as_raw().iter().map(|&v| (v >> 8) as u8)),
        DynamicImage::ImageRgba16(b) => {
            for p in b.as_raw().chunks_exact(4) {
                data.extend(p[..3].iter().map(|&v| (v >> 8) as u8));
            }
        }
        DynamicImage::ImageLuma16(b) => {
            for &v in b.as_raw() {
                let c = v.min(255) as u8;
                data.extend_from_slice(&[c, c, c]);
            }
        }
        DynamicImage::ImageLumaA16(b) => {
            for p in b.as_raw().chunks_exact(2) {
                let c = (p[0] >> 8) as u8;
                data.extend_from_slice(&[c, c, c]);
            }
        }
        _ => {
            return Err(VisionError::Decode {
                what: what.to_string(),
                message: "floating-point pixel formats are not supported".into(),
            })
        }
    }
    debug_assert_eq!(data.len(), n * 3);
    Ok(RgbImage {
        width,
        height,
        data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_unsupported_not_a_panic() {
        let e = decode_rgb8(
            b"hello",
            "x",
            DecodeLimits::default(),
            ExifOrientation::Ignore,
        )
        .unwrap_err();
        assert!(matches!(e, VisionError::UnsupportedFormat { .. }), "{e}");
        let e =
            decode_rgb8(&[], "x", DecodeLimits::default(), ExifOrientation::Ignore).unwrap_err();
        assert!(matches!(e, VisionError::UnsupportedFormat { .. }), "{e}");
    }

    #[test]
    fn pixel_limit_applies_before_decoding() {
        let mut png = Vec::new();
        let img = image::RgbImage::from_pixel(20, 10, image::Rgb([1, 2, 3]));
        img.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
            .unwrap();
        let ok = decode_rgb8(&png, "x", DecodeLimits::default(), ExifOrientation::Ignore).unwrap();
        assert_eq!((ok.width, ok.height), (20, 10));
        assert_eq!(&ok.data[..3], &[1, 2, 3]);
        let e = decode_rgb8(
            &png,
            "x",
            DecodeLimits::with_max_pixels(199),
            ExifOrientation::Ignore,
        )
        .unwrap_err();
        assert!(matches!(e, VisionError::TooLarge { .. }), "{e}");
        // Each limit is named in its error.
        let cases = [
            (
                DecodeLimits::default().max_encoded_bytes(10),
                "max_encoded_bytes = 10",
            ),
            (DecodeLimits::default().max_size(19, 100), "max_width = 19"),
            (DecodeLimits::default().max_size(100, 9), "max_height = 9"),
            (DecodeLimits::default().max_pixels(199), "max_pixels = 199"),
        ];
        for (limits, named) in cases {
            let e = decode_rgb8(&png, "img", limits, ExifOrientation::Ignore).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, VisionError::TooLarge { .. }), "{msg}");
            assert!(msg.contains(named) && msg.contains("image_limits"), "{msg}");
        }
        let exact = DecodeLimits::default()
            .max_encoded_bytes(png.len() as u64)
            .max_size(20, 10)
            .max_pixels(200);
        decode_rgb8(&png, "x", exact, ExifOrientation::Ignore).unwrap();
    }

    #[test]
    fn sixteen_bit_conversions_follow_pillow() {
        let g = image::ImageBuffer::<image::Luma<u16>, _>::from_raw(3, 1, vec![7u16, 255, 4000])
            .unwrap();
        let rgb = to_rgb8_like_pillow(DynamicImage::ImageLuma16(g), "x").unwrap();
        assert_eq!(rgb.data, vec![7, 7, 7, 255, 255, 255, 255, 255, 255]);
        let c = image::ImageBuffer::<image::Rgb<u16>, _>::from_raw(
            1,
            1,
            vec![0x1234u16, 0xff00, 0x00ff],
        )
        .unwrap();
        let rgb = to_rgb8_like_pillow(DynamicImage::ImageRgb16(c), "x").unwrap();
        assert_eq!(rgb.data, vec![0x12, 0xff, 0x00]);
    }
}
