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

/// Alignment of the buffers `with_buffer` hands out, in f32s: one cache line. A 64-byte vector
/// load or store that straddles two lines costs two accesses (the unpacked panels' stores;
/// docs/PERFORMANCE.md).
const ALIGN: usize = 16;

/// Index of the first element of `buf` on a 64-byte boundary (a `Vec<f32>` is 4-byte aligned,
/// so the distance is a whole number of f32s, at most `ALIGN - 1`).
pub fn line_offset(buf: &[f32]) -> usize {
    (buf.as_ptr() as usize).wrapping_neg() % (ALIGN * 4) / 4
}

/// Runs `f` with a buffer of exactly `len` elements, starting on a 64-byte boundary, whose
/// contents are unspecified (callers overwrite before reading).
pub fn with_buffer<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    // Take a buffer out of the cell (the smallest one that fits, else the largest, to grow)
    // so that a nested call on this thread (rayon may run another task here while this one
    // waits) gets a different one instead of a double borrow. Room is kept for the offset to
    // the next 64-byte boundary.
    let need = len + ALIGN - 1;
    let mut buf = BUFS
        .with(|b| {
            let mut bufs = b.borrow_mut();
            let pick = bufs
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= need)
                .min_by_key(|(_, v)| v.len())
                .or_else(|| bufs.iter().enumerate().max_by_key(|(_, v)| v.len()))
                .map(|(i, _)| i);
            pick.map(|i| bufs.swap_remove(i))
        })
        .unwrap_or_default();
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let off = line_offset(&buf);
    let r = f(&mut buf[off..off + len]);
    if buf.len() <= KEEP_MAX {
        BUFS.with(|b| b.borrow_mut().push(buf));
    }
    r
}
