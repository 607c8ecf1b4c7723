//! The library's own rayon thread pool. Kernels run on the *current* pool, so callers wrap
//! model work in `pool.install(..)`.

use crate::QuantError;

/// A rayon pool of `threads` workers; `None` means one per physical core (hyper-threads share
/// the FMA units the kernels saturate, so they add contention, not throughput).
pub fn build(threads: Option<usize>) -> Result<rayon::ThreadPool, QuantError> {
    let n = match threads {
        Some(0) => {
            return Err(QuantError::ThreadPool(
                "thread count must be at least 1".into(),
            ))
        }
        Some(n) => n,
        None => num_cpus::get_physical().max(1),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("dg-quant-{i}"))
        .build()
        .map_err(|e| QuantError::ThreadPool(e.to_string()))
}
