//! Expanding image placeholders in a prompt's token ids.
//!
//! The reference (`optiq/vlm/diffusion_gemma/generate.py`, `_build_image_inputs`) encodes the
//! templated prompt, then replaces the k-th `<|image|>` id with `boi + image * n_k + eoi`, where
//! `n_k` is image k's soft-token count, and marks image ids with token type 1 (`mm_token_type_ids`;
//! everything else, `boi`/`eoi` included, is 0). The Gemma 4 processor does the same on text.

use crate::error::{Result, TokenizeError};

/// Token type of text (and of the `boi` / `eoi` delimiters).
pub const TOKEN_TYPE_TEXT: u32 = 0;
/// Token type of image soft tokens.
pub const TOKEN_TYPE_IMAGE: u32 = 1;

/// The three ids involved (from the model config: `image_token_id`, `boi_token_id`,
/// `eoi_token_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokenIds {
    /// The placeholder, also used for every soft token.
    pub image: u32,
    /// Begin-of-image delimiter.
    pub boi: u32,
    /// End-of-image delimiter.
    pub eoi: u32,
}

/// A prompt with its images expanded.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpandedPrompt {
    /// Token ids: each placeholder replaced by `boi + image * n + eoi`.
    pub ids: Vec<u32>,
    /// One per id: [`TOKEN_TYPE_TEXT`] or [`TOKEN_TYPE_IMAGE`].
    pub token_types: Vec<u32>,
}

/// Number of image placeholders in `ids`.
pub fn count_image_placeholders(ids: &[u32], tokens: &ImageTokenIds) -> usize {
    ids.iter().filter(|&&t| t == tokens.image).count()
}

/// Replaces the k-th image placeholder by `boi + image * counts[k] + eoi`. Errors unless the
/// number of placeholders equals `counts.len()` (the reference fails on too few counts and
/// silently ignores extra ones; both are caller bugs).
pub fn expand_image_tokens(
    ids: &[u32],
    tokens: &ImageTokenIds,
    counts: &[usize],
) -> Result<ExpandedPrompt> {
    let placeholders = count_image_placeholders(ids, tokens);
    if placeholders != counts.len() {
        return Err(TokenizeError::ImageCountMismatch {
            placeholders,
            images: counts.len(),
            image_token_id: tokens.image,
        });
    }
    let total = ids.len() + counts.iter().map(|&n| n + 1).sum::<usize>();
    let mut out = ExpandedPrompt {
        ids: Vec::with_capacity(total),
        token_types: Vec::with_capacity(total),
    };
    let mut counts = counts.iter();
    for &t in ids {
        if t == tokens.image {
            // Cannot fail: the number of placeholders was checked above.
            let n = counts.next().copied().unwrap_or(0);
            out.ids.push(tokens.boi);
            out.ids.extend(std::iter::repeat_n(tokens.image, n));
            out.ids.push(tokens.eoi);
        } else {
            out.ids.push(t);
        }
    }
    out.token_types = out
        .ids
        .iter()
        .map(|&t| {
            if t == tokens.image {
                TOKEN_TYPE_IMAGE
            } else {
                TOKEN_TYPE_TEXT
            }
        })
        .collect();
    Ok(out)
}
