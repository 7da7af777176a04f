//! Address translation: an interval map from raw addresses to the registered regions that
//! hold them, so callers name memory by address (as HIXL and Mooncake do) and the engine
//! finds the (registration, offset) a transport needs.

use std::collections::BTreeMap;

/// Registered regions by start address; regions never overlap.
#[derive(Debug)]
pub(crate) struct RegionMap<V> {
    by_start: BTreeMap<u64, (u64, V)>,
}

/// Where `[addr, addr + len)` falls.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Lookup<'a, V> {
    /// Inside one region, at this offset from its start.
    Inside(&'a V, u64),
    /// Starts inside the region `[start, start + len)` but runs past its end.
    Straddles { start: u64, len: u64 },
    /// No region holds `addr`.
    Outside,
}

impl<V> Default for RegionMap<V> {
    fn default() -> Self {
        RegionMap {
            by_start: BTreeMap::new(),
        }
    }
}

impl<V> RegionMap<V> {
    /// Adds `[addr, addr + len)`; refused (returning the region in the way) when it
    /// overlaps one already there, or is empty or wraps.
    pub(crate) fn insert(&mut self, addr: u64, len: u64, v: V) -> Result<(), (u64, u64)> {
        let end = addr
            .checked_add(len)
            .filter(|_| len > 0)
            .ok_or((addr, len))?;
        if let Some((&s, &(l, _))) = self.by_start.range(..end).next_back()
            && s + l > addr
        {
            return Err((s, l));
        }
        self.by_start.insert(addr, (len, v));
        Ok(())
    }

    /// Removes the region starting at `addr`.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<V> {
        self.by_start.remove(&addr).map(|(_, v)| v)
    }

    /// Finds the region that holds all of `[addr, addr + len)`.
    pub(crate) fn find(&self, addr: u64, len: u64) -> Lookup<'_, V> {
        let Some((&s, (l, v))) = self.by_start.range(..=addr).next_back() else {
            return Lookup::Outside;
        };
        let off = addr - s;
        if off >= *l {
            return Lookup::Outside;
        }
        if len <= *l - off {
            Lookup::Inside(v, off)
        } else {
            Lookup::Straddles { start: s, len: *l }
        }
    }

    /// The regions, by start address.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, u64, &V)> {
        self.by_start.iter().map(|(s, (l, v))| (*s, *l, v))
    }

    pub(crate) fn len(&self) -> usize {
        self.by_start.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    fn map() -> RegionMap<&'static str> {
        let mut m = RegionMap::default();
        m.insert(0x1000, 0x1000, "a").unwrap();
        m.insert(0x3000, 0x100, "b").unwrap();
        m
    }

    #[rstest]
    #[case::start(0x1000, 16, Lookup::Inside(&"a", 0))]
    #[case::whole(0x1000, 0x1000, Lookup::Inside(&"a", 0))]
    #[case::last_byte(0x1fff, 1, Lookup::Inside(&"a", 0xfff))]
    #[case::past_end(0x1fff, 2, Lookup::Straddles { start: 0x1000, len: 0x1000 })]
    #[case::gap(0x2000, 1, Lookup::Outside)]
    #[case::before_all(0xfff, 1, Lookup::Outside)]
    #[case::second(0x3080, 0x80, Lookup::Inside(&"b", 0x80))]
    #[case::after_all(0x3100, 1, Lookup::Outside)]
    fn finds_the_region_that_holds_a_range(
        #[case] addr: u64,
        #[case] len: u64,
        #[case] want: Lookup<'static, &'static str>,
    ) {
        assert_eq!(map().find(addr, len), want);
    }

    #[test]
    fn overlapping_empty_and_wrapping_regions_are_refused() {
        let mut m = map();
        assert_eq!(m.insert(0x1800, 0x1000, "x"), Err((0x1000, 0x1000)));
        assert_eq!(m.insert(0x0800, 0x0801, "x"), Err((0x1000, 0x1000)));
        assert_eq!(m.insert(0x2fff, 2, "x"), Err((0x3000, 0x100)));
        assert!(m.insert(0x5000, 0, "x").is_err());
        assert!(m.insert(u64::MAX, 2, "x").is_err());
        m.insert(0x2000, 0x1000, "c").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.remove(0x2000), Some("c"));
        assert_eq!(m.find(0x2000, 1), Lookup::Outside);
    }
}
