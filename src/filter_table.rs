//! `FilterTable`: the broker's compiled tag filters, one per distinct text,
//! shared by every group that uses it (a string interner, as Redis shares
//! small integers), and the budget they are held to together.
//!
//! A compiled regex is the costliest thing a group holds (`re:\w{5}`, nine
//! bytes of request, takes some 170 KB: tests/filter_memory.rs), and a
//! deployment puts the same filter on many groups (one per topic, or one per
//! consumer application on every topic). So a filter is compiled once per
//! text, held by its groups through an `Arc`, and dropped with the last of
//! them; the table keeps only a `Weak` per text, so nothing has to tell it
//! when a group goes (a deleted topic, group or broadcast member, a group
//! given another filter). What the live filters take is summed from the
//! table when a new text is compiled: `compiled_filters_bytes_max` bounds
//! the texts a hostile client can make the broker compile, whatever the
//! number of groups.
//!
//! Recovery compiles through the same table, so a restart compiles each
//! text once however many groups use it, and without the budget: a group
//! the log holds is never lost, so a log whose filters take more than a
//! lowered budget opens whole, and new texts are refused until enough of
//! it is gone.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::filter::Filter;

/// The bounds a new filter is held to (`Limits`).
#[derive(Clone, Copy, Debug)]
pub struct FilterLimits {
    /// `filter_bytes_max`: the text.
    pub text_bytes_max: u32,
    /// `filter_compiled_bytes_max`: one filter compiled.
    pub compiled_bytes_max: u32,
    /// `compiled_filters_bytes_max`: every live filter together; None
    /// (recovery) holds to none.
    pub all_bytes_max: Option<u64>,
}

impl FilterLimits {
    /// No bound at all: what recovery parses a logged filter with.
    pub const NONE: FilterLimits =
        FilterLimits { text_bytes_max: u32::MAX, compiled_bytes_max: u32::MAX, all_bytes_max: None };
}

/// Every compiled filter some group holds, by its text.
#[derive(Debug, Default)]
pub struct FilterTable {
    /// By trimmed text; an entry whose filter every group dropped stays
    /// until the next compile sweeps it out.
    by_text: HashMap<Box<str>, Weak<Filter>>,
}

impl FilterTable {
    /// The filter of `text` (None for `*` or empty, which pass everything):
    /// the one compiled already while some group holds it, else compiled
    /// now. `Err` is the sentence of a BAD_FILTER reply: the filter does
    /// not parse, or is over `limits` (one of them, or every live one with
    /// it).
    pub fn get(&mut self, text: &str, limits: FilterLimits) -> Result<Option<Arc<Filter>>, String> {
        if text.len() > limits.text_bytes_max as usize {
            let max = limits.text_bytes_max;
            return Err(format!("filter is {} bytes, more than filter_bytes_max ({max})", text.len()));
        }
        let key = text.trim();
        if let Some(shared) = self.by_text.get(key).and_then(Weak::upgrade) {
            return Ok(Some(shared));
        }
        let filter = Filter::parse(key, limits.text_bytes_max, limits.compiled_bytes_max)?;
        if matches!(filter, Filter::All) {
            return Ok(None);
        }
        self.by_text.retain(|_, w| w.strong_count() > 0);
        let cost = filter.cost_bytes();
        if let Some(max) = limits.all_bytes_max {
            let held = self.bytes();
            if held + cost > max {
                return Err(format!(
                    "filter {key:?} takes {cost} bytes compiled, and the broker's filters take {held} of compiled_filters_bytes_max ({max}): use a filter other groups use, or delete groups with filters"
                ));
            }
        }
        let shared = Arc::new(filter);
        self.by_text.insert(key.into(), Arc::downgrade(&shared));
        Ok(Some(shared))
    }

    /// Bytes the compiled filters some group holds take together.
    pub fn bytes(&self) -> u64 {
        self.by_text.values().filter_map(Weak::upgrade).map(|f| f.cost_bytes()).sum()
    }

    /// Distinct filters some group holds.
    pub fn len(&self) -> usize {
        self.by_text.values().filter(|w| w.strong_count() > 0).count()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(all_bytes_max: u64) -> FilterLimits {
        FilterLimits { text_bytes_max: 4096, compiled_bytes_max: 256 << 10, all_bytes_max: Some(all_bytes_max) }
    }

    #[test]
    fn one_text_is_compiled_once_and_dropped_with_its_last_group() {
        let mut t = FilterTable::default();
        let a = t.get(r"re:^order\.", limits(1 << 20)).expect("valid").expect("a filter");
        let b = t.get(r"  re:^order\.  ", limits(1 << 20)).expect("valid").expect("a filter");
        assert!(Arc::ptr_eq(&a, &b), "the same text, spaces around it aside, is one filter");
        assert_eq!((t.len(), t.bytes()), (1, a.cost_bytes()));
        assert!(t.get("*", limits(1 << 20)).expect("valid").is_none());
        assert!(t.get(" ", limits(1 << 20)).expect("valid").is_none());
        drop(a);
        assert_eq!(t.len(), 1, "a group still holds it");
        drop(b);
        assert_eq!((t.len(), t.bytes()), (0, 0), "gone with its last group");
    }

    #[test]
    fn a_new_text_past_the_budget_is_refused_and_a_shared_one_is_not() {
        let cost_of = |text: &str| {
            FilterTable::default().get(text, FilterLimits::NONE).expect("valid").map_or(0, |f| f.cost_bytes())
        };
        let budget = limits(cost_of(r"re:\w{5}").max(cost_of(r"re:\w{6}")) + 100);
        let mut t = FilterTable::default();
        let one = t.get(r"re:\w{5}", budget).expect("valid").expect("a filter");
        let e = t.get(r"re:\w{6}", budget).expect_err("over the budget");
        assert!(e.contains("compiled_filters_bytes_max"), "{e}");
        let again = t.get(r"re:\w{5}", budget).expect("shared: costs nothing more").expect("a filter");
        assert!(Arc::ptr_eq(&one, &again));
        assert!(t.get("a || b", budget).is_ok(), "a small list fits in what is left");
        drop((one, again));
        assert!(t.get(r"re:\w{6}", budget).is_ok(), "room again once the last group dropped it");
        let long = "x".repeat(4097);
        assert!(t.get(&long, budget).expect_err("too long").contains("filter_bytes_max"));
        assert!(t.get(r"re:\w{7}", FilterLimits::NONE).is_ok(), "recovery holds to no budget");
    }
}
