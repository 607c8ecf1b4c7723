//! Safe glue over the raw-pointer f32 GEMM of `gemm-f32` (the f32 part of the `gemm` crate),
//! plus the one way tasks (in parallel or in turn) write disjoint column panels of one
//! row-major output.
//!
//! The reduction order of each output element depends only on the shapes (the crate's
//! blocking comes from `m, n, k` and the cache sizes), never on the thread count.

use std::marker::PhantomData;

use gemm_common::Parallelism;

/// Work (multiply-adds) above which a standalone f32 GEMM splits across the current pool.
const PARALLEL_MIN_MACS: usize = 1 << 18;

/// `out [m, n] = a [m, k] @ B` with `B` = `b [k, n]`, or `b [n, k]` transposed when
/// `b_transposed`; splits across the current pool above `PARALLEL_MIN_MACS`.
///
/// Panics if a length does not match (callers validate shapes first).
pub fn matmul_f32(
    a: &[f32],
    b: &[f32],
    (m, k, n): (usize, usize, usize),
    b_transposed: bool,
    out: &mut [f32],
) {
    assert!(
        a.len() == m * k && b.len() == k * n && out.len() == m * n,
        "gemm: lengths do not match [{m}, {k}] @ [{k}, {n}]"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out.fill(0.0);
        return;
    }
    let (rhs_rs, rhs_cs) = if b_transposed { (1, k) } else { (n, 1) };
    let parallelism = if m * n * k >= PARALLEL_MIN_MACS {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: the three row-major views lie inside their slices (lengths checked above, so the
    // strides fit in isize); `out` is borrowed mutably, so it aliases neither input; gemm
    // computes dst = lhs @ rhs without reading dst (`read_dst` false).
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            k as isize,
            b.as_ptr(),
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
/// `column_panels`.
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

/// Runs `f` once per column panel `[c, c + width)` of the row-major `out [m, n]` (the last
/// panel may be narrower): on the current rayon pool if `parallel`, else on this thread in
/// order. Panels are disjoint, so tasks write without synchronization; the partition does not
/// depend on the thread count.
pub fn column_panels<F>(out: &mut [f32], (m, n): (usize, usize), width: usize, parallel: bool, f: F)
where
    F: Fn(ColumnPanel<'_>) + Sync + Send,
{
    use rayon::prelude::*;
    assert!(
        width > 0 && m.checked_mul(n) == Some(out.len()),
        "bad column panel split"
    );
    let ptr = SendPtr(out.as_mut_ptr());
    let panel = |p: usize| {
        let c0 = p * width;
        f(ColumnPanel {
            ptr: ptr.get(),
            m,
            n,
            c0,
            c1: (c0 + width).min(n),
            _out: PhantomData,
        })
    };
    let panels = n.div_ceil(width);
    if parallel {
        (0..panels).into_par_iter().for_each(panel);
    } else {
        (0..panels).for_each(panel);
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: only used to hand disjoint column panels of one exclusively borrowed output to
// parallel tasks (see `column_panels`).
unsafe impl Send for SendPtr {}
// SAFETY: as above; the pointer itself is never dereferenced through a shared reference.
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}
