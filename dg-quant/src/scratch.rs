//! Per-thread scratch buffers, reused across calls: the dequantized panels and partial sums
//! are hundreds of KB, and a fresh allocation of that size is a fresh mmap with page faults
//! every time.

use std::cell::RefCell;

/// Buffers larger than this (in f32s, 16 MB) are not kept: work that large amortizes its
/// allocation, and keeping them would pin that much memory per thread.
const KEEP_MAX: usize = 4 << 20;

thread_local! {
    static BUFS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of exactly `len` elements whose contents are unspecified (callers
/// overwrite before reading).
pub fn with_buffer<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    // Take a buffer out of the cell (the smallest one that fits, else the largest, to grow)
    // so that a nested call on this thread (rayon may run another task here while this one
    // waits) gets a different one instead of a double borrow.
    let mut buf = BUFS
        .with(|b| {
            let mut bufs = b.borrow_mut();
            let pick = bufs
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= len)
                .min_by_key(|(_, v)| v.len())
                .or_else(|| bufs.iter().enumerate().max_by_key(|(_, v)| v.len()))
                .map(|(i, _)| i);
            pick.map(|i| bufs.swap_remove(i))
        })
        .unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let r = f(&mut buf[..len]);
    if buf.len() <= KEEP_MAX {
        BUFS.with(|b| b.borrow_mut().push(buf));
    }
    r
}
