//! dg-core
