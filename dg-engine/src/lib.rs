//! dg-engine
