//! Large buffers whose size a request or a checkpoint decides (logits `[canvas, vocab]`,
//! prompt embeddings, self-conditioning signals), allocated so that running out of memory is an
//! error naming the buffer instead of an abort of the whole process.
//!
//! On Linux with overcommit an allocation can succeed and the process still be killed later
//! when its pages are touched; what these helpers catch is the allocator refusing (an address
//! space limit such as `ulimit -v`, a size past `isize::MAX`, a failing `mmap`).
//!
//! [`retain_freed_memory`] is the one process-wide switch: glibc keeps freed blocks for reuse.

use std::alloc::Layout;

/// The allocator refused a buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("out of memory: cannot allocate {what} ({bytes} bytes)")]
pub struct OutOfMemory {
    /// The buffer (e.g. "logits [canvas, vocab]").
    pub what: &'static str,
    /// Its size; `usize::MAX` when the size itself overflows.
    pub bytes: usize,
}

/// A vector of `len` zeros, from the allocator's zeroed memory (calloc: fresh pages are not
/// written twice, as with `vec![0.0; len]`), or [`OutOfMemory`] naming `what`.
pub fn zeroed(len: usize, what: &'static str) -> Result<Vec<f32>, OutOfMemory> {
    let oom = |bytes| OutOfMemory { what, bytes };
    let layout = Layout::array::<f32>(len).map_err(|_| oom(usize::MAX))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size; the pointer, when not null, comes from the global
    // allocator with the layout `Vec<f32>` of capacity `len` frees with, and all-zero bytes are
    // the f32 0.0.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout).cast::<f32>();
        if ptr.is_null() {
            return Err(oom(layout.size()));
        }
        Ok(Vec::from_raw_parts(ptr, len, len))
    }
}

/// A copy of `src` (one pass, as `to_vec`), or [`OutOfMemory`] naming `what`.
pub fn copied<T: Copy>(src: &[T], what: &'static str) -> Result<Vec<T>, OutOfMemory> {
    let mut v = Vec::new();
    v.try_reserve_exact(src.len()).map_err(|_| OutOfMemory {
        what,
        bytes: std::mem::size_of_val(src),
    })?;
    v.extend_from_slice(src);
    Ok(v)
}

/// Reserves room for `additional` more elements in `v`, or [`OutOfMemory`] naming `what`.
pub fn reserve<T>(
    v: &mut Vec<T>,
    additional: usize,
    what: &'static str,
) -> Result<(), OutOfMemory> {
    v.try_reserve(additional).map_err(|_| OutOfMemory {
        what,
        bytes: additional.saturating_mul(std::mem::size_of::<T>()),
    })
}

/// Asks the C allocator to keep freed memory for the next allocation instead of handing it back
/// to the system, for the whole process; returns whether it took the settings (only glibc on
/// Linux has them: elsewhere this does nothing and returns `false`).
///
/// glibc serves every block over 32 MiB (a long prompt's activations: 4096 tokens of the real
/// model's hidden size are 46 MiB; its experts' inputs several hundred) with a fresh `mmap`
/// and unmaps it on free, so each layer faults in and zeroes its buffers' pages again. With
/// `mmap` off (`M_MMAP_MAX = 0`) and the heap's top never trimmed below 2 GiB
/// (`M_TRIM_THRESHOLD`), the next layer reuses those pages: prefill runs faster
/// (docs/PERFORMANCE.md), and the process keeps the memory of its largest pass until it
/// exits, which an inference server keeps anyway. Call it once, at start-up, before the
/// model loads; the `serve` and `generate` examples do. The same settings from the outside:
/// `GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647`.
pub fn retain_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes the allocator's parameters; glibc serializes it with
        // the allocator's own locks, so concurrent allocations stay sound.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1) == 1
                && libc::mallopt(libc::M_MMAP_MAX, 0) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_and_copied_buffers() {
        let z = zeroed(1000, "test").unwrap();
        assert_eq!(z.len(), 1000);
        assert!(z.iter().all(|&v| v == 0.0));
        assert!(zeroed(0, "empty").unwrap().is_empty());
        assert_eq!(copied(&[1u32, 2, 3], "test").unwrap(), vec![1, 2, 3]);
        let mut v = vec![1.0f32];
        reserve(&mut v, 10, "test").unwrap();
        assert!(v.capacity() >= 11);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        // 2^47 bytes: more than a 47-bit user address space holds, whatever the overcommit.
        let e = zeroed(1 << 45, "logits [canvas, vocab]").unwrap_err();
        assert_eq!((e.what, e.bytes), ("logits [canvas, vocab]", 1 << 47));
        assert!(e.to_string().contains("out of memory"), "{e}");
        // Past isize::MAX bytes: the allocator is never asked.
        let e = zeroed(usize::MAX / 4 + 1, "x").unwrap_err();
        assert_eq!(e.bytes, usize::MAX);
        let mut v: Vec<f32> = Vec::new();
        assert!(reserve(&mut v, usize::MAX / 8, "kv").is_err());
    }
}
