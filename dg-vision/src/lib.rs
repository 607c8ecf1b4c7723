//! Image input for DiffusionGemma: the Gemma 4 image processor, the vision tower and the
//! multimodal embedder, matching mlx-optiq 0.7.7 (see [`patches`] for its one surprise).
//!
//! ```no_run
//! use dg_vision::VisionModel;
//! # fn main() -> Result<(), dg_vision::VisionError> {
//! let vision = VisionModel::load("path/to/checkpoint")?;
//! let image = vision.processor().prepare_path("photo.jpg")?;
//! // The prompt gets `boi + image_token * image.soft_tokens + eoi` for this image ...
//! let features = vision.encode(&image)?;
//! // ... and these rows replace the image-token embeddings, in order.
//! assert_eq!(features.tokens, image.soft_tokens);
//! # Ok(()) }
//! ```
//!
//! Modules: [`decode`] (bytes to RGB as Pillow's `convert("RGB")`), [`preprocess`] (resize
//! budget, Pillow-exact bicubic, rescale), [`patches`] (patchify and the inline-4-bit uint32
//! quirk), the tower (`tower`, `rope2d`) and the embedder. The weights are read through dg-core's
//! [`Checkpoint`] (shards and the vision sidecar, mapped once, shared with the text model) and
//! its linear layers.

#![warn(missing_docs)]

pub mod config;
pub mod decode;
mod embedder;
pub mod error;
pub mod patches;
pub mod preprocess;
mod resize;
mod rope2d;
mod tower;

use std::path::{Path, PathBuf};

use dg_core::checkpoint::{Checkpoint, SanitizeOptions};

pub use config::{CheckpointConfig, VisionConfig};
pub use decode::{decode_rgb8, DecodeLimits, ExifOrientation, RgbImage};
pub use dg_core::checkpoint::find_vision_sidecar;
pub use error::{Result, VisionError};
pub use preprocess::{ImageProcessor, PreparedImage};
pub use tower::TowerOutput;

/// Where the tower's weights came from.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightLayout {
    /// In the model shards (`model.encoder.vision_tower.*`); `quantized` when `input_proj` is.
    Inline {
        /// Whether the tower's linears are quantized.
        quantized: bool,
    },
    /// In the bf16 sidecar at this path.
    Sidecar {
        /// The sidecar safetensors file.
        path: PathBuf,
    },
}

/// Features for one image, ready to replace its image-token embeddings.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageFeatures {
    /// Rows: the image's soft-token count.
    pub tokens: usize,
    /// Columns: the text model's hidden size.
    pub hidden: usize,
    /// `[tokens, hidden]`, row-major.
    pub data: Vec<f32>,
}

/// Writes image features over the embeddings of the image-token positions, in order: the
/// reference's `masked_scatter(inputs_embeds, ids == image_token_id, features)` in
/// `EncoderModel._embed_inputs`. `embeds` is `[ids.len(), hidden]`; `features` are the
/// prompt's images in prompt order. The reference silently wraps around when the counts
/// differ (`indices % source.size`); here that is a [`VisionError::TokenCount`] error.
pub fn scatter_image_features(
    embeds: &mut [f32],
    hidden: usize,
    ids: &[u32],
    image_token_id: u32,
    features: &[ImageFeatures],
) -> Result<()> {
    if embeds.len() != ids.len() * hidden {
        return Err(VisionError::Width {
            what: "embeddings",
            expected: ids.len() * hidden,
            got: embeds.len(),
        });
    }
    if let Some(f) = features.iter().find(|f| f.hidden != hidden) {
        return Err(VisionError::Width {
            what: "image features",
            expected: hidden,
            got: f.hidden,
        });
    }
    let image_tokens = ids.iter().filter(|&&t| t == image_token_id).count();
    let feature_rows: usize = features.iter().map(|f| f.tokens).sum();
    if image_tokens != feature_rows {
        return Err(VisionError::TokenCount {
            image_tokens,
            feature_rows,
        });
    }
    let mut rows = features.iter().flat_map(|f| f.data.chunks_exact(hidden));
    for (pos, _) in ids.iter().enumerate().filter(|(_, &t)| t == image_token_id) {
        // Counts are equal, so a row exists for every image token.
        if let Some(row) = rows.next() {
            embeds[pos * hidden..(pos + 1) * hidden].copy_from_slice(row);
        }
    }
    Ok(())
}

/// Pillow's BICUBIC resize of packed RGB8, exposed for tests and tools.
pub fn resize_bicubic_rgb8(
    src: &[u8],
    in_h: usize,
    in_w: usize,
    out_h: usize,
    out_w: usize,
) -> Result<Vec<u8>> {
    preprocess::check_rgb_len(in_w, in_h, src.len())?;
    if in_h == 0 || in_w == 0 || out_h == 0 || out_w == 0 {
        return Err(VisionError::InvalidOption {
            option: "size",
            message: format!("{in_h}x{in_w} -> {out_h}x{out_w}: sides must be positive"),
        });
    }
    Ok(resize::resize_bicubic_rgb8(src, in_h, in_w, out_h, out_w))
}

/// The vision tower plus embedder of one checkpoint.
pub struct VisionModel {
    config: CheckpointConfig,
    vision: VisionConfig,
    tower: tower::VisionTower,
    embedder: embedder::Embedder,
    layout: WeightLayout,
    dir: PathBuf,
}

impl std::fmt::Debug for VisionModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisionModel")
            .field("dir", &self.dir)
            .field("layout", &self.layout)
            .field("vision", &self.vision)
            .finish_non_exhaustive()
    }
}

impl VisionModel {
    /// Loads the tower and embedder of the checkpoint in `dir`: from the model shards
    /// (`model.encoder.vision_tower.*`, possibly quantized) or from the bf16 sidecar
    /// `optiq/optiq_vision.safetensors` (or `optiq_vision.safetensors`). Fails with
    /// [`VisionError::NoVisionTower`] when `config.json` has no `vision_config`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = CheckpointConfig::load(dir)?;
        let Some(vision) = &config.vision else {
            return Err(VisionError::NoVisionTower {
                path: dir.join("config.json"),
            });
        };
        let opts = SanitizeOptions {
            has_vision_tower: true,
            use_clipped_linears: vision.use_clipped_linears,
        };
        Self::from_checkpoint(&Checkpoint::open(dir, opts)?, config)
    }

    /// Builds the tower and embedder from a checkpoint already opened (with
    /// `has_vision_tower`, so that it holds the sidecar's tensors too) and its `config.json`: the
    /// engine opens one [`Checkpoint`] for the text model and the tower.
    pub fn from_checkpoint(ck: &Checkpoint, config: CheckpointConfig) -> Result<Self> {
        let dir = ck.dir();
        let vision = config
            .vision
            .clone()
            .ok_or_else(|| VisionError::NoVisionTower {
                path: dir.join("config.json"),
            })?;
        let quant = config.quantization.as_ref();
        let tower = tower::VisionTower::load(ck, quant, &vision)?;
        let embedder = embedder::Embedder::load(
            ck,
            quant,
            vision.hidden_size,
            config.text_hidden_size,
            vision.rms_norm_eps,
        )?;
        let probe = "model.encoder.vision_tower.patch_embedder.input_proj.weight";
        let layout = match ck.sidecar() {
            Some(sidecar) if ck.file_of(probe)? == sidecar => WeightLayout::Sidecar {
                path: sidecar.to_owned(),
            },
            _ => WeightLayout::Inline {
                quantized: tower.quantized_input_proj(),
            },
        };
        Ok(Self {
            config,
            vision,
            tower,
            embedder,
            layout,
            dir: dir.to_path_buf(),
        })
    }

    /// The checkpoint's `config.json` as far as the vision path reads it.
    pub fn checkpoint_config(&self) -> &CheckpointConfig {
        &self.config
    }

    /// The tower's `vision_config`.
    pub fn vision_config(&self) -> &VisionConfig {
        &self.vision
    }

    /// Where the tower's weights came from.
    pub fn layout(&self) -> &WeightLayout {
        &self.layout
    }

    /// Width of the features: the text model's hidden size.
    pub fn text_hidden_size(&self) -> usize {
        self.embedder.text_hidden()
    }

    /// The image processor the reference's public path uses (patch 16, pooling 3, 280 soft
    /// tokens, whatever `processor_config.json` says).
    pub fn processor(&self) -> ImageProcessor {
        ImageProcessor::default()
    }

    fn check_image(&self, image: &PreparedImage) -> Result<()> {
        let v = &self.vision;
        if image.patch_size != v.patch_size || image.pooling_kernel_size != v.pooling_kernel_size {
            return Err(VisionError::InvalidOption {
                option: "patch_size / pooling_kernel_size",
                message: format!(
                    "image prepared with patch {} / pooling {}, the tower uses {} / {}",
                    image.patch_size,
                    image.pooling_kernel_size,
                    v.patch_size,
                    v.pooling_kernel_size
                ),
            });
        }
        Ok(())
    }

    /// The vision tower's output for one image (`[soft_tokens, vision_hidden]`), before the
    /// embedder.
    pub fn encode_tower(&self, image: &PreparedImage) -> Result<TowerOutput> {
        self.check_image(image)?;
        let out = self.tower.forward(&image.rgb, image.height, image.width)?;
        debug_assert_eq!(out.tokens, image.soft_tokens);
        Ok(out)
    }

    /// Patch projection plus position embeddings of the image's real patches
    /// (`[n_patches, vision_hidden]`): the tower's first step, for diagnostics.
    pub fn embed_patches(&self, image: &PreparedImage) -> Result<Vec<f32>> {
        self.check_image(image)?;
        self.tower
            .embed_patches(&image.rgb, image.height, image.width)
    }

    /// `get_image_features` for one image: `[soft_tokens, text_hidden]`. These rows replace
    /// the embeddings of the image's `soft_tokens` image-token positions, in order.
    pub fn encode(&self, image: &PreparedImage) -> Result<ImageFeatures> {
        let t = self.encode_tower(image)?;
        let data = self.embedder.forward(&t.data, t.tokens)?;
        Ok(ImageFeatures {
            tokens: t.tokens,
            hidden: self.embedder.text_hidden(),
            data,
        })
    }

    /// [`encode`](Self::encode) for several images, in order. The reference concatenates all
    /// images' features and scatters them over the image tokens in prompt order; each image
    /// is computed on its own (batching does not change the values). Unlike the reference's
    /// public path (`np.stack`), images of different sizes are fine.
    pub fn encode_all(&self, images: &[PreparedImage]) -> Result<Vec<ImageFeatures>> {
        images.iter().map(|i| self.encode(i)).collect()
    }
}
