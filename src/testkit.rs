//! Seeded randomness for the model and property tests — the unit tests in
//! `src/`, the integration tests in `tests/` and the fuzz simulation — so
//! they share one generator and one way to name and replay a seed. The
//! broker never uses it.
//!
//! A randomized test runs `seeds(n)` (or `seed(default)`), prints or guards
//! the seed it is on (`SeedGuard`), and replays a failure with
//! `RUNNEL_SEED=<seed>`. Also a temporary directory removed on drop, for
//! the tests that open a log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// splitmix64: tiny, seedable, and good enough to drive tests.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

/// An unsigned integer type `Rng` draws bounded numbers of.
pub trait Bound: Copy {
    fn to_u64(self) -> u64;
    fn from_u64(v: u64) -> Self;
}

macro_rules! bound {
    ($($t:ty),*) => {$(
        impl Bound for $t {
            fn to_u64(self) -> u64 {
                self as u64
            }
            fn from_u64(v: u64) -> Self {
                // Only ever given a value below a bound of this type.
                v as $t
            }
        }
    )*};
}
bound!(u64, usize, u32);

/// What an unsuffixed literal bound (`rng.below(4)`) is inferred as.
impl Bound for i32 {
    fn to_u64(self) -> u64 {
        u64::try_from(self).unwrap_or_else(|_| panic!("a negative bound: {self}"))
    }
    fn from_u64(v: u64) -> Self {
        // Only ever given a value below a bound of this type.
        v as i32
    }
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (n > 0; the modulo bias does not matter here).
    pub fn below<N: Bound>(&mut self, n: N) -> N {
        let n = n.to_u64();
        assert!(n > 0, "Rng::below(0)");
        N::from_u64(self.next_u64() % n)
    }

    /// A number in `lo..=hi`.
    pub fn range<N: Bound>(&mut self, lo: N, hi: N) -> N {
        let (lo, hi) = (lo.to_u64(), hi.to_u64());
        assert!(lo <= hi, "Rng::range({lo}, {hi})");
        N::from_u64(lo + self.below(hi - lo + 1))
    }

    /// True once in `n` times.
    pub fn one_in<N: Bound>(&mut self, n: N) -> bool {
        self.below(n).to_u64() == 0
    }

    /// True `p` times in 100.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100u64) < p
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// `RUNNEL_SEED`, if set: decimal, or hex with `0x`.
fn env_seed() -> Option<u64> {
    let s = std::env::var("RUNNEL_SEED").ok()?;
    let s = s.trim();
    let parsed = match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("RUNNEL_SEED={s:?} is not a u64: {e}")))
}

/// The seeds a randomized test runs: `0..count`, or only `RUNNEL_SEED`.
pub fn seeds(count: u64) -> Vec<u64> {
    match env_seed() {
        Some(s) => vec![s],
        None => (0..count).collect(),
    }
}

/// The seed of a test that runs one: `RUNNEL_SEED` if set, else `default`.
pub fn seed(default: u64) -> u64 {
    env_seed().unwrap_or(default)
}

/// Names the seed on stderr when the test panics while the guard is alive,
/// so that a panic inside the code under test, not only a failed
/// assertion, replays.
pub struct SeedGuard {
    pub test: &'static str,
    pub seed: u64,
    /// The command that runs the test, for the replay line.
    pub replay: &'static str,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{} failed with seed {}; replay with RUNNEL_SEED={} {}",
                self.test, self.seed, self.seed, self.replay
            );
        }
    }
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let p = std::env::temp_dir().join(format!("runnel-test-{tag}-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_draws_stay_in_bounds_and_cover_them() {
        let mut rng = Rng::new(7);
        let mut seen = [false; 5];
        for _ in 0..1000 {
            let v = rng.range(3usize, 7);
            assert!((3..=7).contains(&v), "{v}");
            seen[v - 3] = true;
            assert!(rng.below(5u32) < 5);
        }
        assert!(seen.iter().all(|&s| s), "every value of 3..=7 drawn: {seen:?}");
    }

    #[test]
    fn the_same_seed_draws_the_same_numbers() {
        let (mut a, mut b) = (Rng::new(42), Rng::new(42));
        assert_eq!((0..8).map(|_| a.next_u64()).collect::<Vec<_>>(), (0..8).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
    }
}
