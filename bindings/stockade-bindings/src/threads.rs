//! The threads an asynchronous binding call (Node's `run` and `runCode`) runs on: this
//! crate's own, never the host's shared pool.
//!
//! Why not the host's pool: a run holds its thread for as long as it lasts (up to its
//! deadline), and Node's libuv pool has four threads that the host's own file, DNS and crypto
//! calls share. Four long runs there would hold every one of them, and a host function that
//! reads a file (an `async` one, whose answer the run waits for) would wait for a thread that
//! only the runs' end frees: a deadlock until the grant's call timeout.
//!
//! How a call is placed: on the idle thread that went idle last (a stack, not a queue), so
//! that calls one after another keep running on one warm thread (its caches, the tier's
//! per-thread state) rather than waking the coldest; a new thread when none is idle, up to
//! [`MAX_RUN_THREADS`]; past that, in a queue that the threads take in order as they finish.
//! A thread idle for [`IDLE_EXIT`] ends.
//!
//! Bounds: at most [`MAX_RUN_THREADS`] threads, each with an 8 MiB stack (libuv's own). The
//! queue holds only what the host itself asked for (each entry is one call of the host's,
//! with the options it passed), so its length is the host's to bound, as with any call it
//! makes; no guest can add to it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use crate::Refused;

/// At most this many calls run at once; more wait in order.
pub const MAX_RUN_THREADS: usize = 16;

/// A thread idle this long ends (a later call starts another).
pub const IDLE_EXIT: Duration = Duration::from_secs(30);

/// Each run thread's stack: libuv's pool threads have the same.
const STACK: usize = 8 << 20;

/// A call: run with `Ok(())` on a run thread, or with the refusal on the caller's thread
/// when no thread could take it.
pub type Job = Box<dyn FnOnce(Result<(), Refused>) + Send>;

/// A set of run threads (one per host process: [`spawn_run`]).
pub struct RunThreads {
    state: Mutex<State>,
    max: usize,
    idle_exit: Duration,
}

#[derive(Default)]
struct State {
    /// Idle threads, the last to go idle on top: (id, its wake-up).
    idle: Vec<(usize, Arc<Condvar>)>,
    /// A call handed to an idle thread, by its id, until it wakes and takes it.
    handed: HashMap<usize, Job>,
    /// Calls waiting for a thread, in order.
    queue: VecDeque<Job>,
    threads: usize,
    next_id: usize,
}

impl RunThreads {
    /// At most `max` threads; one idle for `idle_exit` ends.
    #[must_use]
    pub fn new(max: usize, idle_exit: Duration) -> Arc<Self> {
        Arc::new(Self { state: Mutex::new(State::default()), max: max.max(1), idle_exit })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `job` on the idle thread that went idle last, a new thread, or (at the bound)
    /// the first thread to finish. If a new thread is needed and cannot be started, `job`
    /// is called at once, here, with the refusal.
    pub fn spawn(self: &Arc<Self>, job: Job) {
        let mut st = self.lock();
        if let Some((id, wake)) = st.idle.pop() {
            st.handed.insert(id, job);
            wake.notify_one();
            return;
        }
        if st.threads >= self.max {
            st.queue.push_back(job);
            return;
        }
        st.threads += 1;
        let id = st.next_id;
        st.next_id += 1;
        // Handed over before the thread exists, so that a thread that cannot start leaves
        // the call here to be refused rather than lost with the closure.
        st.handed.insert(id, job);
        drop(st);
        let this = Arc::clone(self);
        let started =
            std::thread::Builder::new().name("stockade-run".into()).stack_size(STACK).spawn(move || this.serve(id));
        if let Err(e) = started {
            let mut st = self.lock();
            st.threads -= 1;
            let job = st.handed.remove(&id);
            drop(st);
            if let Some(job) = job {
                job(Err(Refused::new("Unsupported", format!("no thread could be started for the run: {e}"))));
            }
        }
    }

    /// Run thread `id`: the call handed to it at its start, then whatever is handed to it or
    /// queued, until idle too long.
    fn serve(&self, id: usize) {
        let wake = Arc::new(Condvar::new());
        let mut next = self.lock().handed.remove(&id);
        while let Some(job) = next.take() {
            // A call that panics ends as the call's own failure (its caller settles it:
            // [`caught`]); the thread, and the count of threads, go on.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Ok(()))));
            next = self.next_job(id, &wake);
        }
    }

    /// The next call for thread `id`: the queue's first, or one handed to it while idle;
    /// `None` once it has been idle for `idle_exit` (it has left the idle stack then).
    fn next_job(&self, id: usize, wake: &Arc<Condvar>) -> Option<Job> {
        let mut st = self.lock();
        if let Some(job) = st.queue.pop_front() {
            return Some(job);
        }
        st.idle.push((id, Arc::clone(wake)));
        let deadline = std::time::Instant::now() + self.idle_exit;
        loop {
            if let Some(job) = st.handed.remove(&id) {
                return Some(job);
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                st.idle.retain(|(i, _)| *i != id);
                st.threads -= 1;
                return None;
            }
            st = wake.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Threads started and not yet ended.
    #[must_use]
    pub fn threads(&self) -> usize {
        self.lock().threads
    }
}

/// `run()`, with a panic in it made a `SandboxError` refusal naming it: what a call on a run
/// thread answers its caller with, so that its Promise settles whatever happens.
pub fn caught<T>(run: impl FnOnce() -> Result<T, Refused>) -> Result<T, Refused> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        Err(Refused::new("SandboxError", format!("the run failed inside stockade: {what}")))
    })
}

/// Runs `job` on the host process's run threads ([`MAX_RUN_THREADS`], made as needed).
pub fn spawn_run(job: Job) {
    static THREADS: OnceLock<Arc<RunThreads>> = OnceLock::new();
    THREADS.get_or_init(|| RunThreads::new(MAX_RUN_THREADS, IDLE_EXIT)).spawn(job);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]
    use super::*;
    use std::sync::mpsc;

    fn job(f: impl FnOnce(Result<(), Refused>) + Send + 'static) -> Job {
        Box::new(f)
    }

    #[test]
    fn g4_calls_one_after_another_run_on_the_thread_that_went_idle_last() {
        let pool = RunThreads::new(4, Duration::from_secs(60));
        // Two threads busy at once, then each call waits for the last to finish.
        let (go_tx, ids_rx) = held(&pool, 2, |_| std::thread::current().id());
        let first = [ids_rx.recv().unwrap(), ids_rx.recv().unwrap()];
        assert_ne!(first[0], first[1], "two calls at once ran on two threads");
        go_tx.send(()).unwrap();
        go_tx.send(()).unwrap();
        // Wait until both are idle, then note which went idle last by handing out calls.
        let seen: Vec<_> = (0..20)
            .map(|_| {
                let (tx, rx) = mpsc::channel();
                wait_idle(&pool, 2);
                pool.spawn(job(move |r| {
                    r.unwrap();
                    tx.send(std::thread::current().id()).unwrap();
                }));
                rx.recv().unwrap()
            })
            .collect();
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "each call ran on the thread the last one used: {seen:?}");
        assert_eq!(pool.threads(), 2);
    }

    #[test]
    fn g4_past_the_bound_calls_wait_in_order_and_no_more_threads_start() {
        let pool = RunThreads::new(2, Duration::from_secs(60));
        let (release_tx, order_rx) = held(&pool, 6, |i| i);
        let mut got = vec![order_rx.recv().unwrap(), order_rx.recv().unwrap()];
        got.sort_unstable();
        assert_eq!(got, [0, 1], "the first two ran at once");
        assert_eq!(pool.threads(), 2, "the bound holds");
        for _ in 0..6 {
            release_tx.send(()).unwrap();
        }
        let rest: Vec<usize> = (0..4).map(|_| order_rx.recv().unwrap()).collect();
        assert_eq!(rest, [2, 3, 4, 5], "the waiting calls ran in the order they came");
        assert_eq!(pool.threads(), 2);
    }

    #[test]
    fn g4_an_idle_thread_ends_after_its_idle_time() {
        let pool = RunThreads::new(2, Duration::from_millis(1));
        let (tx, rx) = mpsc::channel();
        pool.spawn(job(move |r| tx.send(r.is_ok()).unwrap()));
        assert!(rx.recv().unwrap());
        // Ordered by the pool's own state, not a sleep: its count reaches zero once the
        // thread has left.
        while pool.threads() != 0 {
            std::thread::yield_now();
        }
        let (tx, rx) = mpsc::channel();
        pool.spawn(job(move |r| tx.send(r.is_ok()).unwrap()));
        assert!(rx.recv().unwrap(), "a later call starts a thread again");
    }

    #[test]
    fn g4_a_call_that_panics_is_a_refusal_and_its_thread_goes_on() {
        let pool = RunThreads::new(1, Duration::from_secs(60));
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        pool.spawn(job(move |_| {
            let r: Result<(), Refused> = caught(|| panic!("boom"));
            tx2.send(r.map_err(|e| (e.kind, e.message))).unwrap();
            panic!("and the call itself panics too");
        }));
        let (kind, message) = rx.recv().unwrap().unwrap_err();
        assert_eq!((kind, message.as_str()), ("SandboxError", "the run failed inside stockade: boom"));
        pool.spawn(job(move |r| tx.send(r.map_err(|e| (e.kind, e.message))).unwrap()));
        // A hang guard, not a timing: without the thread, the call would wait forever.
        let next = rx.recv_timeout(Duration::from_secs(60)).expect("the next call was never served");
        assert_eq!(next, Ok(()), "the one thread served the next call");
        assert_eq!(pool.threads(), 1);
    }

    /// `n` calls on `pool`, the `i`th sending `report(i)` as it starts and then held until
    /// the returned sender releases one: (that sender, the reports).
    fn held<T: Send + 'static>(
        pool: &Arc<RunThreads>,
        n: usize,
        report: fn(usize) -> T,
    ) -> (mpsc::Sender<()>, mpsc::Receiver<T>) {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(Mutex::new(release_rx));
        let (report_tx, report_rx) = mpsc::channel();
        for i in 0..n {
            let (release, reports) = (Arc::clone(&release_rx), report_tx.clone());
            pool.spawn(job(move |r| {
                r.unwrap();
                reports.send(report(i)).unwrap();
                release.lock().unwrap().recv().unwrap();
            }));
        }
        (release_tx, report_rx)
    }

    fn wait_idle(pool: &RunThreads, n: usize) {
        while pool.lock().idle.len() != n {
            std::thread::yield_now();
        }
    }
}
