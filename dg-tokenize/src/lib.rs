//! dg-tokenize
