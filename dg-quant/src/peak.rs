//! The yardstick the benches divide by: this CPU's fused multiply-add throughput, measured
//! with the widest FMA the kernels use here (AVX-512, else AVX2 + FMA, else the portable
//! loop), so a product's speed can be stated as a fraction of the core's peak measured in the
//! same run (see `benches/peak_ratio.rs`).

/// What one [`fma_peak`] call did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FmaRun {
    /// Floating-point operations done (2 per lane per fused multiply-add).
    pub flops: u64,
    /// The chains' final value (identical on every level); returned so the work is not
    /// optimized away.
    pub value: f32,
}

/// Runs `rounds` steps of 12 independent fused multiply-add chains on one thread, in
/// registers (no memory traffic). Time it to get one core's FMA peak in FLOP/s; run it on
/// every thread of a pool at once for the machine's.
pub fn fma_peak(rounds: usize) -> FmaRun {
    let (value, flops) = crate::kernels::fma_probe(rounds);
    FmaRun { flops, value }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::scalar;

    #[test]
    fn every_level_computes_the_scalar_chain() {
        for rounds in [0usize, 1, 7, 1000] {
            let want = scalar::fma_chain(rounds);
            let run = fma_peak(rounds);
            assert_eq!(run.value.to_bits(), want.to_bits(), "rounds {rounds}");
            assert_eq!(scalar::fma_probe(rounds).to_bits(), want.to_bits());
            assert!(run.flops >= (rounds * scalar::PROBE_CHAINS * 2 * 8) as u64);
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::{x86_64, x86_64_avx512};
                if x86_64::available() {
                    assert_eq!(x86_64::fma_probe(rounds).to_bits(), want.to_bits());
                }
                if x86_64_avx512::available() {
                    assert_eq!(x86_64_avx512::fma_probe(rounds).to_bits(), want.to_bits());
                }
            }
        }
    }
}
