//! dg-vision
