use half::bf16;
use rand::{Rng, SeedableRng};

use super::*;
use crate::kernels::{dot_row_mlx, unpack, Scalar};
use crate::{Level, QuantSpec, Quantized};

fn random_q(rng: &mut impl Rng, rows: usize, cols: usize, spec: QuantSpec) -> Quantized {
    let w: Vec<f32> = (0..rows * cols)
        .map(|_| rng.gen_range(-0.1f32..0.1))
        .collect();
    crate::quantize(&w, rows, cols, spec).unwrap()
}

/// MLX's own formula (sequential f32 sum of x * dequantized w) and the error bound of
/// tests/goldens.rs for one output.
fn reference_t(x: &[f32], w: &QMatrix, r: usize) -> (f32, f32) {
    let row = w.row(r);
    let (words, s, b) = (row.words, row.scales, row.biases);
    let want = dot_row_mlx(x, row);
    let g = w.spec.group_size;
    let mag: f64 = x
        .iter()
        .enumerate()
        .map(|(k, xv)| {
            let q = unpack(words, k, w.spec.bits) as f64;
            (*xv as f64).abs()
                * ((s[k / g].to_f32() as f64).abs() * q + (b[k / g].to_f32() as f64).abs())
        })
        .sum();
    (
        want,
        (2.0 * (x.len() as f64 + 8.0) * mag / (1u64 << 24) as f64) as f32,
    )
}

fn pool(n: usize) -> rayon::ThreadPool {
    crate::pool::build(Some(n)).unwrap()
}

#[test]
fn matmul_t_every_path_matches_the_mlx_formula() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for (bits, g) in [
        (4, 64),
        (8, 64),
        (4, 32),
        (8, 128),
        (3, 64),
        (6, 32),
        (2, 128),
        (5, 64),
    ] {
        let spec = QuantSpec::new(bits, g).unwrap();
        // 131 rows: not a multiple of 6, 8, 48 or 64; 640 columns: 2.5 tiled chunks.
        let (rows, cols) = (131, 640);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        for m in [1usize, 2, 3, 4, 8, 9, 17, 48, 49, 70] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let outs = every_kernel(|k| {
                let mut out = vec![0.0f32; m * rows];
                pool(2)
                    .install(|| product_on(Product::XWt, k, &x, m, &w, &mut out))
                    .unwrap();
                out
            });
            for i in 0..m {
                for r in 0..rows {
                    let (want, tol) = reference_t(&x[i * cols..(i + 1) * cols], &w, r);
                    for (k, out) in &outs {
                        let got = out[i * rows + r];
                        assert!(
                            (got - want).abs() <= tol,
                            "{k}: {bits}b g{g} m={m} ({i}, {r}): {got} vs {want} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_every_path_matches_the_mlx_formula() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    for (bits, g) in [(4, 64), (8, 32), (3, 128)] {
        let spec = QuantSpec::new(bits, g).unwrap();
        // 300 rows (reduction axis): one full 256-row depth step and a partial one;
        // 384 columns: a full and a partial 256-column panel.
        let (rows, cols) = (300, 384);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        let mut deq = vec![0.0f32; rows * cols];
        crate::dequantize(&w, &mut deq).unwrap();
        for m in [1usize, 3, 5, 9, 20, 60] {
            let x: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let outs = every_kernel(|k| {
                let mut out = vec![0.0f32; m * cols];
                pool(2)
                    .install(|| product_on(Product::XW, k, &x, m, &w, &mut out))
                    .unwrap();
                out
            });
            for i in 0..m {
                for c in 0..cols {
                    let (mut want, mut mag) = (0.0f32, 0.0f64);
                    for r in 0..rows {
                        want += x[i * rows + r] * deq[r * cols + c];
                        mag += (x[i * rows + r] as f64 * deq[r * cols + c] as f64).abs();
                    }
                    let tol = (2.0 * (rows as f64 + 8.0) * mag / (1u64 << 24) as f64) as f32;
                    for (k, out) in &outs {
                        let got = out[i * cols + c];
                        assert!(
                            (got - want).abs() <= tol,
                            "{k}: {bits}b m={m} ({i}, {c}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_reduction_chunks_match_the_formula_and_any_thread_count() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let spec = QuantSpec::new(4, 64).unwrap();
    // Two reduction chunks (the second partial); a full and a partial column block.
    let (m, rows, cols) = (7, xw::REDUCE_ROWS + 300, xw::BLOCK_COLS + 64);
    let q = random_q(&mut rng, rows, cols, spec);
    let w = q.view(rows, cols, spec).unwrap();
    let mut deq = vec![0.0f32; rows * cols];
    crate::dequantize(&w, &mut deq).unwrap();
    let x: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let run = |threads: usize| {
        let mut out = vec![0.0f32; m * cols];
        pool(threads)
            .install(|| matmul(&x, m, &w, &mut out))
            .unwrap();
        out
    };
    let out = run(2);
    assert!(
        run(1) == out && run(3) == out,
        "results depend on the thread count"
    );
    for i in 0..m {
        let xi = &x[i * rows..(i + 1) * rows];
        for c in 0..cols {
            let (mut want, mut mag) = (0.0f64, 0.0f64);
            for (r, &xv) in xi.iter().enumerate() {
                let t = xv as f64 * deq[r * cols + c] as f64;
                want += t;
                mag += t.abs();
            }
            // f32 sums of `rows` products (plus the chunk sums): a few ulps of the magnitude
            // per step, far below any indexing error.
            let tol = 2.0 * (rows as f64 + 8.0) * mag / (1u64 << 24) as f64;
            let got = out[i * cols + c] as f64;
            assert!((got - want).abs() <= tol, "({i}, {c}): {got} vs {want}");
        }
    }
}

#[test]
fn gather_matches_per_pair_products() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let spec = QuantSpec::new(4, 64).unwrap();
    let (experts, rows, cols, x_rows) = (6usize, 70usize, 256usize, 60usize);
    let q = random_q(&mut rng, experts * rows, cols, spec);
    let e = QExperts::new(&q.packed, &q.scales, &q.biases, experts, rows, cols, spec).unwrap();
    let x: Vec<f32> = (0..x_rows * cols)
        .map(|_| rng.gen_range(-1.0..1.0))
        .collect();
    // Pairs per expert: 0: 1, 1: 12, 2: 55, 3: 0, 4: 2, 5: 9.
    let mut pairs = vec![(5usize, 0usize)];
    pairs.extend((0..12).map(|i| (i * 3 % x_rows, 1)));
    pairs.extend((0..55).map(|i| (i, 2)));
    pairs.extend([(7, 4), (7, 4)]);
    pairs.extend((0..9).map(|i| (59 - i, 5)));
    // Shuffle so that the grouping by expert is exercised.
    for i in (1..pairs.len()).rev() {
        let j = rng.gen_range(0..=i);
        pairs.swap(i, j);
    }
    let mut out = vec![0.0f32; pairs.len() * rows];
    pool(2)
        .install(|| gather_matmul_t(&x, x_rows, &e, &pairs, &mut out))
        .unwrap();
    for (p, &(xr, ex)) in pairs.iter().enumerate() {
        let w = e.expert(ex).unwrap();
        for r in 0..rows {
            let (want, tol) = reference_t(&x[xr * cols..(xr + 1) * cols], &w, r);
            let got = out[p * rows + r];
            assert!(
                (got - want).abs() <= tol,
                "pair {p} ({xr}, {ex}) row {r}: {got} vs {want}"
            );
        }
    }
    let bad = [(0usize, 6usize)];
    let err = gather_matmul_t(&x, x_rows, &e, &bad, &mut out[..rows]).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::PairOutOfRange {
                pair: 0,
                expert: 6,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn passes_over_row_blocks_match_the_formula_and_single_passes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    // One row more than a block of x: two passes of the unpacked panels.
    let (rows, cols) = (40usize, 2048usize);
    let m = unpacked::x_block_bytes() / (cols * 4) + 1;
    assert_eq!((m * cols * 4).div_ceil(unpacked::x_block_bytes()), 2);
    let passes: Vec<(usize, usize)> = unpacked::even_blocks(m, 2).collect();
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 64).unwrap();
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        // Every plan of this CPU, and the unpacked panels on the scalar twins.
        let mut runs: Vec<(String, Strategy)> = Kernels::available()
            .into_iter()
            .map(|k| {
                let plan = Plan::for_weights(Product::XWt, spec, k);
                (plan.to_string(), Strategy::Plan(plan))
            })
            .collect();
        runs.push(("unpacked panels (scalar)".into(), Strategy::ScalarPanels));
        for (name, run) in runs {
            let mut out = vec![0.0f32; m * rows];
            pool(2).install(|| run.run(&x, m, &w, &mut out));
            for i in (0..m).step_by(8) {
                for r in 0..rows {
                    let (want, tol) = reference_t(&x[i * cols..(i + 1) * cols], &w, r);
                    assert!(
                        (out[i * rows + r] - want).abs() <= tol,
                        "{name}: {bits}b ({i}, {r})"
                    );
                }
            }
            // The rows of each pass computed as one smaller product (a single pass) give
            // the same bits.
            for &(i0, mb) in &passes {
                let mut part = vec![0.0f32; mb * rows];
                pool(1).install(|| run.run(&x[i0 * cols..(i0 + mb) * cols], mb, &w, &mut part));
                for (j, (a, b)) in part.iter().zip(&out[i0 * rows..]).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{name}: {bits}b pass at {i0}, element {j}"
                    );
                }
            }
        }
    }
}

/// What a test runs: a plan, or the unpacked panels on the scalar twins (which no plan
/// chooses).
#[derive(Clone, Copy)]
enum Strategy {
    Plan(Plan),
    ScalarPanels,
}

impl Strategy {
    fn run(self, x: &[f32], m: usize, w: &QMatrix, out: &mut [f32]) {
        match self {
            Strategy::Plan(plan) => plan.run(x, m, w, out, true),
            Strategy::ScalarPanels => {
                unpacked::matmul_t(Scalar, super::Rows::all(x, w.cols), m, w, out, true)
            }
        }
    }
}

/// `f` on every kernel this CPU offers, with the kernel.
fn every_kernel<T>(mut f: impl FnMut(Kernels) -> T) -> Vec<(Kernels, T)> {
    Kernels::available()
        .into_iter()
        .map(|k| (k, f(k)))
        .collect()
}

#[test]
fn every_kernel_runs_its_plans_as_the_scalar_kernels_do() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    for (bits, g) in [(4, 64), (8, 32), (3, 64), (2, 128)] {
        let spec = QuantSpec::new(bits, g).unwrap();
        let (rows, cols) = (70, 384);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        for m in [1usize, 7, 16, 30] {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let xn: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-2.0..2.0)).collect();
            for k in Kernels::available() {
                // x @ W^T: the same strategy on the scalar kernels gives the same bits.
                let plan = Plan::for_weights(Product::XWt, spec, k);
                let twin = match plan {
                    #[cfg(target_arch = "x86_64")]
                    Plan::UnpackedPanels(_) => Strategy::ScalarPanels,
                    _ => Strategy::Plan(Plan::DequantTiles(Kernels::Scalar(Scalar))),
                };
                let (mut got, mut want) = (vec![0.0f32; m * rows], vec![0.0f32; m * rows]);
                Strategy::Plan(plan).run(&x, m, &w, &mut got);
                twin.run(&x, m, &w, &mut want);
                assert!(got == want, "{plan}: {bits}b m={m}");
                // x @ W: one strategy, bit-identical on every kernel.
                let plan = Plan::for_weights(Product::XW, spec, k);
                let (mut got, mut want) = (vec![0.0f32; m * cols], vec![0.0f32; m * cols]);
                plan.run(&xn, m, &w, &mut got, true);
                Plan::DequantStrips(Kernels::Scalar(Scalar)).run(&xn, m, &w, &mut want, true);
                assert!(got == want, "{plan}: {bits}b m={m}");
            }
        }
    }
}

#[test]
fn plans_follow_the_format_and_the_kernels() {
    for bits in [2, 3, 4, 5, 6, 8] {
        let spec = QuantSpec::new(bits, 64).unwrap();
        for k in Kernels::available() {
            let t = Plan::for_weights(Product::XWt, spec, k);
            let n = Plan::for_weights(Product::XW, spec, k);
            assert_eq!((t.product(), n.product()), (Product::XWt, Product::XW));
            assert_eq!(n, Plan::DequantStrips(k));
            let unpacked = k.level() == Level::Avx512 && matches!(bits, 4 | 8);
            if unpacked {
                assert_eq!(t.kernels(), k, "{t}");
                assert!(t.to_string().starts_with("x @ W^T, unpacked panels"), "{t}");
            } else {
                assert_eq!(
                    t,
                    Plan::DequantTiles(k.without_avx512()),
                    "{bits} bits on {k}"
                );
                assert!(
                    t.to_string().starts_with("x @ W^T, dequantized tiles"),
                    "{t}"
                );
            }
        }
    }
    // What the real model runs on this CPU (4-bit weights), printed with --nocapture.
    let spec = QuantSpec::new(4, 64).unwrap();
    let q = crate::quantize(&[0.5; 128], 2, 64, spec).unwrap();
    let w = q.view(2, 64, spec).unwrap();
    let best = Kernels::best();
    assert_eq!(
        w.plan(Product::XWt),
        Plan::for_weights(Product::XWt, spec, best)
    );
    assert_eq!(w.plan(Product::XW), Plan::DequantStrips(best));
    eprintln!("{}; {}", w.plan(Product::XWt), w.plan(Product::XW));
    assert_eq!(
        Plan::for_weights(Product::XW, spec, Kernels::Scalar(Scalar)).to_string(),
        "x @ W, dequantized strips (scalar)"
    );
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    let spec = QuantSpec::new(4, 64).unwrap();
    let (rows, cols) = (200, 512);
    let q = random_q(&mut rng, rows, cols, spec);
    let w = q.view(rows, cols, spec).unwrap();
    let e = QExperts::new(&q.packed, &q.scales, &q.biases, 4, rows / 4, cols, spec).unwrap();
    for m in [1usize, 5, 20, 100] {
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let xn: Vec<f32> = (0..m * rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let pairs: Vec<(usize, usize)> = (0..m * 3).map(|i| (i % m, (i * 7) % 4)).collect();
        let run = |kern: Kernels, threads: usize| {
            pool(threads).install(|| {
                let mut a = vec![0.0f32; m * rows];
                product_on(Product::XWt, kern, &x, m, &w, &mut a).unwrap();
                let mut b = vec![0.0f32; m * cols];
                product_on(Product::XW, kern, &xn, m, &w, &mut b).unwrap();
                let mut c = vec![0.0f32; pairs.len() * (rows / 4)];
                gather_matmul_t_on(kern, &x, m, &e, &pairs, &mut c).unwrap();
                let mut d = vec![0.0f32; m * rows];
                let wd: Vec<f32> = (0..rows * cols).map(|i| (i % 13) as f32 * 0.01).collect();
                matmul_f32(&x, &wd, m, cols, rows, true, &mut d).unwrap();
                (a, b, c, d)
            })
        };
        for kern in Kernels::available() {
            let one = run(kern, 1);
            for threads in [2, 3, 5] {
                assert!(
                    run(kern, threads) == one,
                    "{kern}: m={m}: {threads} threads differ from 1"
                );
            }
        }
    }
}

/// Pairs sorted by expert (as the MoE layer passes them) have each expert's outputs written
/// as one block, its x rows read in place where consecutive: each pair still gets the bits it
/// gets alone.
#[test]
fn pairs_sorted_by_expert_get_each_pairs_bits() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let spec = QuantSpec::new(4, 64).unwrap();
    let (rows, cols, experts, m) = (96, 640, 4, 13);
    let n = rows / experts;
    let q = random_q(&mut rng, rows, cols, spec);
    let e = QExperts::new(&q.packed, &q.scales, &q.biases, experts, n, cols, spec).unwrap();
    let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
    // Expert 1 gets no pair.
    let expert = |i: usize| match i {
        0..5 => 0,
        5..9 => 2,
        _ => 3,
    };
    let scattered: Vec<(usize, usize)> = (0..m).map(|i| ((i * 5) % m, expert(i))).collect();
    let consecutive: Vec<(usize, usize)> = (0..m).map(|i| (i, expert(i))).collect();
    for kern in Kernels::available() {
        for pairs in [&scattered, &consecutive] {
            let mut got = vec![f32::NAN; m * n];
            gather_matmul_t_on(kern, &x, m, &e, pairs, &mut got).unwrap();
            for (p, &(r, ex)) in pairs.iter().enumerate() {
                let mut one = vec![0.0f32; n];
                let xr = &x[r * cols..(r + 1) * cols];
                gather_matmul_t_on(kern, xr, 1, &e, &[(0, ex)], &mut one).unwrap();
                assert!(
                    one == got[p * n..(p + 1) * n],
                    "{kern}: pair {p} of {pairs:?}"
                );
            }
        }
    }
}

/// A row's result must not depend on the rows computed with it: batched sequences get
/// the bits they get alone (and so the tokens).
#[test]
fn each_row_is_computed_as_it_is_alone() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(16);
    for bits in [4, 8] {
        let spec = QuantSpec::new(bits, 64).unwrap();
        let (rows, cols) = (96, 640);
        let q = random_q(&mut rng, rows, cols, spec);
        let w = q.view(rows, cols, spec).unwrap();
        let e = QExperts::new(&q.packed, &q.scales, &q.biases, 4, rows / 4, cols, spec).unwrap();
        let big = random_q(&mut rng, 40000, 64, spec);
        let wide = big.view(40000, 64, spec).unwrap();
        for (kern, m) in Kernels::available()
            .into_iter()
            .flat_map(|k| [2usize, 3, 4, 5, 9, 13, 49, 97].map(|m| (k, m)))
        {
            let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut all = vec![0.0f32; m * rows];
            product_on(Product::XWt, kern, &x, m, &w, &mut all).unwrap();
            let pairs: Vec<(usize, usize)> = (0..m).map(|i| (i, i % 2)).collect();
            let mut gathered = vec![0.0f32; m * (rows / 4)];
            gather_matmul_t_on(kern, &x, m, &e, &pairs, &mut gathered).unwrap();
            let xn: Vec<f32> = (0..m * 40000).map(|_| rng.gen_range(0.0..1e-4)).collect();
            let mut xw = vec![0.0f32; m * 64];
            product_on(Product::XW, kern, &xn, m, &wide, &mut xw).unwrap();
            for i in 0..m {
                let xi = &x[i * cols..(i + 1) * cols];
                let mut one = vec![0.0f32; rows];
                product_on(Product::XWt, kern, xi, 1, &w, &mut one).unwrap();
                assert!(
                    one == all[i * rows..(i + 1) * rows],
                    "{kern}: x @ W^T, {bits} bits, row {i} of {m}"
                );
                let mut g = vec![0.0f32; rows / 4];
                gather_matmul_t_on(kern, xi, 1, &e, &[(0, i % 2)], &mut g).unwrap();
                let n = rows / 4;
                assert!(
                    g == gathered[i * n..(i + 1) * n],
                    "{kern}: experts, {bits} bits, row {i} of {m}"
                );
                let mut o = vec![0.0f32; 64];
                product_on(
                    Product::XW,
                    kern,
                    &xn[i * 40000..(i + 1) * 40000],
                    1,
                    &wide,
                    &mut o,
                )
                .unwrap();
                assert!(
                    o == xw[i * 64..(i + 1) * 64],
                    "{kern}: x @ W, {bits} bits, row {i} of {m}"
                );
            }
        }
    }
}

#[test]
fn matmul_f32_matches_naive() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(15);
    let (m, k, n) = (7, 33, 19);
    let a: Vec<f32> = (0..m * k).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let b: Vec<f32> = (0..k * n).map(|_| rng.gen_range(-1.0..1.0)).collect();
    for transposed in [false, true] {
        let mut out = vec![0.0f32; m * n];
        matmul_f32(&a, &b, m, k, n, transposed, &mut out).unwrap();
        for i in 0..m {
            for j in 0..n {
                let want: f32 = (0..k)
                    .map(|kk| {
                        a[i * k + kk]
                            * if transposed {
                                b[j * k + kk]
                            } else {
                                b[kk * n + j]
                            }
                    })
                    .sum();
                assert!((out[i * n + j] - want).abs() <= 1e-5, "({i}, {j})");
            }
        }
    }
    let err = matmul_f32(&a, &b, m, k, n + 1, false, &mut vec![0.0; m * (n + 1)]).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::Length {
                what: "matmul_f32 rhs",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let spec = QuantSpec::new(4, 64).unwrap();
    let q = crate::quantize(&vec![0.5f32; 4 * 128], 4, 128, spec).unwrap();
    assert!(matches!(
        QMatrix::new(&q.packed, &q.scales, &q.biases, 4, 96, spec),
        Err(QuantError::Width { .. })
    ));
    assert!(matches!(
        QMatrix::new(&q.packed[1..], &q.scales, &q.biases, 4, 128, spec),
        Err(QuantError::Length { .. })
    ));
    let scales_short: Vec<bf16> = q.scales[1..].to_vec();
    assert!(QMatrix::new(&q.packed, &scales_short, &q.biases, 4, 128, spec).is_err());
    let w = q.view(4, 128, spec).unwrap();
    assert!(matmul_t(&[0.0; 127], 1, &w, &mut [0.0; 4]).is_err());
    assert!(matmul_t(&[0.0; 128], 1, &w, &mut [0.0; 5]).is_err());
    assert!(matmul(&[0.0; 3], 1, &w, &mut [0.0; 128]).is_err());
    let err = crate::embedding(&w, &[4], &mut [0.0; 128]).unwrap_err();
    assert!(
        matches!(err, QuantError::IdOutOfRange { id: 4, rows: 4 }),
        "{err}"
    );
    assert!(err.to_string().contains("token id 4"));
    assert!(crate::quantize(&[f32::NAN; 64], 1, 64, spec).is_err());
    assert!(QuantSpec::new(7, 64).is_err() && QuantSpec::new(4, 16).is_err());
    let e = QExperts::new(&q.packed, &q.scales, &q.biases, 2, 2, 128, spec).unwrap();
    assert!(matches!(
        e.expert(2),
        Err(QuantError::ExpertOutOfRange {
            expert: 2,
            experts: 2
        })
    ));
}

/// `x @ W^T` with bf16 weights widened a panel at a time: every output is one fma chain in `k`
/// order (so neither the passes over `x`, the 32-row panels nor the 128-column chunks show),
/// on the scalar twins and on AVX-512 where present.
#[test]
fn bf16_products_are_one_fma_chain_per_element() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    // 45 and 33 rows: partial panels; 200 and 72 columns: partial chunks; 2700 x 200 rows of x:
    // more than one pass over the weights.
    for (m, rows, cols) in [(1, 45, 200), (13, 64, 72), (2700, 33, 200)] {
        let x: Vec<f32> = (0..m * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let w: Vec<bf16> = (0..rows * cols)
            .map(|_| bf16::from_f32(rng.gen_range(-0.5..0.5)))
            .collect();
        let want: Vec<f32> = (0..m * rows)
            .map(|o| {
                let (xr, wr) = (&x[o / rows * cols..], &w[o % rows * cols..]);
                (0..cols).fold(0.0f32, |acc, k| xr[k].mul_add(wr[k].to_f32(), acc))
            })
            .collect();
        let mut got = vec![f32::NAN; m * rows];
        widened::matmul_t(Scalar, &x, m, &w, (rows, cols), &mut got, true);
        assert!(got == want, "scalar twin, {m} x {rows} x {cols}");
        if let Kernels::Avx512(k) = Kernels::best() {
            got.fill(f32::NAN);
            pool(2).install(|| widened::matmul_t(k, &x, m, &w, (rows, cols), &mut got, true));
            assert!(got == want, "AVX-512, {m} x {rows} x {cols}");
        }
        // The public product (any kernel) agrees to rounding.
        got.fill(f32::NAN);
        matmul_bf16_t(&x, m, &w, (rows, cols), &mut got).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
        }
    }
    let err = matmul_bf16_t(&[0.0; 3], 1, &[bf16::ZERO; 4], (2, 2), &mut [0.0; 2]).unwrap_err();
    assert!(err.to_string().contains("matmul_bf16_t input x"), "{err}");
}
