//! dg-quant
