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
//!   (searched in the tag, as the `regex` crate's `is_match`; anchor it with
//!   `^` and `$` to match whole tags).
//!
//! A message without tags passes only `*`. The broker decides a filter once
//! per distinct set of tags and keeps the answer, so `matches` is not on the
//! path of every message; still, a regex is compiled under a size limit,
//! because a short pattern can compile to a huge program.

use regex::{Regex, RegexBuilder};

use crate::codec::props::check_tag;

/// The prefix of a regular-expression filter.
pub const REGEX_PREFIX: &str = "re:";
/// The separator of a list filter.
pub const LIST_SEPARATOR: &str = "||";

/// A parsed tag filter.
#[derive(Clone, Debug)]
pub enum Filter {
    /// Every message.
    All,
    /// A message with one of these tags (sorted, without duplicates).
    Tags(Vec<Box<str>>),
    /// A message with a tag this matches.
    Regex(Regex),
}

impl Filter {
    /// Parses a filter's text. `Err` is the sentence of a BAD_FILTER reply:
    /// a text over `filter_bytes_max`, an empty or bad tag in a list, or a
    /// regular expression that does not parse or compiles to more than
    /// `compiled_bytes_max` bytes.
    pub fn parse(text: &str, filter_bytes_max: u32, compiled_bytes_max: u32) -> Result<Filter, String> {
        if text.len() > filter_bytes_max as usize {
            return Err(format!("filter is {} bytes, more than filter_bytes_max ({filter_bytes_max})", text.len()));
        }
        let trimmed = text.trim();
        if trimmed.is_empty() || trimmed == "*" {
            return Ok(Filter::All);
        }
        if let Some(pattern) = trimmed.strip_prefix(REGEX_PREFIX) {
            let size = compiled_bytes_max as usize;
            return RegexBuilder::new(pattern)
                .size_limit(size)
                .dfa_size_limit(size)
                .build()
                .map(Filter::Regex)
                .map_err(|e| format!("filter {trimmed:?}: {e}"));
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

    /// Whether `tag` passes.
    pub fn matches(&self, tag: &str) -> bool {
        match self {
            Filter::All => true,
            Filter::Tags(tags) => tags.binary_search_by(|t| (**t).cmp(tag)).is_ok(),
            Filter::Regex(re) => re.is_match(tag),
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
        assert!(Filter::parse(text, 64, 1 << 10).is_err());
        assert!(Filter::parse(text, 64, 32 << 20).is_ok());
    }
}
