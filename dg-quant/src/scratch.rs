//! Per-thread scratch buffers, reused across calls: the dequantized panels are hundreds of KB,
//! and a fresh allocation of that size is a fresh mmap with page faults every time.

use std::cell::RefCell;

thread_local! {
    static BUFS: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with a buffer of exactly `len` elements whose
/// contents are unspecified (callers overwrite before reading).
pub fn with_buffer<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    // Take the buffer out of the cell so that a nested call on this thread (rayon may run
    // another task here while this one waits) gets its own instead of a double borrow.
    let mut buf = BUFS.with(|b| b.borrow_mut().pop()).unwrap_or_default();
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    let r = f(&mut buf[..len]);
    BUFS.with(|b| b.borrow_mut().push(buf));
    r
}
