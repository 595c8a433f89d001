//! Interned names and a cheap hasher for the SQLite store's in-memory maps.
//!
//! The hot indexes (`deliveries`, `streams`, `cursors`, the `(id, sender)` dedupe index) key on
//! small integers instead of agent and topic names: SQLite compares TEXT keys byte by byte at
//! every b-tree level, and the in-memory maps would otherwise hash (and allocate) strings per
//! message.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The hash of rustc (`FxHash`): a multiply and a rotate per word. The keys are integers and
/// agent names chosen by the local user's own agents, so resistance to collision attacks
/// (SipHash's reason to be slow) buys nothing here.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0xf135_7aea_2e62_a9c5;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = self.hash.wrapping_add(word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(u64::from_ne_bytes(i.to_ne_bytes()));
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // hashbrown takes its 7 control bits from the top of the hash; the multiply leaves
        // the best-mixed bits there only for the low part of the input, so rotate them down too.
        self.hash.rotate_left(26)
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FxHashMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// A `HashSet` with [`FxHasher`].
pub(crate) type FxHashSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// Name ↔ id of the `names` table, as far as the current transaction knows.
///
/// Ids interned by a batch that then fails were rolled back with it; [`Names::rollback`] forgets
/// them so that no later batch uses an id without a row.
#[derive(Default)]
pub(crate) struct Names {
    ids: FxHashMap<Box<str>, i64>,
    /// Interned since the last commit or rollback.
    uncommitted: Vec<Box<str>>,
}

impl Names {
    /// The id of `name`, if it has one.
    #[inline]
    pub(crate) fn get(&self, name: &str) -> Option<i64> {
        self.ids.get(name).copied()
    }

    /// Records an id loaded from the database.
    pub(crate) fn insert_committed(&mut self, name: String, id: i64) {
        self.ids.insert(name.into_boxed_str(), id);
    }

    /// Records an id inserted by the current transaction.
    pub(crate) fn insert_uncommitted(&mut self, name: &str, id: i64) {
        self.ids.insert(name.into(), id);
        self.uncommitted.push(name.into());
    }

    /// The transaction committed: its ids are real.
    pub(crate) fn commit(&mut self) {
        self.uncommitted.clear();
    }

    /// The transaction rolled back: forget its ids.
    pub(crate) fn rollback(&mut self) {
        for name in self.uncommitted.drain(..) {
            self.ids.remove(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_forgets_only_uncommitted() {
        let mut n = Names::default();
        n.insert_committed("alice".into(), 1);
        n.insert_uncommitted("bob", 2);
        n.rollback();
        assert_eq!(n.get("alice"), Some(1));
        assert_eq!(n.get("bob"), None);
        n.insert_uncommitted("bob", 2);
        n.commit();
        n.rollback();
        assert_eq!(n.get("bob"), Some(2));
    }
}
