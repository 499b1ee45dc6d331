//! Wall-clock phases of the last conv2d call on this thread (`convtune.last_call_timings()`).
//!
//! An end-to-end call is far more than its kernel: copies into and out of staging memory,
//! waits, page faults in fresh arrays. Each phase is measured at its boundaries with a
//! monotonic clock (a few tens of nanoseconds per mark), so the record costs nothing worth
//! turning off and is always there to read.

use std::cell::RefCell;
use std::time::Instant;

/// One call's phases in the order they first ran, seconds each, plus the minor page faults
/// the whole process took meanwhile (the copies fault in fresh pages on several threads).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Record {
    pub phases: Vec<(&'static str, f64)>,
    pub minor_faults: Option<u64>,
}

impl Record {
    #[cfg(test)]
    pub fn total(&self) -> f64 {
        self.phases.iter().map(|p| p.1).sum()
    }
}

thread_local! {
    static LAST: RefCell<Record> = RefCell::new(Record::default());
}

/// A running measurement: time since the previous mark is charged to the phase named.
pub struct Phases {
    last: Instant,
    faults_at_start: Option<u64>,
    record: Record,
}

impl Default for Phases {
    fn default() -> Self {
        Self::start()
    }
}

impl Phases {
    /// Starts measuring now.
    pub fn start() -> Self {
        Phases { last: Instant::now(), faults_at_start: minor_faults(), record: Record::default() }
    }

    /// Charges the time since the previous mark to `phase`; a phase met again (one per piece
    /// of a split problem) adds up.
    pub fn mark(&mut self, phase: &'static str) {
        let now = Instant::now();
        let dt = now.duration_since(self.last).as_secs_f64();
        self.last = now;
        match self.record.phases.iter_mut().find(|p| p.0 == phase) {
            Some(p) => p.1 += dt,
            None => self.record.phases.push((phase, dt)),
        }
    }

    /// Makes this the thread's last record.
    pub fn finish(mut self) {
        self.record.minor_faults = match (self.faults_at_start, minor_faults()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        LAST.with(|l| *l.borrow_mut() = self.record);
    }
}

/// The last finished record of this thread.
pub fn last() -> Record {
    LAST.with(|l| l.borrow().clone())
}

#[cfg(unix)]
fn minor_faults() -> Option<u64> {
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } == 0).then_some(u.ru_minflt as u64)
}

#[cfg(not(unix))]
fn minor_faults() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_recurring_ones_merge() {
        let mut p = Phases::start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        p.mark("a");
        p.mark("b");
        std::thread::sleep(std::time::Duration::from_millis(1));
        p.mark("a");
        p.finish();
        let r = last();
        assert_eq!(r.phases.iter().map(|p| p.0).collect::<Vec<_>>(), ["a", "b"]);
        assert!(r.phases[0].1 >= 0.003, "{r:?}");
        assert!((r.total() - r.phases[0].1 - r.phases[1].1).abs() < 1e-12);
    }
}
