//! Yardsticks the benches divide by, kept out of the published crates: this CPU's fused
//! multiply-add throughput ([`fma_peak`]), measured with the widest FMA the dg-quant kernels
//! use here (AVX-512, else AVX2 + FMA, else a portable loop), so that a product's speed can be
//! stated as a fraction of the core's peak measured in the same run (`benches/peak_ratio.rs`).

#![warn(missing_docs)]

#[cfg(target_arch = "x86_64")]
mod x86_64;

/// Independent chains of the probe: enough to cover the FMA latency on two FMA ports (4
/// cycles x 2 in flight).
const CHAINS: usize = 12;
/// Step of every chain, `a = a * M + C` from 1.0: it converges to 0.1, so no round count
/// overflows or turns subnormal (which would slow the FMAs down).
const M: f32 = 0.9999;
const C: f32 = 1e-5;

/// What one [`fma_peak`] call did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FmaRun {
    /// Floating-point operations done (2 per lane per fused multiply-add).
    pub flops: u64,
    /// The chains' final value (the same at every width); returned so the work is not
    /// optimized away.
    pub value: f32,
}

/// Runs `rounds` steps of 12 independent fused multiply-add chains on one thread, in
/// registers (no memory traffic), at the widest vector width this CPU has (the dg-quant
/// kernels' switches `DG_QUANT_FORCE_SCALAR` / `DG_QUANT_FORCE_AVX2` cap it as they cap the
/// kernels). Time it to get one core's FMA peak in FLOP/s; run it on every thread of a pool
/// at once for the machine's.
pub fn fma_peak(rounds: usize) -> FmaRun {
    let chains = (rounds * CHAINS * 2) as u64;
    #[cfg(target_arch = "x86_64")]
    if let Some(probe) = x86_64::Probe::best() {
        return FmaRun {
            value: probe.run(rounds),
            flops: chains * probe.lanes() as u64,
        };
    }
    FmaRun {
        value: scalar_probe(rounds),
        flops: chains * 8,
    }
}

/// The portable probe: `CHAINS` chains of 8 lanes (vectorized where the target has vector FMA
/// in its baseline, e.g. aarch64); returns the smallest lane.
fn scalar_probe(rounds: usize) -> f32 {
    let mut a = [[1.0f32; 8]; CHAINS];
    for _ in 0..rounds {
        for lane in a.iter_mut().flatten() {
            *lane = lane.mul_add(M, C);
        }
    }
    a.iter().flatten().fold(f32::INFINITY, |m, &v| m.min(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value every lane of every chain holds after `rounds` steps.
    fn chain(rounds: usize) -> f32 {
        (0..rounds).fold(1.0f32, |a, _| a.mul_add(M, C))
    }

    #[test]
    fn every_width_computes_the_scalar_chain() {
        for rounds in [0usize, 1, 7, 1000] {
            let want = chain(rounds);
            assert_eq!(
                scalar_probe(rounds).to_bits(),
                want.to_bits(),
                "rounds {rounds}"
            );
            let run = fma_peak(rounds);
            assert_eq!(run.value.to_bits(), want.to_bits(), "rounds {rounds}");
            assert!(run.flops >= (rounds * CHAINS * 2 * 8) as u64);
            #[cfg(target_arch = "x86_64")]
            for probe in x86_64::Probe::available() {
                assert_eq!(probe.run(rounds).to_bits(), want.to_bits(), "{probe:?}");
            }
        }
    }
}
