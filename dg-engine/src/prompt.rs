//! Turning a request's prompt (and images) into encoder input: token ids, and for image prompts
//! the expanded image blocks, their token types and the image features to scatter in.

use std::path::PathBuf;

use dg_core::TextModel;
use dg_tokenize::ImageTokenIds;
#[cfg(feature = "vision")]
use dg_tokenize::{expand_image_tokens, TOKEN_TYPE_TEXT};
#[cfg(feature = "vision")]
use dg_vision::{ImageFeatures, VisionModel};

use crate::error::{EngineError, Result};

/// An image given with a request.
///
/// The prompt holds one image placeholder per image, in order;
/// [`Request::with_images`](crate::Request::with_images) builds the reference's image prompt
/// (the placeholders, then the text, in one user turn). The checkpoint must have a vision tower
/// (and dg-engine its `vision` feature, on by default).
///
/// ```
/// # #[cfg(feature = "vision")] {
/// use dg_engine::{DiffusionGemma, Image, Request};
///
/// let dir = "path/to/checkpoint";
/// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/models/tiny-vision");
/// let (first, second) = ("first.png", "second.png");
/// # let first = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/images/pair_a.png");
/// # let second = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/images/pair_b.png");
/// let model = DiffusionGemma::load(dir)?;
/// // A path, or encoded bytes already in memory.
/// let images = vec![Image::from(first), Image::Bytes(std::fs::read(second)?)];
/// let request = Request::with_images("What differs between these?", images).max_tokens(32);
/// let answer = model.generate(&request)?;
/// println!("{}", answer.text);
/// # }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Image {
    /// An image file (PNG, JPEG, WebP, GIF first frame).
    Path(PathBuf),
    /// Encoded image bytes.
    Bytes(Vec<u8>),
    /// Decoded 8-bit RGB pixels, row-major.
    Rgb {
        /// Width in pixels.
        width: usize,
        /// Height in pixels.
        height: usize,
        /// `height x width x 3` bytes, row-major RGB.
        pixels: Vec<u8>,
    },
}

impl From<PathBuf> for Image {
    fn from(p: PathBuf) -> Self {
        Image::Path(p)
    }
}

impl From<&str> for Image {
    fn from(p: &str) -> Self {
        Image::Path(p.into())
    }
}

/// A prompt ready for the encoder.
#[derive(Clone, Debug)]
pub struct PreparedPrompt {
    /// Token ids, image placeholders expanded to `boi + image * n + eoi`.
    pub ids: Vec<u32>,
    /// One per id (0 text, 1 image); empty for text-only prompts.
    pub token_types: Vec<u32>,
    /// Features of each image, in prompt order.
    #[cfg(feature = "vision")]
    pub features: Vec<ImageFeatures>,
}

impl PreparedPrompt {
    /// A prompt without images.
    fn text(ids: Vec<u32>) -> Self {
        PreparedPrompt {
            ids,
            token_types: Vec::new(),
            #[cfg(feature = "vision")]
            features: Vec::new(),
        }
    }
}

/// How many image placeholder tokens `ids` holds (none without image tokens).
fn image_placeholders(ids: &[u32], tokens: Option<ImageTokenIds>) -> usize {
    tokens.map_or(0, |t| ids.iter().filter(|&&id| id == t.image).count())
}

/// Without the `vision` feature: a prompt with images is refused.
#[cfg(not(feature = "vision"))]
pub(crate) fn attach_images(
    ids: Vec<u32>,
    images: &[Image],
    tokens: Option<ImageTokenIds>,
) -> Result<PreparedPrompt> {
    if images.is_empty() && image_placeholders(&ids, tokens) == 0 {
        return Ok(PreparedPrompt::text(ids));
    }
    Err(EngineError::InvalidArgument {
        name: "images",
        reason: "dg-engine was built without its `vision` feature".into(),
    })
}

/// Expands image placeholders in `ids` and encodes the images.
#[cfg(feature = "vision")]
pub(crate) fn attach_images(
    ids: Vec<u32>,
    images: &[Image],
    vision: Option<&VisionModel>,
    limits: dg_vision::DecodeLimits,
    tokens: Option<ImageTokenIds>,
) -> Result<PreparedPrompt> {
    let placeholders = image_placeholders(&ids, tokens);
    if images.is_empty() && placeholders == 0 {
        return Ok(PreparedPrompt::text(ids));
    }
    let (Some(vision), Some(tokens)) = (vision, tokens) else {
        return Err(EngineError::InvalidArgument {
            name: "images",
            reason: "this checkpoint has no vision tower".into(),
        });
    };
    if placeholders != images.len() {
        return Err(EngineError::InvalidArgument {
            name: "images",
            reason: format!(
                "{} images for {placeholders} image placeholders (token {}) in the prompt",
                images.len(),
                tokens.image
            ),
        });
    }
    let mut processor = vision.processor();
    processor.limits = limits;
    let prepared = images
        .iter()
        .map(|image| match image {
            Image::Path(path) => processor.prepare_path(path),
            Image::Bytes(bytes) => processor.prepare_bytes(bytes, "image bytes"),
            Image::Rgb {
                width,
                height,
                pixels,
            } => processor.prepare_rgb(*width, *height, pixels),
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let counts: Vec<usize> = prepared.iter().map(|p| p.soft_tokens).collect();
    let expanded = expand_image_tokens(&ids, &tokens, &counts)?;
    let features = vision.encode_all(&prepared)?;
    Ok(PreparedPrompt {
        ids: expanded.ids,
        token_types: expanded.token_types,
        features,
    })
}

/// The encoder input of a prompt: its embeddings `[len, hidden]`, where image features
/// replace the image-token embeddings, and, with images, the block id of each position (each
/// image block attends to itself bidirectionally: the reference's vision overlay).
pub(crate) fn encoder_input(
    model: &TextModel,
    prompt: &PreparedPrompt,
) -> Result<(Vec<f32>, Option<Vec<i32>>)> {
    let embeds = model.embed_prompt(&prompt.ids)?;
    #[cfg(feature = "vision")]
    if !prompt.features.is_empty() {
        return scatter_images(model, prompt, embeds);
    }
    Ok((embeds, None))
}

/// Image features in place of the image tokens' embeddings, and the image blocks.
#[cfg(feature = "vision")]
fn scatter_images(
    model: &TextModel,
    prompt: &PreparedPrompt,
    mut embeds: Vec<f32>,
) -> Result<(Vec<f32>, Option<Vec<i32>>)> {
    let image_token = model.config().image_token_id.unwrap_or(u32::MAX);
    dg_vision::scatter_image_features(
        &mut embeds,
        model.hidden_size(),
        &prompt.ids,
        image_token,
        &prompt.features,
    )?;
    Ok((embeds, Some(image_blocks(&prompt.token_types))))
}

/// Block id per position: contiguous runs of image tokens get 0, 1, 2, ...; text gets -1.
#[cfg(feature = "vision")]
fn image_blocks(token_types: &[u32]) -> Vec<i32> {
    let mut next = 0;
    let mut previous_image = false;
    token_types
        .iter()
        .map(|&t| {
            let image = t != TOKEN_TYPE_TEXT;
            let id = if image {
                if !previous_image {
                    next += 1;
                }
                next - 1
            } else {
                -1
            };
            previous_image = image;
            id
        })
        .collect()
}

#[cfg(all(test, feature = "vision"))]
mod tests {
    use super::image_blocks;

    #[test]
    fn image_runs_become_blocks() {
        assert_eq!(
            image_blocks(&[0, 1, 1, 0, 0, 1, 0]),
            vec![-1, 0, 0, -1, -1, 1, -1]
        );
        assert_eq!(image_blocks(&[1, 1]), vec![0, 0]);
        assert_eq!(image_blocks(&[]), Vec::<i32>::new());
    }
}
