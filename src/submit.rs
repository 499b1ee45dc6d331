//! Submissions grouped across threads. `Queue::submit` takes the device's locks and runs its
//! maintenance: alone a small call's submit took 0.017 ms on an H200, from 8 threads at once
//! 0.064 ms a call, so 8 threads ran fewer small Tensor calls than one (0.96x,
//! `benches/thread_throughput.py`). Here a thread whose command buffers arrive while
//! another thread is submitting leaves them to the next submission, made by one of the
//! threads waiting for all of them: each waiting thread's buffers go in the first
//! submission that starts after they arrived, so work still goes to the GPU in the order
//! each thread gave it, and a lone caller submits at once.

use std::sync::{Condvar, Mutex, MutexGuard};

/// What a submission gives each caller whose buffers it carried: its index and the
/// caller's completion token (see `Batcher::submit`).
pub type Done<T> = (wgpu::SubmissionIndex, T);

struct Batch<T> {
    pending: Vec<wgpu::CommandBuffer>,
    /// Tickets handed out (one per `submit` call) and the last one whose buffers were
    /// submitted or failed to be; the ticket ranges (first, last) of submissions that
    /// failed, with why (a GPU error at submission, or a panic in it).
    issued: u64,
    submitted: u64,
    failed: Vec<(u64, u64, String)>,
    /// The latest submission's index and token.
    last: Option<Done<T>>,
    /// A thread is submitting (with the lock let go).
    leading: bool,
}

/// The queue's submissions, grouped (see the module's doc).
pub struct Batcher<T> {
    batch: Mutex<Batch<T>>,
    changed: Condvar,
}

impl<T: Clone> Default for Batcher<T> {
    fn default() -> Self {
        Batcher {
            batch: Mutex::new(Batch { pending: Vec::new(), issued: 0, submitted: 0, failed: Vec::new(), last: None, leading: false }),
            changed: Condvar::new(),
        }
    }
}

impl<T: Clone> Batcher<T> {
    fn lock(&self) -> MutexGuard<'_, Batch<T>> {
        self.batch.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Submits `commands` with whatever other threads left meanwhile, through `run` (called
    /// on the submitting thread with every buffer of the submission: it submits them and
    /// returns the index with a token, e.g. a work-done flag asked for right after, which
    /// covers every buffer in it), and returns what the submission that carried them
    /// returned. A submission's failure (`run`'s error: a GPU error caught at submission,
    /// which an error scope of the submitting thread alone would see; or a panic) is every
    /// carried call's error.
    pub fn submit(
        &self,
        commands: impl IntoIterator<Item = wgpu::CommandBuffer>,
        run: impl FnOnce(Vec<wgpu::CommandBuffer>) -> Result<Done<T>, String>,
    ) -> Result<Done<T>, String> {
        let mut b = self.lock();
        b.pending.extend(commands);
        b.issued += 1;
        let ticket = b.issued;
        let mut run = Some(run);
        loop {
            if b.submitted >= ticket {
                if let Some((_, _, why)) = b.failed.iter().find(|(first, last, _)| (*first..=*last).contains(&ticket)) {
                    return Err(why.clone());
                }
                // The latest submission carried this call's buffers or came after it: waiting
                // for it (or its token) covers them.
                return Ok(b.last.clone().expect("a submission was made"));
            }
            if !b.leading {
                if let Some(run) = run.take() {
                    b.leading = true;
                    let commands = std::mem::take(&mut b.pending);
                    let (first, upto) = (b.submitted + 1, b.issued);
                    drop(b);
                    // However the submission ends, the threads it carried hear of it.
                    let ended = Leading { batcher: self, first, upto };
                    let outcome = run(commands);
                    ended.done(outcome);
                    b = self.lock();
                    continue;
                }
            }
            b = self.changed.wait(b).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The submitting thread's part: records the submission's outcome (a failure if it unwound
/// before `done`) and wakes the threads waiting for it.
struct Leading<'a, T: Clone> {
    batcher: &'a Batcher<T>,
    first: u64,
    upto: u64,
}

impl<T: Clone> Leading<'_, T> {
    fn done(self, outcome: Result<Done<T>, String>) {
        let mut b = self.batcher.lock();
        match outcome {
            Ok(last) => b.last = Some(last),
            Err(why) => b.failed.push((self.first, self.upto, why)),
        }
        b.submitted = self.upto;
        b.leading = false;
        drop(b);
        self.batcher.changed.notify_all();
        std::mem::forget(self);
    }
}

impl<T: Clone> Drop for Leading<'_, T> {
    fn drop(&mut self) {
        let mut b = self.batcher.lock();
        b.submitted = self.upto;
        b.failed.push((self.first, self.upto, "the GPU submission that carried this call's work panicked".into()));
        b.leading = false;
        drop(b);
        self.batcher.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn commands(e: &crate::device::Engine) -> wgpu::CommandBuffer {
        e.device.create_command_encoder(&Default::default()).finish()
    }

    /// 16 threads submitting at once: every call returns a submission that carried its
    /// buffers (waiting for it ends), in fewer submissions than calls where they met.
    #[test]
    fn threads_submitting_at_once_share_submissions() {
        let e = crate::device::engine().expect("a Vulkan adapter (lavapipe in CI)");
        let batcher: Batcher<usize> = Batcher::default();
        let made = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let (idx, n) = batcher
                            .submit([commands(&e)], |all| Ok((e.queue.submit(all), made.fetch_add(1, Ordering::SeqCst) + 1)))
                            .unwrap();
                        assert!(n >= 1);
                        e.device.poll(wgpu::PollType::Wait { submission_index: Some(idx), timeout: Some(std::time::Duration::from_secs(60)) }).unwrap();
                    }
                });
            }
        });
        let made = made.load(Ordering::SeqCst);
        assert!((1..=800).contains(&made), "{made}");
        eprintln!("800 calls from 16 threads in {made} submissions");
    }

    /// A submission that fails or unwinds fails the calls it carried and leaves the batcher
    /// usable.
    #[test]
    fn a_failed_submission_leaves_it_usable() {
        let e = crate::device::engine().expect("a Vulkan adapter (lavapipe in CI)");
        let batcher: Batcher<u32> = Batcher::default();
        let failed = batcher.submit([commands(&e)], |_| Err("refused".into()));
        assert_eq!(failed.unwrap_err(), "refused");
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| batcher.submit([commands(&e)], |_| panic!("injected"))));
        assert!(unwound.is_err());
        let (_, token) = batcher.submit([commands(&e)], |all| Ok((e.queue.submit(all), 7))).unwrap();
        assert_eq!(token, 7);
    }
}
