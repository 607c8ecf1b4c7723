//! A ragged batch: several sequences packed one after another in one `[rows, hidden]` matrix.
//!
//! Every weight is then read once per forward pass for the whole batch, and no padding
//! positions are computed. Row-wise work (projections, norms, MLP, experts) does not care
//! where one sequence ends; attention does, and takes each sequence's span from here: a
//! sequence attends only to its own cache and its own rows, under its own mask, which is built
//! for every sequence whatever the lengths (a batch of equal-length sequences takes exactly the
//! same path as a ragged one; see `attention.rs`).

use std::ops::Range;

/// Row spans of the sequences of a packed batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segments {
    /// Sequence `i` owns rows `bounds[i]..bounds[i + 1]`.
    bounds: Vec<usize>,
}

impl Segments {
    /// Consecutive spans of the given lengths.
    pub fn from_lengths(lengths: impl IntoIterator<Item = usize>) -> Self {
        let mut bounds = vec![0];
        for len in lengths {
            let last = *bounds.last().expect("bounds starts non-empty");
            bounds.push(last + len);
        }
        Segments { bounds }
    }

    /// Number of sequences.
    pub fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Whether the batch holds no sequence.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total rows.
    pub fn rows(&self) -> usize {
        *self.bounds.last().expect("bounds starts non-empty")
    }

    /// Rows of sequence `i`.
    pub fn span(&self, i: usize) -> Range<usize> {
        self.bounds[i]..self.bounds[i + 1]
    }

    /// Row spans in order.
    pub fn spans(&self) -> impl ExactSizeIterator<Item = Range<usize>> + '_ {
        self.bounds.windows(2).map(|w| w[0]..w[1])
    }
}

#[cfg(test)]
mod tests {
    use super::Segments;

    #[test]
    fn spans_follow_lengths() {
        let s = Segments::from_lengths([3, 0, 2]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.rows(), 5);
        assert_eq!(s.spans().collect::<Vec<_>>(), vec![0..3, 3..3, 3..5]);
        assert_eq!(s.span(2), 3..5);
        assert!(Segments::from_lengths([]).is_empty());
    }
}
