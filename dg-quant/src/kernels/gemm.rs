//! Safe glue over the `gemm` crate's raw-pointer f32 GEMM, plus a way for parallel tasks to
//! write disjoint column panels of one row-major output.
//!
//! The reduction order of each output element depends only on the shapes (the crate's
//! blocking comes from `m, n, k` and the cache sizes), never on the thread count.

use std::marker::PhantomData;

use gemm::Parallelism;

/// Work (multiply-adds) above which a standalone f32 GEMM splits across the current pool.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// Largest element index + 1 touched by a `rows x cols` view with the given strides.
fn extent(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

/// `out[i*out_rs + j] (+)= sum_k lhs[i*lhs_rs + k] * rhs[k*rhs_rs + j*rhs_cs]` for `i < m`,
/// `j < n`, `k < depth`; `accumulate` adds to `out` instead of overwriting it.
///
/// Panics if a view does not fit its slice (callers validate shapes first).
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided(
    m: usize,
    n: usize,
    depth: usize,
    out: &mut [f32],
    out_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    lhs_rs: usize,
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    parallel: bool,
) {
    assert!(
        extent(m, n, out_rs, 1) <= out.len(),
        "gemm output view out of bounds"
    );
    assert!(
        extent(m, depth, lhs_rs, 1) <= lhs.len(),
        "gemm lhs view out of bounds"
    );
    assert!(
        extent(depth, n, rhs_rs, rhs_cs) <= rhs.len(),
        "gemm rhs view out of bounds"
    );
    // SAFETY: the three views were just checked to lie inside their slices, `out` is borrowed
    // mutably (no aliasing with `lhs`/`rhs`), and the strides fit in isize because the
    // extents fit in slices.
    unsafe {
        gemm_raw(
            m,
            n,
            depth,
            out.as_mut_ptr(),
            out_rs,
            accumulate,
            lhs,
            lhs_rs,
            rhs,
            rhs_rs,
            rhs_cs,
            parallel,
        )
    }
}

/// # Safety
/// `out` must be valid for writes of the `m x n` view with row stride `out_rs`, not aliased
/// by `lhs`/`rhs`, whose views must lie inside their slices.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_raw(
    m: usize,
    n: usize,
    depth: usize,
    out: *mut f32,
    out_rs: usize,
    accumulate: bool,
    lhs: &[f32],
    lhs_rs: usize,
    rhs: &[f32],
    rhs_rs: usize,
    rhs_cs: usize,
    parallel: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if depth == 0 {
        if !accumulate {
            for i in 0..m {
                // SAFETY: row i of the output view is valid for n writes (caller contract).
                unsafe { std::slice::from_raw_parts_mut(out.add(i * out_rs), n) }.fill(0.0);
            }
        }
        return;
    }
    let parallelism = if parallel && m * n * depth >= PARALLEL_MIN_MACS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: the caller guarantees the views; gemm computes
    // dst = alpha * dst + beta * lhs @ rhs, reading dst only when `read_dst`.
    unsafe {
        gemm::gemm(
            m,
            n,
            depth,
            out,
            1,
            out_rs as isize,
            accumulate,
            lhs.as_ptr(),
            1,
            lhs_rs as isize,
            rhs.as_ptr(),
            rhs_cs as isize,
            rhs_rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        )
    }
}

/// Mutable access to columns `c0..c1` of a row-major `[m, n]` output, handed to one task of
/// `par_column_panels`.
pub struct ColumnPanel<'a> {
    ptr: *mut f32,
    m: usize,
    n: usize,
    c0: usize,
    c1: usize,
    _out: PhantomData<&'a mut [f32]>,
}

// SAFETY: a panel only ever touches its own columns, disjoint from every other panel's, so
// moving it to another thread cannot race.
unsafe impl Send for ColumnPanel<'_> {}

impl ColumnPanel<'_> {
    /// First column of this panel.
    pub fn start(&self) -> usize {
        self.c0
    }

    /// Width of this panel.
    pub fn width(&self) -> usize {
        self.c1 - self.c0
    }

    /// Row `i` of this panel: `out[i, c0..c1]`.
    pub fn row_mut(&mut self, i: usize) -> &mut [f32] {
        assert!(i < self.m, "panel row out of range");
        // SAFETY: row i, columns c0..c1 lie inside the [m, n] output (checked at creation) and
        // belong to this panel alone; the &mut self borrow prevents a second live slice.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr.add(i * self.n + self.c0), self.c1 - self.c0)
        }
    }
}

/// Runs `f` on the current rayon pool once per column panel `[c, c + width)` of the row-major
/// `out [m, n]` (the last panel may be narrower). Panels are disjoint, so tasks write in
/// parallel without synchronization; the partition does not depend on the thread count.
pub fn par_column_panels<F>(out: &mut [f32], m: usize, n: usize, width: usize, f: F)
where
    F: Fn(ColumnPanel<'_>) + Sync + Send,
{
    use rayon::prelude::*;
    assert!(
        width > 0 && m.checked_mul(n) == Some(out.len()),
        "bad column panel split"
    );
    let ptr = SendPtr(out.as_mut_ptr());
    let panels = n.div_ceil(width);
    (0..panels).into_par_iter().for_each(|p| {
        let c0 = p * width;
        let panel = ColumnPanel {
            ptr: ptr.get(),
            m,
            n,
            c0,
            c1: (c0 + width).min(n),
            _out: PhantomData,
        };
        f(panel)
    });
}

/// `par_column_panels` on the calling thread, panel after panel.
pub fn seq_column_panels<F>(out: &mut [f32], m: usize, n: usize, width: usize, mut f: F)
where
    F: FnMut(ColumnPanel<'_>),
{
    assert!(
        width > 0 && m.checked_mul(n) == Some(out.len()),
        "bad column panel split"
    );
    for c0 in (0..n).step_by(width) {
        f(ColumnPanel {
            ptr: out.as_mut_ptr(),
            m,
            n,
            c0,
            c1: (c0 + width).min(n),
            _out: PhantomData,
        });
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to hand disjoint column panels of one exclusively borrowed output to
// parallel tasks (see `par_column_panels`).
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer itself is never dereferenced through a shared reference.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
