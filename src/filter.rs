//! A consumer group's tag filter (protocol version 2): which messages the
//! group receives, by their tags. docs/protocol.md ("Tag filters") is the
//! contract.
//!
//! Three forms, as RocketMQ's subscriptions and the seeds' `tagRegex`:
//!
//! - `*` (or empty): every message, tagged or not;
//! - a list `a || b || c` (RocketMQ's syntax; one tag alone is a list of
//!   one): a message with any of these tags;
//! - `re:PATTERN`: a message with a tag the regular expression matches
//!   (searched in the tag, as the `regex` crate's `is_match`, whose engine
//!   this is; anchor it with `^` and `$` to match whole tags).
//!
//! A message without tags passes only `*`. The broker decides a filter once
//! per distinct set of tags and keeps the answer, so `matches` is not on the
//! path of every message, and a tag is at most `tag_bytes_max` long: a
//! regex runs on the PikeVM alone (with its literal prefilter), which
//! needs no lazy DFA cache, the part of a compiled regex that grows as it
//! is used. So what a filter costs is known once it is built
//! (`Filter::cost_bytes`, what the budget of every compiled filter counts:
//! `filter_table.rs`), and a regex is built under a size limit, because a
//! short pattern can compile to a huge program.

use std::sync::Mutex;

use regex_automata::Input;
use regex_automata::meta;

use crate::codec::props::check_tag;

/// The prefix of a regular-expression filter.
pub const REGEX_PREFIX: &str = "re:";
/// The separator of a list filter.
pub const LIST_SEPARATOR: &str = "||";

/// What a compiled regex takes on the heap besides what its engine reports
/// (`meta::Regex::memory_usage` and its cache's): the boxes and shared
/// structs around the program, and the search stack its cache grows in
/// use. Measured at about 1.4 KiB with a counting allocator; counted with
/// room to spare (tests/filter_memory.rs checks the sum is never below
/// what a filter takes, nor more than 4 KiB above it).
const REGEX_OVERHEAD_BYTES: u64 = 4 << 10;

/// A compiled regular expression, with the one search cache it is run
/// with (the broker's loop is one thread; the lock is never contended).
#[derive(Debug)]
pub struct Compiled {
    re: meta::Regex,
    /// Sized for the program when built, so that it does not grow later.
    cache: Mutex<meta::Cache>,
    /// Heap bytes the two take, with their overhead.
    cost_bytes: u64,
}

impl Compiled {
    /// Builds `pattern` under `nfa_bytes_max`.
    fn build(pattern: &str, nfa_bytes_max: usize) -> Result<Compiled, String> {
        let config = meta::Config::new()
            .nfa_size_limit(Some(nfa_bytes_max))
            .hybrid(false)
            .dfa(false)
            .onepass(false)
            .backtrack(false);
        let re = meta::Regex::builder().configure(config).build(pattern).map_err(|e| match e.size_limit() {
            Some(limit) => format!("compiles to more than filter_compiled_bytes_max ({limit} bytes)"),
            None => e.syntax_error().map_or_else(|| e.to_string(), ToString::to_string),
        })?;
        let mut cache = re.create_cache();
        cache.reset(&re);
        let cost_bytes = (re.memory_usage() + cache.memory_usage()) as u64 + REGEX_OVERHEAD_BYTES;
        Ok(Compiled { re, cache: Mutex::new(cache), cost_bytes })
    }

    fn is_match(&self, tag: &str) -> bool {
        // A panic in a search cannot leave the cache half-changed in a way
        // a later search minds: a poisoned lock is taken as it is.
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.re.is_match_with(&mut cache, &Input::new(tag))
    }
}

/// A parsed tag filter.
#[derive(Debug)]
pub enum Filter {
    /// Every message.
    All,
    /// A message with one of these tags (sorted, without duplicates).
    Tags(Vec<Box<str>>),
    /// A message with a tag this matches (boxed: far larger than a list).
    Regex(Box<Compiled>),
}

impl Filter {
    /// Parses a filter's text. `Err` is the sentence of a BAD_FILTER reply:
    /// a text over `filter_bytes_max`, an empty or bad tag in a list, or a
    /// regular expression that does not parse or takes more than
    /// `compiled_bytes_max` bytes compiled.
    pub fn parse(text: &str, filter_bytes_max: u32, compiled_bytes_max: u32) -> Result<Filter, String> {
        if text.len() > filter_bytes_max as usize {
            return Err(format!("filter is {} bytes, more than filter_bytes_max ({filter_bytes_max})", text.len()));
        }
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(Filter::All);
        }
        if let Some(pattern) = trimmed.strip_prefix(REGEX_PREFIX) {
            let compiled = Compiled::build(pattern, compiled_bytes_max as usize)
                .map_err(|e| format!("filter {trimmed:?}: {e}"))?;
            if compiled.cost_bytes > u64::from(compiled_bytes_max) {
                let cost = compiled.cost_bytes;
                return Err(format!(
                    "filter {trimmed:?} takes {cost} bytes compiled, more than filter_compiled_bytes_max ({compiled_bytes_max})"
                ));
            }
            return Ok(Filter::Regex(Box::new(compiled)));
        }
        let mut tags = Vec::new();
        for item in trimmed.split(LIST_SEPARATOR) {
            let tag = check_tag(item.trim().as_bytes(), u32::MAX).map_err(|e| format!("filter {trimmed:?}: {e}"))?;
            tags.push(Box::from(tag));
        }
        tags.sort_unstable();
        tags.dedup();
        Ok(Filter::Tags(tags))
    }

    /// Heap bytes the filter takes: a regex's program and cache as its
    /// engine reports them, with their overhead; a list's tags.
    pub fn cost_bytes(&self) -> u64 {
        match self {
            Filter::All => 0,
            Filter::Tags(tags) => {
                let boxes = tags.capacity() * std::mem::size_of::<Box<str>>();
                (boxes + tags.iter().map(|t| t.len()).sum::<usize>()) as u64
            }
            Filter::Regex(c) => c.cost_bytes,
        }
    }

    /// Whether `tag` passes.
    pub fn matches(&self, tag: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Tags(tags) => tags.binary_search_by(|t| (**t).cmp(tag)).is_ok(),
            Filter::Regex(c) => c.is_match(tag),
        }
    }

    /// Whether a message with these tags passes: any of them does, and an
    /// untagged message passes only `*`.
    pub fn matches_any<'a>(&self, mut tags: impl Iterator<Item = &'a str>) -> bool {
        matches!(self, Filter::All) || tags.any(|t| self.matches(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Filter, String> {
        Filter::parse(text, 64, 1 << 20)
    }

    fn passes(f: &Filter, tags: &[&str]) -> bool {
        f.matches_any(tags.iter().copied())
    }

    #[test]
    fn star_and_empty_pass_everything_even_untagged() {
        for text in ["*", "", "  *  ", " "] {
            let f = parse(text).expect("valid");
            assert!(matches!(f, Filter::All), "{text:?}");
            assert!(passes(&f, &[]) && passes(&f, &["x"]) && f.matches("anything"));
        }
    }

    #[test]
    fn a_list_passes_exactly_its_tags() {
        let f = parse("eu || us||asia ||eu").expect("valid");
        assert!(matches!(&f, Filter::Tags(t) if t.len() == 3), "{f:?}");
        for tag in ["eu", "us", "asia"] {
            assert!(f.matches(tag), "{tag}");
        }
        for tag in ["e", "eu2", "EU", "", "us ", "*"] {
            assert!(!f.matches(tag), "{tag:?}");
        }
        assert!(passes(&f, &["x", "us"]), "any tag of the message");
        assert!(!passes(&f, &["x", "y"]));
        assert!(!passes(&f, &[]), "an untagged message passes only *");
        assert!(parse("solo").expect("one tag").matches("solo"));
    }

    #[test]
    fn a_regex_is_searched_in_each_tag() {
        let f = parse(r"re:^order\.").expect("valid");
        assert!(f.matches("order.created") && f.matches("order."));
        assert!(!f.matches("reorder.created") && !f.matches("order"));
        assert!(passes(&f, &["x", "order.paid"]) && !passes(&f, &[]));
        let whole = parse("re:^(a|b)$").expect("valid");
        assert!(whole.matches("a") && !whole.matches("ab"));
        assert!(parse("re:b").expect("valid").matches("abc"), "searched, not anchored");
    }

    #[test]
    fn bad_filters_are_refused_with_a_reason() {
        for text in ["a ||", "|| a", "a || || b", "a b", "a | b", "re:(", "re:[z-a]", "a\tb || c"] {
            let e = parse(text).expect_err(text);
            assert!(!e.is_empty(), "{text:?}");
        }
        let long = "x".repeat(65);
        assert!(parse(&long).expect_err("over the limit").contains("filter_bytes_max"));
        assert!(parse(&"x".repeat(64)).is_ok(), "at the limit");
    }

    #[test]
    fn a_regex_that_compiles_too_large_is_refused() {
        // Short text, huge program: refused under a small compiled limit,
        // taken under a large one.
        let text = "re:(a{50}){50}";
        let e = Filter::parse(text, 64, 1 << 10).expect_err("too large");
        assert!(e.contains("filter_compiled_bytes_max"), "{e}");
        let f = Filter::parse(text, 64, 32 << 20).expect("taken");
        assert!(f.cost_bytes() > 1 << 10);
        // The program fits the NFA limit, the program and its cache do not.
        let cost = f.cost_bytes() as u32;
        let e = Filter::parse(text, 64, cost - 1).expect_err("over by its cache");
        assert!(e.contains(&format!("takes {cost} bytes")), "{e}");
        assert!(Filter::parse(text, 64, cost).is_ok(), "at the limit");
    }

    #[test]
    fn what_a_filter_costs_is_known_once_built() {
        let small = parse(r"re:^order\.").expect("valid").cost_bytes();
        let unicode = parse(r"re:\w{5}").expect("valid").cost_bytes();
        assert!(small > REGEX_OVERHEAD_BYTES && small < 16 << 10, "{small}");
        assert!(unicode > 64 << 10, "Unicode classes compile large: {unicode}");
        assert!(parse("a || bb").expect("valid").cost_bytes() >= 3);
        assert_eq!(parse("*").expect("valid").cost_bytes(), 0);
    }
}
