//! Gemma 4's multidimensional RoPE (`gemma4/vision.py::apply_multidimensional_rope`): the head
//! is split into one part per spatial dimension (x, then y), each `2 * (head_dim / 4)` channels
//! wide, and each part is rotated "rotate-half" style by its own coordinate. Frequencies:
//! `timescale_i = theta ^ (f32(2 / channels) * i)`, angle `= position / timescale_i` (a
//! division, as the reference writes it; multiplying by an inverse frequency rounds otherwise).

/// Cos/sin tables for the positions `0..max_pos` of one spatial dimension.
pub(crate) struct Rope2d {
    channels: usize,
    half: usize,
    /// `[pos][half]`
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Rope2d {
    pub fn new(head_dim: usize, theta: f32, max_pos: usize) -> Self {
        let channels = 2 * (head_dim / 4);
        let half = channels / 2;
        let step = (2.0f64 / channels as f64) as f32;
        let timescale: Vec<f32> = (0..half).map(|i| theta.powf(step * i as f32)).collect();
        let mut cos = vec![0f32; max_pos * half];
        let mut sin = vec![0f32; max_pos * half];
        for p in 0..max_pos {
            for (i, ts) in timescale.iter().enumerate() {
                let angle = p as f32 / ts;
                cos[p * half + i] = angle.cos();
                sin[p * half + i] = angle.sin();
            }
        }
        Self {
            channels,
            half,
            cos,
            sin,
        }
    }

    /// Rotates one head vector in place for the patch at grid position `(x, y)`.
    pub fn apply(&self, head: &mut [f32], x: usize, y: usize) {
        for (d, pos) in [x, y].into_iter().enumerate() {
            let part = &mut head[d * self.channels..(d + 1) * self.channels];
            let (a, b) = part.split_at_mut(self.half);
            let cos = &self.cos[pos * self.half..(pos + 1) * self.half];
            let sin = &self.sin[pos * self.half..(pos + 1) * self.half];
            for i in 0..self.half {
                let (va, vb) = (a[i], b[i]);
                // x * cos + rotate_half(x) * sin, rotate_half = [-x2, x1].
                a[i] = va * cos[i] + (-vb) * sin[i];
                b[i] = vb * cos[i] + va * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let r = Rope2d::new(16, 100.0, 8);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let mut h = orig.clone();
        r.apply(&mut h, 0, 0);
        assert_eq!(h, orig);
        r.apply(&mut h, 5, 7);
        let n0: f32 = orig.iter().map(|v| v * v).sum();
        let n1: f32 = h.iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        // x only moves the first 8 channels, y only the last 8.
        let mut hx = orig.clone();
        r.apply(&mut hx, 3, 0);
        assert_eq!(&hx[8..], &orig[8..]);
        assert_ne!(&hx[..8], &orig[..8]);
    }
}
