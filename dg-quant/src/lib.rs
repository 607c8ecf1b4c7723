//! dg-quant: MLX affine quantized tensors and the CPU kernels that multiply with them.
//!
//! - [`QuantSpec`], [`QMatrix`], [`QExperts`]: the MLX layout (`format.rs`).
//! - [`quantize`], [`quantize_f32`], [`dequantize`], [`embedding`]: bit-identical to
//!   `mx.quantize` / `mx.dequantize` (`affine.rs`).
//! - [`matmul_t`], [`matmul`], [`gather_matmul_t`], [`matmul_f32`]: products in f32
//!   (`matmul/`), parallel on the current rayon pool ([`pool::build`]), with results that
//!   do not depend on the thread count. Each quantized product runs one [`Plan`], chosen from
//!   the weights' format and the kernels only ([`QMatrix::plan`] says which).
//! - [`attention_bidirectional`]: softmax attention over every key, in blocks of queries;
//!   [`attention_values`]: attention's `probs @ values`, one fma chain per element.
//! - [`ops`]: small f32 operations shared by the models; [`mlx`]: MLX's CPU `exp` and softmax,
//!   bit for bit (the sampler's and the self-conditioning's one softmax).
//!
//! SIMD lives in `kernels/` only: kernel objects ([`Kernels`]) that exist only where the CPU
//! has their features (AVX2 + FMA on x86-64; AVX-512 where present for the unpacked panels of
//! 4/8-bit weights, which every `x @ W^T` with such weights takes whatever its row count, and
//! the tiles of `x @ W`), each with a scalar twin; `DG_QUANT_FORCE_AVX2=1` /
//! `DG_QUANT_FORCE_SCALAR=1` cap the kernels for testing.

#![warn(missing_docs)]

pub use half::bf16;

mod affine;
pub mod alloc;
mod attention;
mod error;
mod format;
mod kernels;
mod matmul;
pub mod mlx;
pub mod ops;
pub mod pool;
mod scratch;
pub mod sparse;

pub use affine::{dequantize, embedding, quantize, quantize_f32, Quantized, QuantizedF32};
pub use attention::attention_bidirectional;
pub use error::QuantError;
pub use format::{QExperts, QMatrix, QuantSpec};
#[cfg(target_arch = "x86_64")]
pub use kernels::{Avx2Fma, Avx512};
pub use kernels::{Kernels, Level, Scalar};
pub use matmul::{
    attention_values, gather_matmul_t, matmul, matmul_bf16_t, matmul_f32, matmul_t, Plan, Product,
};
pub use sparse::{matmul_sparse, SparseStats};
