//! The probe in AVX2 and AVX-512 registers. A [`Probe`] is only made (by
//! [`Probe::available`]; this module is private) where the CPU has its features, so running it
//! is safe.

use std::arch::x86_64::*;

use super::{C, CHAINS, M};

/// A vector width this CPU can run the probe at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// 8 lanes (AVX2 + FMA).
    Avx2,
    /// 16 lanes (AVX-512F).
    Avx512,
}

impl Probe {
    /// Every width this CPU offers under dg-quant's switches, narrowest first.
    pub fn available() -> Vec<Probe> {
        let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty() && s != "0");
        let mut all = Vec::new();
        if set("DG_QUANT_FORCE_SCALAR")
            || !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
        {
            return all;
        }
        all.push(Probe::Avx2);
        if !set("DG_QUANT_FORCE_AVX2") && is_x86_feature_detected!("avx512f") {
            all.push(Probe::Avx512);
        }
        all
    }

    /// The widest.
    pub fn best() -> Option<Probe> {
        Probe::available().pop()
    }

    /// f32 lanes per vector.
    pub fn lanes(self) -> usize {
        match self {
            Probe::Avx2 => 8,
            Probe::Avx512 => 16,
        }
    }

    /// `rounds` steps of `CHAINS` independent FMA chains; the smallest lane.
    pub fn run(self, rounds: usize) -> f32 {
        match self {
            // SAFETY: a `Probe::Avx2` is only made where AVX2 and FMA were detected.
            Probe::Avx2 => unsafe { avx2(rounds) },
            // SAFETY: a `Probe::Avx512` is only made where AVX-512F was detected.
            Probe::Avx512 => unsafe { avx512(rounds) },
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn avx2(rounds: usize) -> f32 {
    let (m, c) = (_mm256_set1_ps(M), _mm256_set1_ps(C));
    let mut a = [_mm256_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for a in &mut a {
            *a = _mm256_fmadd_ps(*a, m, c);
        }
    }
    let lanes: [[f32; 8]; CHAINS] = a.map(|v| {
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
        out
    });
    lanes.iter().flatten().fold(f32::INFINITY, |m, &v| m.min(v))
}

#[target_feature(enable = "avx512f")]
fn avx512(rounds: usize) -> f32 {
    let (m, c) = (_mm512_set1_ps(M), _mm512_set1_ps(C));
    let mut a = [_mm512_set1_ps(1.0); CHAINS];
    for _ in 0..rounds {
        for a in &mut a {
            *a = _mm512_fmadd_ps(*a, m, c);
        }
    }
    let lanes: [[f32; 16]; CHAINS] = a.map(|v| {
        let mut out = [0.0f32; 16];
        // SAFETY: `out` holds 16 floats.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), v) };
        out
    });
    lanes.iter().flatten().fold(f32::INFINITY, |m, &v| m.min(v))
}
