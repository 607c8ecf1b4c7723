//! Stop strings: committed text is held back while its tail could still begin a stop string, so
//! a stop string split across tokens or blocks is found and cut all the same.

/// The stop strings of one request and the text held back so far.
#[derive(Debug, Default)]
pub(crate) struct StopStrings {
    stops: Vec<String>,
    held: String,
}

/// What [`StopStrings::push`] releases.
pub(crate) struct Released {
    /// Text that can no longer be part of a stop string.
    pub text: String,
    /// The stop string found; the text after it is dropped.
    pub stop: Option<String>,
}

impl StopStrings {
    pub fn new(stops: &[String]) -> Self {
        StopStrings {
            stops: stops.to_vec(),
            held: String::new(),
        }
    }

    /// Takes newly committed text.
    pub fn push(&mut self, delta: &str) -> Released {
        if self.stops.is_empty() {
            return Released {
                text: delta.to_string(),
                stop: None,
            };
        }
        self.held.push_str(delta);
        // The earliest stop string to start wins (the first listed among equal starts).
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, stop)) = found {
            let stop = stop.clone();
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Released {
                text,
                stop: Some(stop),
            };
        }
        let keep = self.partial_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        Released { text, stop: None }
    }

    /// The held text, once no more text comes.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that begins some stop string.
    fn partial_suffix(&self) -> usize {
        let held = &self.held;
        (1..=held.len())
            .rev()
            .filter(|&n| held.is_char_boundary(held.len() - n))
            .find(|&n| {
                let tail = &held[held.len() - n..];
                self.stops
                    .iter()
                    .any(|s| s.len() > n && s.starts_with(tail))
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (Vec<String>, Option<String>, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut s = StopStrings::new(&stops);
        let mut out = Vec::new();
        for d in deltas {
            let r = s.push(d);
            out.push(r.text);
            if r.stop.is_some() {
                return (out, r.stop, String::new());
            }
        }
        (out, None, s.flush())
    }

    #[test]
    fn a_stop_string_split_over_deltas_is_found_and_cut() {
        let (out, stop, _) = run(&["END"], &["ab", "cE", "N", "Dxyz"]);
        assert_eq!(out, ["ab", "c", "", ""]);
        assert_eq!(stop.as_deref(), Some("END"));
    }

    #[test]
    fn text_that_stops_matching_is_released() {
        let (out, stop, tail) = run(&["END"], &["xE", "Nd", "E"]);
        assert_eq!(out, ["x", "ENd", ""]);
        assert_eq!(stop, None);
        assert_eq!(tail, "E");
    }

    #[test]
    fn the_earliest_stop_wins_and_text_after_it_is_dropped() {
        let (out, stop, _) = run(&["bc", "ab"], &["xabcd"]);
        assert_eq!(out, ["x"]);
        assert_eq!(stop.as_deref(), Some("ab"));
    }

    #[test]
    fn multibyte_text_is_held_on_char_boundaries() {
        let (out, stop, _) = run(&["é!"], &["café", "!"]);
        assert_eq!(out, ["caf", ""]);
        assert_eq!(stop.as_deref(), Some("é!"));
        let (out, _, tail) = run(&["🙂x"], &["a🙂", "b"]);
        assert_eq!(out, ["a", "🙂b"]);
        assert_eq!(tail, "");
    }

    #[test]
    fn no_stops_release_everything() {
        let (out, stop, tail) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b"]);
        assert_eq!((stop, tail), (None, String::new()));
    }
}
