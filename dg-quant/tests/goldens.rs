//! dg-quant against MLX 0.32.4 (tests/fixtures/goldens/quant.safetensors, written by
//! tools/reference/dump_quant_goldens.py).
//!
//! - `quantize` and `dequantize` must be bit-identical for every width and group size.
//! - Matmuls are compared with a bound on the rounding error of two different summation
//!   orders. MLX sums `x_k * w_k` sequentially in f32 (`_qmm_t` / `_qmm` on the CPU); dg-quant
//!   either uses the fused form `sum_g s_g (x_g . q_g) + b_g sum(x_g)` or a blocked GEMM over
//!   the exactly dequantized `w`. Each of the two results is within `(K + 8) u S` of the exact
//!   sum (Higham's bound for recursive summation; u = 2^-24, K the reduction length,
//!   `S = sum_g sum_{k in g} |x_k| (|s_g| q_k + |b_g|)` >= `sum |x_k w_k|`), so they differ by at
//!   most `2 (K + 8) u S`: about 3e-5 S for K = 256. A wrong element, scale or bias moves a
//!   result by O(S), far outside. The observed worst case is printed (typically < 1% of it).

use std::collections::HashMap;

use dg_quant::{bf16, QExperts, QMatrix, QuantSpec};
use safetensors::{Dtype, SafeTensors};

const PATH: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/goldens/quant.safetensors"
);

struct Goldens {
    bytes: Vec<u8>,
}

enum T {
    F32(Vec<f32>),
    U32(Vec<u32>),
    Bf16(Vec<bf16>),
}

impl Goldens {
    fn load() -> Self {
        Goldens {
            bytes: std::fs::read(PATH)
                .expect("quant goldens: run tools/reference/dump_quant_goldens.py"),
        }
    }

    fn get(&self, name: &str) -> (T, Vec<usize>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let d = t.data();
        let v = match t.dtype() {
            Dtype::F32 => T::F32(
                d.chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            Dtype::U32 => T::U32(
                d.chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            ),
            Dtype::BF16 => T::Bf16(
                d.chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                    .collect(),
            ),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        (v, t.shape().to_vec())
    }

    fn f32(&self, name: &str) -> Vec<f32> {
        match self.get(name).0 {
            T::F32(v) => v,
            T::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            T::U32(_) => panic!("{name} is u32"),
        }
    }

    fn u32(&self, name: &str) -> Vec<u32> {
        match self.get(name).0 {
            T::U32(v) => v,
            _ => panic!("{name} is not u32"),
        }
    }

    fn bf16(&self, name: &str) -> Vec<bf16> {
        match self.get(name).0 {
            T::Bf16(v) => v,
            _ => panic!("{name} is not bf16"),
        }
    }

    fn shape(&self, name: &str) -> Vec<usize> {
        self.get(name).1
    }
}

/// A golden quantized matrix: packed words, bf16 scales/biases.
struct Q {
    packed: Vec<u32>,
    scales: Vec<bf16>,
    biases: Vec<bf16>,
}

impl Q {
    fn load(g: &Goldens, prefix: &str) -> Self {
        Q {
            packed: g.u32(&format!("{prefix}packed")),
            scales: g.bf16(&format!("{prefix}scales")),
            biases: g.bf16(&format!("{prefix}biases")),
        }
    }

    fn view(&self, rows: usize, cols: usize, spec: QuantSpec) -> QMatrix<'_> {
        QMatrix::new(&self.packed, &self.scales, &self.biases, rows, cols, spec).unwrap()
    }
}

const BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
const GROUPS: [usize; 3] = [32, 64, 128];

#[test]
fn quantize_is_bit_identical_for_every_width_and_group() {
    let g = Goldens::load();
    let w = g.f32("w");
    let (rows, cols) = (8, 256);
    assert_eq!(g.shape("w"), [rows, cols]);
    for bits in BITS {
        for gs in GROUPS {
            let spec = QuantSpec::new(bits, gs).unwrap();
            let p = format!("q{bits}_g{gs}.");
            let want = Q::load(&g, &p);
            let got = dg_quant::quantize(&w, rows, cols, spec).unwrap();
            assert_eq!(got.packed, want.packed, "{p}packed");
            assert_eq!(bits_of(&got.scales), bits_of(&want.scales), "{p}scales");
            assert_eq!(bits_of(&got.biases), bits_of(&want.biases), "{p}biases");
        }
    }
}

fn bits_of(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn dequantize_is_bit_identical_for_every_width_and_group() {
    let g = Goldens::load();
    let (rows, cols) = (8, 256);
    for bits in BITS {
        for gs in GROUPS {
            let spec = QuantSpec::new(bits, gs).unwrap();
            let p = format!("q{bits}_g{gs}.");
            let q = Q::load(&g, &p);
            let want = g.f32(&format!("{p}dequant"));
            let mut got = vec![0.0f32; rows * cols];
            dg_quant::dequantize(&q.view(rows, cols, spec), &mut got).unwrap();
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{p}dequant[{i}]: {a} vs {b}");
            }
            // Embedding rows are the same dequantized rows.
            let ids = [7u32, 0, 3, 3];
            let mut emb = vec![0.0f32; ids.len() * cols];
            dg_quant::embedding(&q.view(rows, cols, spec), &ids, &mut emb).unwrap();
            for (j, &id) in ids.iter().enumerate() {
                let r = id as usize;
                assert_eq!(
                    bits_f32(&emb[j * cols..(j + 1) * cols]),
                    bits_f32(&want[r * cols..(r + 1) * cols]),
                    "{p}embedding row {id}"
                );
            }
        }
    }
}

fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn quantize_f32_input_is_bit_identical() {
    let g = Goldens::load();
    let w = g.f32("w32");
    let (rows, cols) = (4, 256);
    for (bits, gs) in [(4, 64), (8, 64), (3, 128)] {
        let spec = QuantSpec::new(bits, gs).unwrap();
        let p = format!("f32q{bits}_g{gs}.");
        let got = dg_quant::quantize_f32(&w, rows, cols, spec).unwrap();
        assert_eq!(got.packed, g.u32(&format!("{p}packed")), "{p}packed");
        assert_eq!(
            bits_f32(&got.scales),
            bits_f32(&g.f32(&format!("{p}scales"))),
            "{p}scales"
        );
        assert_eq!(
            bits_f32(&got.biases),
            bits_f32(&g.f32(&format!("{p}biases"))),
            "{p}biases"
        );
    }
}

/// Quantized value `(r, k)` of `q`, read straight from the bit stream.
fn q_at(q: &QMatrix, r: usize, k: usize) -> f64 {
    let bits = q.spec().bits as usize;
    let bit = r * q.cols() * bits + k * bits;
    let lo = q.packed()[bit / 32] as u64;
    let hi = q.packed().get(bit / 32 + 1).copied().unwrap_or(0) as u64;
    (((lo | (hi << 32)) >> (bit % 32)) & ((1u64 << bits) - 1)) as f64
}

/// `|s| q + |b|` for element `(r, k)`: the magnitude of each term of the fused form.
fn term(q: &QMatrix, r: usize, k: usize) -> f64 {
    let gi = r * (q.cols() / q.spec().group_size) + k / q.spec().group_size;
    (q.scales()[gi].to_f32() as f64).abs() * q_at(q, r, k) + (q.biases()[gi].to_f32() as f64).abs()
}

/// `S` of the module docs for `x . W[r]` (reduction over W's columns).
fn magnitude_t(xr: &[f32], q: &QMatrix, r: usize) -> f64 {
    xr.iter()
        .enumerate()
        .map(|(k, xv)| (*xv as f64).abs() * term(q, r, k))
        .sum()
}

/// `S` for `x . W[:, c]` (reduction over W's rows).
fn magnitude_n(xr: &[f32], q: &QMatrix, c: usize) -> f64 {
    xr.iter()
        .enumerate()
        .map(|(r, xv)| (*xv as f64).abs() * term(q, r, c))
        .sum()
}

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Asserts `|got - want| <= 2 (K + 8) u S` elementwise; returns the worst error in units of
/// the bound.
fn check_close(what: &str, got: &[f32], want: &[f32], k: usize, mag: impl Fn(usize) -> f64) -> f64 {
    let mut worst = 0.0f64;
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let bound = 2.0 * (k as f64 + 8.0) * U * mag(i);
        let err = (*a as f64 - *b as f64).abs();
        assert!(
            err <= bound,
            "{what}[{i}]: {a} vs MLX {b} (error {err:e} > bound {bound:e})"
        );
        if bound > 0.0 {
            worst = worst.max(err / bound);
        }
    }
    worst
}

#[test]
fn quantized_matmuls_match_mlx_float32() {
    let g = Goldens::load();
    let (rows, cols, m) = (48, 256, 17);
    assert_eq!(g.shape("mm4_g64.x_t"), [m, cols]);
    for (bits, gs) in [(4, 64), (8, 64), (3, 32), (6, 128)] {
        let spec = QuantSpec::new(bits, gs).unwrap();
        let p = format!("mm{bits}_g{gs}.");
        let q = Q::load(&g, &p);
        let w = q.view(rows, cols, spec);
        let (x_t, out_t) = (g.f32(&format!("{p}x_t")), g.f32(&format!("{p}out_t")));
        let (x_n, out_n) = (g.f32(&format!("{p}x_n")), g.f32(&format!("{p}out_n")));
        for mm in [1usize, 2, 3, 4, 5, 17] {
            let mut got = vec![0.0f32; mm * rows];
            dg_quant::matmul_t(&x_t[..mm * cols], mm, &w, &mut got).unwrap();
            let worst = check_close(
                &format!("{p}out_t m={mm}"),
                &got,
                &out_t[..mm * rows],
                cols,
                |i| magnitude_t(&x_t[(i / rows) * cols..(i / rows + 1) * cols], &w, i % rows),
            );
            println!("{p}out_t m={mm}: worst error {worst:.4} of the bound");
            let mut got = vec![0.0f32; mm * cols];
            dg_quant::matmul(&x_n[..mm * rows], mm, &w, &mut got).unwrap();
            let worst = check_close(
                &format!("{p}out_n m={mm}"),
                &got,
                &out_n[..mm * cols],
                rows,
                |i| magnitude_n(&x_n[(i / cols) * rows..(i / cols + 1) * rows], &w, i % cols),
            );
            println!("{p}out_n m={mm}: worst error {worst:.4} of the bound");
        }
    }
}

#[test]
fn gather_matmul_matches_mlx_float32() {
    let g = Goldens::load();
    let (experts, rows, cols, x_rows) = (5, 24, 256, 7);
    for (bits, gs) in [(4, 64), (8, 64)] {
        let spec = QuantSpec::new(bits, gs).unwrap();
        let p = format!("gq{bits}_g{gs}.");
        let q = Q::load(&g, &p);
        let e = QExperts::new(&q.packed, &q.scales, &q.biases, experts, rows, cols, spec).unwrap();
        let x = g.f32(&format!("{p}x"));
        let pairs_flat = g.u32(&format!("{p}pairs"));
        let pairs: Vec<(usize, usize)> = pairs_flat
            .chunks_exact(2)
            .map(|c| (c[0] as usize, c[1] as usize))
            .collect();
        let want = g.f32(&format!("{p}out"));
        let mut got = vec![0.0f32; pairs.len() * rows];
        dg_quant::gather_matmul_t(&x, x_rows, &e, &pairs, &mut got).unwrap();
        let mats: HashMap<usize, QMatrix> =
            (0..experts).map(|i| (i, e.expert(i).unwrap())).collect();
        let worst = check_close(&format!("{p}out"), &got, &want, cols, |i| {
            let (xr, ex) = pairs[i / rows];
            magnitude_t(&x[xr * cols..(xr + 1) * cols], &mats[&ex], i % rows)
        });
        println!("{p}gather: worst error {worst:.4} of the bound");
    }
}
