//! An MLX-compatible random generator: bit-identical to `mlx.core.random` 0.32.4 on the CPU.
//!
//! [`Rng`] owns what MLX keeps in a hidden per-thread global (`mx.random.state`): one key. Each
//! call that draws from the global key first advances it exactly as MLX's `KeySequence::next`
//! does, so the same seed and the same sequence of calls give the same numbers as the
//! reference. The engine creates one `Rng` per request and draws from it in order (one large
//! draw may run on several threads: each word depends only on its index).
//!
//! How MLX computes each piece (`mlx/random.cpp`, `python/src/random.cpp`,
//! `mlx/backend/cpu/threefry.cpp`, `RandomBits::eval_cpu` in `mlx/backend/cpu/primitives.cpp`),
//! with the quirks this module reproduces:
//!
//! - **Keys.** `key(seed) = [seed >> 32, seed & 0xffffffff]` (u32). `mx.random.seed(s)` sets the
//!   global key to `key(s)`; before any seed, Python uses the wall-clock time in ms. The Python
//!   global key is **thread-local**: a seed set on one thread does not affect another.
//! - **Global draws.** Every sampling function called without `key=` takes
//!   `(state, sub) = split(state)` and samples with `sub` (`KeySequence::next`): the new state
//!   is row 0 of the split, the key used is row 1.
//! - **`split(key, n)`** is `bits((n, 2), key)` viewed as n keys.
//! - **`bits(shape, key)`** fills `N = prod(shape)` u32 words with threefry2x32 (20 rounds,
//!   JAX/Random123-compatible) in a peculiar layout: with `h = N / 2`, `o = N % 2`, counter
//!   pair `(i, h + o + i)` for `i < h` writes words `i` and `h + o + i`; for odd `N` the middle
//!   word `h` is the first output of counter `(h, 0)`. So the words of one call are not the
//!   hash of `(0, 1), (2, 3), ...`, and an array's values change with its total size.
//!   Counters are truncated to u32.
//! - **`uniform`** (f32, `[0, 1)`): `min(f32(bits) / f32(u32::MAX), 0.99999994)`. `f32(u32::MAX)`
//!   rounds to `2**32`, so this is `f32(bits) * 2**-32` after rounding the u32 to f32 (24 bits:
//!   the low 8 bits of large words are lost), clamped below 1 (words >= 2**32 - 128 round
//!   to 1.0). With bounds: `u * (f32(high) - f32(low)) + f32(low)`, two f32 roundings.
//! - **`randint(low, high)`** (int32): `floor(uniform(f32(low), f32(high)))` cast to int32, then
//!   clamped to `[low, high - 1]`. No rejection sampling: for ranges that are not a power of
//!   two it is slightly biased (24-bit uniforms times the range, floored), and above `2**24`
//!   not every integer is reachable.
//! - **`gumbel`**: `-log(-log(uniform))` with the platform `logf`; a zero word gives `-inf`.
//! - **`categorical(logits)`** over the last axis, default shape: the Gumbel-max trick,
//!   `argmax(gumbel(logits.shape) + logits)` (first index on ties), **except** when the logits
//!   hold a single distribution and have 2 or more dimensions (e.g. shape `(1, 1, V)`): MLX
//!   then samples by inverse CDF, `searchsorted_right(exclusive_cumsum(w), uniform() *
//!   sum(w)) - 1` with `w = exp(x - max)` (MLX's fast exp), or `w = (x == max)` when the max is
//!   infinite. The two paths give different samples for the same key. A 1-D `(V,)` input
//!   uses the Gumbel path. dg's Gumbel path hashes only the words of entries that can still
//!   win ([`categorical_scaled_with_key`]): the same sample, without the noise array.

use rayon::prelude::*;

use crate::error::{EngineError, Result};
use crate::mlx_math;

/// A threefry key: two u32 words, as MLX's `uint32[2]` key arrays.
pub type Key = [u32; 2];

/// `mx.random.key(seed)`: `[seed >> 32, seed as u32]`.
pub fn key(seed: u64) -> Key {
    [(seed >> 32) as u32, seed as u32]
}

/// The threefry2x32 hash with 20 rounds (`mlx/backend/cpu/threefry.cpp`).
pub fn threefry2x32(key: Key, count: [u32; 2]) -> [u32; 2] {
    let ([x0], [x1]) = threefry2x32_lanes(key, [count[0]], [count[1]]);
    [x0, x1]
}

/// Fills `out` as `mx.random.bits(shape, key=key)` does for `prod(shape) == out.len()` words
/// (width 4), in MLX's counter layout (see the module docs).
pub fn fill_bits(key: Key, out: &mut [u32]) {
    update_with_bits(key, out, |words, o| o.copy_from_slice(words));
}

/// Counter pairs hashed together in [`update_with_bits`].
const LANES: usize = 8;

/// [`threefry2x32`] of `L` counter pairs, `(first words, second words)`: arrays of lanes,
/// which the compiler keeps in vector registers.
#[inline]
fn threefry2x32_lanes<const L: usize>(
    key: Key,
    c0: [u32; L],
    c1: [u32; L],
) -> ([u32; L], [u32; L]) {
    const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
    let ks = [key[0], key[1], key[0] ^ key[1] ^ 0x1BD1_1BDA];
    let mut x0 = c0.map(|c| c.wrapping_add(ks[0]));
    let mut x1 = c1.map(|c| c.wrapping_add(ks[1]));
    for i in 0..5 {
        for &r in &ROTATIONS[i % 2] {
            for l in 0..L {
                x0[l] = x0[l].wrapping_add(x1[l]);
                x1[l] = x1[l].rotate_left(r) ^ x0[l];
            }
        }
        for l in 0..L {
            x0[l] = x0[l].wrapping_add(ks[(i + 1) % 3]);
            x1[l] = x1[l]
                .wrapping_add(ks[(i + 2) % 3])
                .wrapping_add(i as u32 + 1);
        }
    }
    (x0, x1)
}

/// Words per task of [`update_with_bits`] (each task takes two runs of this many; a
/// multiple of `LANES`).
const BITS_CHUNK: usize = 4096;

/// The words of counter pairs `(first + j, second + first + j)`: their first outputs into
/// `a`, their second outputs into `b` (`b` no longer than `a`).
fn hash_pairs(key: Key, first: usize, second: usize, a: &mut [u32], b: &mut [u32]) {
    for (l, wa) in a.chunks_mut(LANES).enumerate() {
        let i = first + l * LANES;
        let c0 = std::array::from_fn(|j| (i + j) as u32);
        let c1 = std::array::from_fn(|j| (second + i + j) as u32);
        let (x0, x1) = threefry2x32_lanes::<LANES>(key, c0, c1);
        wa.copy_from_slice(&x0[..wa.len()]);
        let lb = b.len().saturating_sub(l * LANES).min(LANES);
        b[l * LANES..l * LANES + lb].copy_from_slice(&x1[..lb]);
    }
}

/// Calls `f(words, values)` on runs of `values`, `words` holding the words of
/// `bits(values.len(), key)` at the same positions: with `h = n / 2` and `o = n % 2`, counter
/// pair `(i, h + o + i)` gives words `i` and `h + o + i`, and for odd `n` the first output of
/// `(h, 0)` is word `h`. Each word depends only on its index, so the runs go in parallel on
/// the current rayon pool (a canvas draw is 67M words).
fn update_with_bits<T: Send>(key: Key, values: &mut [T], f: impl Fn(&[u32], &mut [T]) + Sync) {
    let n = values.len();
    let (half, odd) = (n / 2, n % 2);
    let (first, second) = values.split_at_mut(half + odd);
    if odd == 1 {
        f(
            &[threefry2x32(key, [half as u32, 0])[0]],
            &mut first[half..],
        );
    }
    let run = |(c, (a, b)): (usize, (&mut [T], &mut [T]))| {
        let (mut wa, mut wb) = ([0u32; BITS_CHUNK], [0u32; BITS_CHUNK]);
        hash_pairs(
            key,
            c * BITS_CHUNK,
            half + odd,
            &mut wa[..a.len()],
            &mut wb[..b.len()],
        );
        f(&wa[..a.len()], a);
        f(&wb[..b.len()], b);
    };
    let (first, second) = (&mut first[..half], second);
    if half <= BITS_CHUNK {
        // One run: on this thread (small draws such as key splits never wake a pool).
        run((0, (first, second)));
    } else {
        first
            .par_chunks_mut(BITS_CHUNK)
            .zip(second.par_chunks_mut(BITS_CHUNK))
            .enumerate()
            .for_each(run);
    }
}

/// `mx.random.split(key, num)`: `num` sub-keys, the rows of `bits((num, 2), key)`.
pub fn split_n(key: Key, num: usize) -> Result<Vec<Key>> {
    let words = num
        .checked_mul(2)
        .ok_or_else(|| EngineError::InvalidArgument {
            name: "num",
            reason: format!("{num} sub-keys overflow usize"),
        })?;
    let mut bits = alloc_words(words, "num")?;
    fill_bits(key, &mut bits);
    Ok(bits.chunks_exact(2).map(|c| [c[0], c[1]]).collect())
}

/// `mx.random.split(key)` as the C++ `split(key)` pair: `(row 0, row 1)`.
pub fn split(key: Key) -> (Key, Key) {
    let mut bits = [0u32; 4];
    fill_bits(key, &mut bits);
    ([bits[0], bits[1]], [bits[2], bits[3]])
}

/// One u32 word mapped to MLX's f32 uniform in `[0, 1)`: `min(f32(word) / 2**32, 1 - 2**-24)`.
#[inline]
pub fn uniform_from_bits(word: u32) -> f32 {
    // `divide(bits, float32(UINT32_MAX))`: both operands become f32, and f32(UINT32_MAX) is
    // exactly 2**32, so the division is exact after the u32 -> f32 rounding.
    const BELOW_ONE: f32 = 0.999_999_94; // nextafter(1.0f, 0.0f)
    let u = (word as f32) / 4_294_967_296.0;
    if u < BELOW_ONE {
        u
    } else {
        BELOW_ONE
    }
}

/// MLX's float -> int32 cast on x86-64 (`cvttss2si`): truncation, and `i32::MIN` for NaN and
/// out-of-range values (where Rust's `as` would saturate).
#[inline]
fn f32_to_i32_x86(x: f32) -> i32 {
    // NaN is outside every range too.
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&x) {
        i32::MIN
    } else {
        x as i32
    }
}

/// `mx.random.bits(shape, key=key)` (u32 words).
pub fn bits_with_key(key: Key, shape: &[usize]) -> Result<Vec<u32>> {
    let mut out = alloc_words(numel(shape, "shape")?, "shape")?;
    fill_bits(key, &mut out);
    Ok(out)
}

/// `mx.random.uniform(shape=shape, key=key)`: f32 in `[0, 1)`.
pub fn uniform_with_key(key: Key, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(bits_with_key(key, shape)?
        .into_iter()
        .map(uniform_from_bits)
        .collect())
}

/// `mx.random.uniform(low, high, shape, key=key)` with f32 bounds:
/// `u * (high - low) + low`, each operation rounded to f32.
pub fn uniform_range_with_key(key: Key, low: f32, high: f32, shape: &[usize]) -> Result<Vec<f32>> {
    let range = high - low;
    Ok(bits_with_key(key, shape)?
        .into_iter()
        .map(|b| range * uniform_from_bits(b) + low)
        .collect())
}

/// `mx.random.randint(low, high, shape, key=key)` (int32 output, int32 bounds).
///
/// MLX does not reject `low >= high`: every value is then `low`. The same holds here.
pub fn randint_with_key(key: Key, low: i32, high: i32, shape: &[usize]) -> Result<Vec<i32>> {
    let hi = high.wrapping_sub(1);
    Ok(uniform_range_with_key(key, low as f32, high as f32, shape)?
        .into_iter()
        .map(|u| f32_to_i32_x86(u.floor()).min(hi).max(low))
        .collect())
}

/// `mx.random.gumbel(shape, key=key)`: `-log(-log(uniform))` in f32.
pub fn gumbel_with_key(key: Key, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(uniform_with_key(key, shape)?
        .into_iter()
        .map(|u| -mlx_math::log(-mlx_math::log(u)))
        .collect())
}

/// `mx.random.categorical(logits, key=key)` over the last axis of `logits` (shape `shape`,
/// row-major), with the default `shape`/`num_samples`: one sample per row, as u32 indices.
///
/// Follows MLX's two paths (see the module docs): inverse CDF when there is exactly one row
/// and `shape` has 2 or more dimensions, Gumbel-max otherwise.
pub fn categorical_with_key(key: Key, logits: &[f32], shape: &[usize]) -> Result<Vec<u32>> {
    categorical_scaled_with_key(key, logits, shape, 1.0)
}

/// [`categorical_with_key`] of `logits / temperature` (each value divided in f32, as MLX
/// divides an array by a scalar; no division when `temperature` is 1), without writing the
/// divided logits anywhere.
///
/// The Gumbel-max path hashes only the words that can matter: every Gumbel value is at most
/// 17, so once one entry's noisy value `x_j + g_j` is known, an entry with
/// `x_i + 17 < x_j + g_j` (in f32: rounding is monotone) cannot be the argmax. The answer is
/// the reference's, with a few words hashed per row instead of the whole row when the logits
/// are peaked.
pub fn categorical_scaled_with_key(
    key: Key,
    logits: &[f32],
    shape: &[usize],
    temperature: f32,
) -> Result<Vec<u32>> {
    let (&vocab, batch) = shape.split_last().ok_or_else(|| EngineError::Shape {
        name: "shape",
        reason: "categorical needs logits with at least one dimension".into(),
    })?;
    let n = numel(shape, "shape")?;
    if logits.len() != n {
        return Err(EngineError::Shape {
            name: "logits",
            reason: format!("{} values for shape {shape:?}", logits.len()),
        });
    }
    if vocab == 0 {
        return Err(EngineError::Shape {
            name: "shape",
            reason: "categorical over an empty last axis".into(),
        });
    }
    if n == vocab && !batch.is_empty() {
        let scaled: Vec<f32> = match temperature == 1.0 {
            true => dg_quant::alloc::copied(logits, "categorical logits")?,
            false => logits.iter().map(|&x| x / temperature).collect(),
        };
        return Ok(vec![categorical_inverse_cdf(key, &scaled, batch)?]);
    }
    Ok(match temperature == 1.0 {
        true => gumbel_max_rows(key, logits, vocab, |x| x),
        false => gumbel_max_rows(key, logits, vocab, |x| x / temperature),
    })
}

/// The largest value [`gumbel_with_key`] can give, rounded up: uniforms stop at
/// `0.99999994`, whose Gumbel value is `-log(-log(0.99999994)) = 16.64`, and `-log(-log(u))`
/// grows with `u` (test `gumbel_never_exceeds_its_bound`).
const GUMBEL_BOUND: f32 = 17.0;

/// A row hashes every word (the dense pass) once more than one entry in this many could
/// still win: a word hashed alone, with its two logs, costs about 9 times one hashed in lanes
/// (docs/PERFORMANCE.md), so sparse rows stay well below the dense pass's cost.
const DENSE_ROW_SHARE: usize = 16;

/// `argmax(scale(logits) + gumbel)` per `vocab`-long row, `gumbel` the noise of one draw
/// over all of `logits`: the rows that allow it by [`sparse_gumbel_max`], the others by
/// [`dense_gumbel_max`].
fn gumbel_max_rows(
    key: Key,
    logits: &[f32],
    vocab: usize,
    scale: impl Fn(f32) -> f32 + Sync,
) -> Vec<u32> {
    let n = logits.len();
    let mut answers: Vec<Option<u32>> = logits
        .par_chunks_exact(vocab)
        .enumerate()
        .map(|(r, row)| sparse_gumbel_max(key, n, r * vocab, row, &scale))
        .collect();
    let dense: Vec<bool> = answers.iter().map(Option::is_none).collect();
    if dense.contains(&true) {
        for (r, best) in dense_gumbel_max(key, logits, vocab, &dense, &scale) {
            answers[r] = Some(best.index as u32);
        }
    }
    answers.into_iter().map(Option::unwrap_or_default).collect()
}

/// The Gumbel value of one word: `-log(-log(uniform))`.
fn gumbel_of_word(word: u32) -> f32 {
    -mlx_math::log(-mlx_math::log(uniform_from_bits(word)))
}

/// The word of `bits([n], key)` at index `k` (the layout of [`update_with_bits`]).
fn word_at(key: Key, n: usize, k: usize) -> u32 {
    let (half, odd) = (n / 2, n % 2);
    if k < half {
        threefry2x32(key, [k as u32, (half + odd + k) as u32])[0]
    } else if k < half + odd {
        threefry2x32(key, [half as u32, 0])[0]
    } else {
        let i = k - half - odd;
        threefry2x32(key, [i as u32, (half + odd + i) as u32])[1]
    }
}

/// `argmax(scale(row) + gumbel)` for the row at index `start` of an `n`-word draw, hashing
/// only the words that can win; `None` when the row needs [`dense_gumbel_max`].
///
/// With `x_j` the row's largest value, `x_j + g_j` is attained, and an entry with
/// `x_i + GUMBEL_BOUND < x_j + g_j` is below it whatever its noise (f32 rounding is
/// monotone), so only the others are hashed, in index order (the first maximum wins). Rows
/// with NaN or `+inf` (whose noisy values can be NaN), of only `-inf`, or where more than one
/// entry in [`DENSE_ROW_SHARE`] is left are refused.
fn sparse_gumbel_max(
    key: Key,
    n: usize,
    start: usize,
    row: &[f32],
    scale: impl Fn(f32) -> f32,
) -> Option<u32> {
    let (mut top, mut j, mut below_inf) = (f32::NEG_INFINITY, 0, true);
    for (i, &l) in row.iter().enumerate() {
        let x = scale(l);
        below_inf &= x <= f32::MAX;
        if x > top {
            top = x;
            j = i;
        }
    }
    if !below_inf || top == f32::NEG_INFINITY {
        return None;
    }
    let attained = top + gumbel_of_word(word_at(key, n, start + j));
    let most = row.len() / DENSE_ROW_SHARE;
    let mut candidates = Vec::new();
    for (i, &l) in row.iter().enumerate() {
        if scale(l) + GUMBEL_BOUND >= attained {
            if candidates.len() == most {
                return None;
            }
            candidates.push(i);
        }
    }
    // Every noisy value here is finite or -inf, and the largest is at least `attained`.
    let (mut best, mut index) = (f32::NEG_INFINITY, j);
    for i in candidates {
        let v = scale(row[i]) + gumbel_of_word(word_at(key, n, start + i));
        if v > best {
            best = v;
            index = i;
        }
    }
    Some(index as u32)
}

/// MLX's argmax over a part of a row: its first NaN, else its first maximum.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Best {
    value: f32,
    index: usize,
    nan: bool,
}

impl Best {
    /// [`mlx_math::argmax`] of `values`, the first of them at index `offset`.
    fn of(values: &[f32], offset: usize) -> Self {
        let i = mlx_math::argmax(values);
        let value = values.get(i).copied().unwrap_or(f32::NEG_INFINITY);
        Best {
            value,
            index: offset + i,
            nan: value.is_nan(),
        }
    }

    /// The argmax of two parts of one row, in whichever order they come.
    fn join(self, other: Self) -> Self {
        let first = if self.index <= other.index {
            self
        } else {
            other
        };
        match (self.nan, other.nan) {
            (true, true) => first,
            (true, false) => self,
            (false, true) => other,
            _ if self.value == other.value => first,
            _ if self.value > other.value => self,
            _ => other,
        }
    }
}

/// `argmax(scale(row) + gumbel)` for the rows marked in `dense`, every word of theirs hashed
/// as MLX draws them: counter pair `(i, h + o + i)` gives words `i` and `h + o + i` (see
/// [`update_with_bits`]), so a pair's two words can lie in different rows. Pairs whose words
/// all lie in other rows are skipped. Returns each marked row's argmax.
fn dense_gumbel_max(
    key: Key,
    logits: &[f32],
    vocab: usize,
    dense: &[bool],
    scale: impl Fn(f32) -> f32 + Sync,
) -> Vec<(usize, Best)> {
    let n = logits.len();
    let (half, odd) = (n / 2, n % 2);
    let needed = |s: usize, e: usize| s < e && (s / vocab..=(e - 1) / vocab).any(|r| dense[r]);
    // The row parts among the words `start..start + words.len()`, with their argmax.
    let parts = |start: usize, words: &[u32]| -> Vec<(usize, Best)> {
        let end = start + words.len();
        if !needed(start, end) {
            return Vec::new();
        }
        let mut g = [0.0f32; BITS_CHUNK];
        let g = &mut g[..words.len()];
        for (g, &w) in g.iter_mut().zip(words) {
            *g = uniform_from_bits(w);
        }
        mlx_math::log_in_place(g);
        g.iter_mut().for_each(|g| *g = -*g);
        mlx_math::log_in_place(g);
        let mut out = Vec::new();
        let mut k = start;
        while k < end {
            let r = k / vocab;
            let stop = ((r + 1) * vocab).min(end);
            if dense[r] {
                let noisy = &mut g[k - start..stop - start];
                for (v, &l) in noisy.iter_mut().zip(&logits[k..stop]) {
                    *v = scale(l) + -*v;
                }
                out.push((r, Best::of(noisy, k - r * vocab)));
            }
            k = stop;
        }
        out
    };
    let mut found: Vec<(usize, Best)> = (0..half.div_ceil(BITS_CHUNK))
        .into_par_iter()
        .flat_map_iter(|c| {
            let i = c * BITS_CHUNK;
            let len = BITS_CHUNK.min(half - i);
            let (a, b) = (i, half + odd + i);
            if !needed(a, a + len) && !needed(b, b + len) {
                return Vec::new();
            }
            let (mut wa, mut wb) = ([0u32; BITS_CHUNK], [0u32; BITS_CHUNK]);
            hash_pairs(key, i, half + odd, &mut wa[..len], &mut wb[..len]);
            let mut out = parts(a, &wa[..len]);
            out.extend(parts(b, &wb[..len]));
            out
        })
        .collect();
    if odd == 1 {
        found.extend(parts(half, &[threefry2x32(key, [half as u32, 0])[0]]));
    }
    let mut rows: Vec<(usize, Best)> = Vec::new();
    found.sort_by_key(|&(r, _)| r);
    for (r, best) in found {
        match rows.last_mut() {
            Some((last, b)) if *last == r => *b = b.join(best),
            _ => rows.push((r, best)),
        }
    }
    rows
}

/// MLX's `categorical_inverse_cdf` for one distribution; `batch` (all ones) is the shape of
/// the uniform it draws.
fn categorical_inverse_cdf(key: Key, logits: &[f32], batch: &[usize]) -> Result<u32> {
    let m = mlx_math::max(logits);
    let w: Vec<f32> = if m.is_infinite() {
        logits
            .iter()
            .map(|&x| f32::from(u8::from(x == m)))
            .collect()
    } else {
        let mut w = dg_quant::alloc::zeroed(logits.len(), "categorical weights")?;
        mlx_math::exp_shifted(logits, m, &mut w);
        w
    };
    // Exclusive cumulative sum, f32, left to right.
    let mut cdf = Vec::with_capacity(w.len());
    let mut acc = 0.0_f32;
    for &wi in &w {
        cdf.push(acc);
        acc += wi;
    }
    let total = mlx_math::sum(&w);
    let u = uniform_with_key(key, batch)?[0] * total;
    Ok(searchsorted_right(&cdf, u).wrapping_sub(1))
}

/// MLX's CPU `searchsorted(side="right")` binary search, NaN-aware as its comparator.
fn searchsorted_right(sorted: &[f32], x: f32) -> u32 {
    // nan_aware_less(a, b): NaN is never less; anything non-NaN is less than NaN.
    let less = |a: f32, b: f32| !a.is_nan() && (b.is_nan() || a < b);
    let (mut lo, mut hi) = (0usize, sorted.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if !less(x, sorted[mid]) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo as u32
}

/// The number of elements of `shape`, checked.
fn numel(shape: &[usize], name: &'static str) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| EngineError::Shape {
            name,
            reason: format!("{shape:?} has more elements than usize holds"),
        })
}

/// A zeroed word buffer, refusing sizes no allocation can hold (instead of panicking).
fn alloc_words<T: Copy + Default>(n: usize, name: &'static str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| EngineError::Shape {
        name,
        reason: format!("cannot allocate {n} random words: {e}"),
    })?;
    v.resize(n, T::default());
    Ok(v)
}

/// The random state of one request: MLX's global key, owned.
///
/// Each method mirrors the `mx.random` function of the same name called **without** `key=`:
/// it advances the state by one split and samples with the split-off key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: Key,
}

impl Rng {
    /// The state after `mx.random.seed(seed)`.
    pub fn new(seed: u64) -> Self {
        Self { state: key(seed) }
    }

    /// A generator whose global key is `state` (`mx.random.state[0]`).
    pub fn from_key(state: Key) -> Self {
        Self { state }
    }

    /// The current global key (`mx.random.state[0]`).
    pub fn state(&self) -> Key {
        self.state
    }

    /// `KeySequence::next`: splits the state, keeps row 0, returns row 1 for one draw.
    pub fn next_key(&mut self) -> Key {
        let (state, sub) = split(self.state);
        self.state = state;
        sub
    }

    /// `mx.random.bits(shape)`.
    pub fn bits(&mut self, shape: &[usize]) -> Result<Vec<u32>> {
        let k = self.next_key();
        bits_with_key(k, shape)
    }

    /// `mx.random.uniform(shape=shape)`: f32 in `[0, 1)`.
    pub fn uniform(&mut self, shape: &[usize]) -> Result<Vec<f32>> {
        let k = self.next_key();
        uniform_with_key(k, shape)
    }

    /// `mx.random.uniform(low, high, shape)` with f32 bounds.
    pub fn uniform_range(&mut self, low: f32, high: f32, shape: &[usize]) -> Result<Vec<f32>> {
        let k = self.next_key();
        uniform_range_with_key(k, low, high, shape)
    }

    /// `mx.random.randint(low, high, shape)` (int32).
    pub fn randint(&mut self, low: i32, high: i32, shape: &[usize]) -> Result<Vec<i32>> {
        let k = self.next_key();
        randint_with_key(k, low, high, shape)
    }

    /// `len` token ids `randint(0, vocab, (1, len))`, as u32 (the draw is within
    /// `[0, vocab)`, so the conversion is exact; it happens here, once, not per use).
    pub fn token_ids(&mut self, vocab: usize, len: usize) -> Result<Vec<u32>> {
        let high = i32::try_from(vocab).map_err(|_| EngineError::InvalidArgument {
            name: "vocab",
            reason: format!("{vocab} does not fit an int32 randint"),
        })?;
        Ok(self
            .randint(0, high, &[1, len])?
            .into_iter()
            .map(|t| t as u32)
            .collect())
    }

    /// `mx.random.gumbel(shape)` (f32).
    pub fn gumbel(&mut self, shape: &[usize]) -> Result<Vec<f32>> {
        let k = self.next_key();
        gumbel_with_key(k, shape)
    }

    /// `mx.random.categorical(logits)` over the last axis of `logits` shaped `shape`.
    ///
    /// The state advances even when the arguments are rejected, as in MLX (which takes the
    /// key before validating).
    pub fn categorical(&mut self, logits: &[f32], shape: &[usize]) -> Result<Vec<u32>> {
        let k = self.next_key();
        categorical_with_key(k, logits, shape)
    }

    /// [`Rng::categorical`] of `logits / temperature` (see [`categorical_scaled_with_key`]).
    pub fn categorical_scaled(
        &mut self,
        logits: &[f32],
        shape: &[usize],
        temperature: f32,
    ) -> Result<Vec<u32>> {
        let k = self.next_key();
        categorical_scaled_with_key(k, logits, shape, temperature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threefry_known_answers() {
        // Random123 known-answer vectors for threefry2x32 with 20 rounds.
        assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(
            threefry2x32([u32::MAX, u32::MAX], [u32::MAX, u32::MAX]),
            [0x1cb9_96fc, 0xbb00_2be7]
        );
        assert_eq!(
            threefry2x32([0x1319_8a2e, 0x0370_7344], [0x243f_6a88, 0x85a3_08d3]),
            [0xc492_3a9c, 0x483d_f7a0]
        );
    }

    /// `bits` as the module docs define it, one counter pair after the other.
    fn serial_bits(key: Key, n: usize) -> Vec<u32> {
        let (half, odd) = (n / 2, n % 2);
        let mut out = vec![0; n];
        for i in 0..half {
            let [a, b] = threefry2x32(key, [i as u32, (half + odd + i) as u32]);
            out[i] = a;
            out[half + odd + i] = b;
        }
        if odd == 1 {
            out[half] = threefry2x32(key, [half as u32, 0])[0];
        }
        out
    }

    #[test]
    fn parallel_bits_match_the_serial_layout() {
        let pool = dg_quant::pool::build(Some(3)).unwrap();
        for n in [
            0,
            1,
            2,
            3,
            7,
            2 * BITS_CHUNK - 1,
            2 * BITS_CHUNK + 1,
            5 * BITS_CHUNK + 3,
        ] {
            let mut got = vec![0; n];
            pool.install(|| fill_bits(key(7), &mut got));
            assert_eq!(got, serial_bits(key(7), n), "n = {n}");
        }
    }

    #[test]
    fn threefry_lanes_hash_each_pair() {
        let (c0, c1) = (
            std::array::from_fn(|j| j as u32 * 977),
            std::array::from_fn(|j| !(j as u32)),
        );
        let (x0, x1) = threefry2x32_lanes::<LANES>([3, 0xDEAD_BEEF], c0, c1);
        for l in 0..LANES {
            assert_eq!(
                [x0[l], x1[l]],
                threefry2x32([3, 0xDEAD_BEEF], [c0[l], c1[l]])
            );
        }
    }

    #[test]
    fn split_of_key_zero_matches_jax() {
        // jax.random.split(PRNGKey(0)) == [[4146024105, 967050713], [2718843009, 1272950319]].
        let (a, b) = split(key(0));
        assert_eq!(a, [4_146_024_105, 967_050_713]);
        assert_eq!(b, [2_718_843_009, 1_272_950_319]);
        assert_eq!(split_n(key(0), 2).unwrap(), vec![a, b]);
    }

    #[test]
    fn uniform_clamps_below_one() {
        assert_eq!(uniform_from_bits(0), 0.0);
        assert_eq!(uniform_from_bits(u32::MAX), 0.999_999_94);
        assert_eq!(uniform_from_bits(u32::MAX - 127), 0.999_999_94);
        assert!(uniform_from_bits(u32::MAX - 128) < 1.0);
        assert_eq!(uniform_from_bits(1 << 31), 0.5);
    }

    #[test]
    fn randint_degenerate_range_and_cast() {
        let k = key(3);
        assert!(randint_with_key(k, 5, 5, &[4])
            .unwrap()
            .iter()
            .all(|&v| v == 5));
        assert!(randint_with_key(k, 7, 2, &[4])
            .unwrap()
            .iter()
            .all(|&v| v == 7));
        assert_eq!(f32_to_i32_x86(f32::NAN), i32::MIN);
        assert_eq!(f32_to_i32_x86(3e9), i32::MIN);
        assert_eq!(f32_to_i32_x86(-2.7), -2);
    }

    #[test]
    fn categorical_rejects_bad_shapes() {
        let k = key(0);
        assert!(categorical_with_key(k, &[0.0; 4], &[]).is_err());
        assert!(categorical_with_key(k, &[0.0; 4], &[2, 3]).is_err());
        assert!(categorical_with_key(k, &[], &[2, 0]).is_err());
        assert!(bits_with_key(k, &[usize::MAX, 3]).is_err());
    }

    #[test]
    fn gumbel_never_exceeds_its_bound() {
        // The largest uniforms give the largest values; below 0.9 they are under 2.3.
        let mut u = 0.9f32;
        let mut largest = f32::NEG_INFINITY;
        while u <= 0.999_999_94 {
            let g = -mlx_math::log(-mlx_math::log(u));
            assert!(g >= largest, "not monotone at {u}");
            largest = g;
            u = f32::from_bits(u.to_bits() + 1);
        }
        assert!(largest < GUMBEL_BOUND && largest > 16.0, "{largest}");
        assert_eq!(gumbel_of_word(u32::MAX), largest);
    }

    /// `argmax(logits / t + gumbel)` with every word drawn, as MLX computes it.
    fn dense_twin(key: Key, logits: &[f32], vocab: usize, t: f32) -> Vec<u32> {
        let g = gumbel_with_key(key, &[logits.len()]).unwrap();
        let noisy: Vec<f32> = logits
            .iter()
            .zip(&g)
            .map(|(&x, &g)| if t == 1.0 { x } else { x / t } + g)
            .collect();
        noisy
            .chunks_exact(vocab)
            .map(|row| mlx_math::argmax(row) as u32)
            .collect()
    }

    #[test]
    fn categorical_hashes_only_what_can_win_and_agrees_with_every_word_drawn() {
        // Rows of each kind in one draw (so sparse and dense rows share counter pairs), with an
        // odd total for the middle word: peaked, flat, NaN, +inf, all -inf, peaked with -inf.
        let vocab = 4099;
        let mut state = 7u32;
        let mut unit = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32
        };
        let mut logits = Vec::new();
        for kind in 0..9 {
            let row: Vec<f32> = (0..vocab)
                .map(|i| match kind % 6 {
                    5 if i % 3 == 0 => f32::NEG_INFINITY,
                    0 | 5 => 60.0 * unit() - if i % 97 == 0 { 0.0 } else { 40.0 },
                    1 => 3.0 * unit(),
                    2 if i == 1000 => f32::NAN,
                    3 if i == 2000 => f32::INFINITY,
                    4 => f32::NEG_INFINITY,
                    _ => 30.0 * unit(),
                })
                .collect();
            logits.extend(row);
        }
        let n = logits.len();
        assert_eq!(n % 2, 1);
        let mut sparse_rows = 0;
        for seed in 0..6 {
            let k = key(seed);
            for t in [1.0f32, 0.7, 0.4] {
                let ours = categorical_scaled_with_key(k, &logits, &[9, vocab], t).unwrap();
                assert_eq!(ours, dense_twin(k, &logits, vocab, t), "seed {seed} t {t}");
                for (r, row) in logits.chunks_exact(vocab).enumerate() {
                    let scale = |x: f32| if t == 1.0 { x } else { x / t };
                    if let Some(a) = sparse_gumbel_max(k, n, r * vocab, row, scale) {
                        assert_eq!(a, ours[r]);
                        sparse_rows += 1;
                    }
                }
            }
        }
        // The peaked rows (kinds 0 and 5, three of the nine) took the sparse path.
        assert!(sparse_rows >= 3 * 6 * 3, "{sparse_rows}");
    }

    #[test]
    fn best_joins_parts_as_one_argmax() {
        let b = |value: f32, index| Best::of(&[value], index);
        assert_eq!(b(1.0, 5).join(b(1.0, 2)).index, 2);
        assert_eq!(b(2.0, 5).join(b(1.0, 2)).index, 5);
        assert_eq!(b(f32::NAN, 7).join(b(3.0, 2)).index, 7);
        assert_eq!(b(f32::NAN, 7).join(b(f32::NAN, 4)).index, 4);
        let row = [1.0, 3.0, f32::NEG_INFINITY, 3.0];
        assert_eq!(Best::of(&row, 10).index, 11);
    }

    #[test]
    fn searchsorted_right_counts_less_or_equal() {
        let s = [0.0, 1.0, 1.0, 3.0];
        assert_eq!(searchsorted_right(&s, -1.0), 0);
        assert_eq!(searchsorted_right(&s, 0.0), 1);
        assert_eq!(searchsorted_right(&s, 1.0), 3);
        assert_eq!(searchsorted_right(&s, 2.0), 3);
        assert_eq!(searchsorted_right(&s, 9.0), 4);
    }

    #[test]
    fn rng_advances_like_key_sequence() {
        let mut rng = Rng::new(42);
        let (s1, k1) = split(key(42));
        assert_eq!(rng.next_key(), k1);
        assert_eq!(rng.state(), s1);
        let a = rng.randint(0, 10, &[3]).unwrap();
        let (_, k2) = split(s1);
        assert_eq!(a, randint_with_key(k2, 0, 10, &[3]).unwrap());
    }
}
