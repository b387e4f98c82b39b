//! Which objects this library handed out and has not freed yet, so that a pointer a
//! program passes back that is not one of them (never created, already destroyed,
//! garbage from an error path) is answered with EINVAL instead of dereferenced.
//! perftest, for one, destroys uninitialised ids after a failed connect.

use std::collections::HashSet;
use std::sync::Mutex;

/// A set of live object addresses.
pub(crate) struct LiveSet(Mutex<Option<HashSet<usize>>>);

impl LiveSet {
    /// Empty.
    pub(crate) const fn new() -> LiveSet {
        LiveSet(Mutex::new(None))
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashSet<usize>) -> T) -> T {
        f(self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new))
    }

    /// `p` was handed out.
    pub(crate) fn insert<T>(&self, p: *const T) {
        self.with(|s| s.insert(p as usize));
    }

    /// `p` is being freed: true if it was live (then it no longer is).
    pub(crate) fn remove<T>(&self, p: *const T) -> bool {
        self.with(|s| s.remove(&(p as usize)))
    }

    /// `p` is live.
    pub(crate) fn contains<T>(&self, p: *const T) -> bool {
        !p.is_null() && self.with(|s| s.contains(&(p as usize)))
    }
}
