//! Alternated rounds: the median of a figure over rounds and its spread, as the results
//! page quotes them ("median (min–max) of N rounds").

/// The median and the range of a set of rounds' values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub rounds: usize,
}

impl Spread {
    /// The spread of `values` (NaN left out; `None` when none is left). The median of an
    /// even count is the mean of the two middle values.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => v[n / 2],
            _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            rounds: n,
        })
    }

    /// `median (min–max)` with `decimals` decimals.
    pub fn cell(&self, decimals: usize) -> String {
        format!(
            "{:.decimals$} ({:.decimals$}–{:.decimals$})",
            self.median, self.min, self.max
        )
    }
}

/// A table cell for an optional spread, `-` for none.
pub fn cell(s: Option<Spread>, decimals: usize) -> String {
    s.map_or("-".into(), |s| s.cell(decimals))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(&[3.0, 1.0, 2.0], 2.0, 1.0, 3.0)]
    #[case(&[4.0, 1.0, 2.0, 3.0], 2.5, 1.0, 4.0)]
    #[case(&[5.0], 5.0, 5.0, 5.0)]
    #[case(&[f64::NAN, 7.0, 1.0], 4.0, 1.0, 7.0)]
    fn the_median_is_the_middle_round_and_the_range_its_ends(
        #[case] v: &[f64],
        #[case] median: f64,
        #[case] min: f64,
        #[case] max: f64,
    ) {
        let s = Spread::of(v.iter().copied()).unwrap();
        assert_eq!((s.median, s.min, s.max), (median, min, max));
    }

    #[test]
    fn no_round_is_no_figure_and_cells_say_so() {
        assert_eq!(Spread::of([f64::NAN]), None);
        assert_eq!(cell(None, 1), "-");
        assert_eq!(cell(Spread::of([1.0, 2.25, 3.0]), 1), "2.2 (1.0–3.0)");
    }
}
