//! Inline images: `data:` URLs (OpenAI `image_url`) and base64 sources (Anthropic `image`
//! blocks), decoded to bytes for the vision tower. The server fetches nothing: a remote URL is
//! refused.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use dg_engine::Image;

use crate::error::ApiError;

/// Standard base64, padded or not.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes base64 image data (whitespace, as MIME line breaks, ignored), refusing more than
/// `max_bytes` decoded bytes with 413.
pub(crate) fn decode_base64(data: &str, param: &str, max_bytes: usize) -> Result<Image, ApiError> {
    let compact: String;
    let data = if data.bytes().any(|b| b.is_ascii_whitespace()) {
        compact = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        compact.as_str()
    } else {
        data
    };
    // Decoded size: 3 bytes per 4 characters (less the padding).
    let decoded_len = data.trim_end_matches('=').len() / 4 * 3;
    if decoded_len > max_bytes {
        return Err(ApiError::too_large(format!(
            "the image is larger than the {max_bytes} bytes this server accepts"
        ))
        .param(param));
    }
    if data.is_empty() {
        return Err(ApiError::invalid(param, "the image data is empty"));
    }
    let bytes = BASE64
        .decode(data)
        .map_err(|e| ApiError::invalid(param, format!("the image is not valid base64: {e}")))?;
    if bytes.len() > max_bytes {
        return Err(ApiError::too_large(format!(
            "the image is larger than the {max_bytes} bytes this server accepts"
        ))
        .param(param));
    }
    Ok(Image::Bytes(bytes))
}

/// Decodes an image URL: only `data:<media type>;base64,<data>` is taken.
pub(crate) fn decode_url(url: &str, param: &str, max_bytes: usize) -> Result<Image, ApiError> {
    let url = url.trim();
    let lower = url
        .get(..url.len().min(8))
        .unwrap_or_default()
        .to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        return Err(ApiError::invalid(
            param,
            "remote image URLs are not supported: the server fetches nothing; send the image \
             inline as a data: URL (data:image/png;base64,...)",
        ));
    }
    let Some(rest) = url
        .strip_prefix("data:")
        .or_else(|| url.strip_prefix("DATA:"))
    else {
        return Err(ApiError::invalid(
            param,
            "an image URL must be a data: URL (data:image/png;base64,...)",
        ));
    };
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(ApiError::invalid(
            param,
            "a data: URL has no ',' before its data",
        ));
    };
    if !meta
        .split(';')
        .any(|p| p.trim().eq_ignore_ascii_case("base64"))
    {
        return Err(ApiError::invalid(
            param,
            "only base64 data: URLs are supported (data:image/png;base64,...)",
        ));
    }
    decode_base64(data, param, max_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls() {
        let Image::Bytes(b) = decode_url("data:image/png;base64,AAEC", "p", 10).unwrap() else {
            panic!()
        };
        assert_eq!(b, [0, 1, 2]);
        let Image::Bytes(b) = decode_url("data:image/png;base64,AAE", "p", 10).unwrap() else {
            panic!()
        };
        assert_eq!(b, [0, 1]);
        let e = decode_url("https://example.invalid/a.png", "p", 10).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("fetches nothing"));
        assert_eq!(
            decode_url("data:image/png,xyz", "p", 10)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            decode_url("data:;base64,@@@@", "p", 10).unwrap_err().status,
            400
        );
        assert_eq!(
            decode_url("data:image/png;base64,AAAAAAAAAAAA", "p", 4)
                .unwrap_err()
                .status,
            413
        );
    }
}
