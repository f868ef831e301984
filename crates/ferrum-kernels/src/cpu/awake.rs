//! Keeps the kernels' pool threads awake between the parallel loops of a
//! forward pass.
//!
//! A decode step runs hundreds of short parallel loops (a 1.5B model: six
//! GEMMs and attention per layer, 30-200 µs each) with a little serial work
//! between them. Rayon parks a worker that has found no work for 32
//! `sched_yield` rounds (tens of µs), and waking it takes a futex call and,
//! on a virtual machine, the hypervisor's wake-up of an idle vCPU: the next
//! loop starts on one thread, and the woken one joins late. With rayon's
//! idle rounds raised to 4096 (a patched build, for measuring only), a
//! 2-core Zen 4 VM decoded Qwen2.5-Coder-1.5B Q4_K_M 15% faster (four
//! alternated rounds, each better) and eight SmolLM2 sequences 12% faster.
//!
//! Rayon has no setting for this, so each of the pool's other threads runs
//! a *spinner* while kernels keep asking for it: a job that executes
//! whatever work the pool has (`rayon::yield_now`, which steals as an idle
//! worker would), yields the core between tries (as rayon's own idle rounds
//! do, so other processes still get it), and ends once no kernel has asked
//! for [`SPIN_FOR`]: a server between requests, or a finished generation,
//! lets its threads sleep again within a few ms.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long after the last [`keep_awake`] the spinners keep running: longer
/// than the gap between two decode steps (sampling, scheduling), short
/// enough that an idle process stops using the cores at once.
const SPIN_FOR: Duration = Duration::from_millis(2);

/// One pool's spinner state, shared by its threads.
pub(crate) struct Awake {
    start: Instant,
    /// Nanoseconds after `start` of the last request.
    last_request: AtomicU64,
    /// Spinners running now.
    spinners: AtomicUsize,
    /// Whether spinner jobs were sent and none has started yet (the
    /// kernels asking meanwhile send no more).
    sent: AtomicBool,
    threads: usize,
}

thread_local! {
    /// The state of the pool this thread belongs to (set by [`join_pool`]).
    static POOL: RefCell<Option<Arc<Awake>>> = const { RefCell::new(None) };
    /// Whether this thread is running a spinner (one that picks up another
    /// spinner job while it executes work returns at once).
    static SPINNING: Cell<bool> = const { Cell::new(false) };
}

/// State for a new pool of `threads` threads, to hand to [`join_pool`] on
/// each of them.
pub(crate) fn new_pool(threads: usize) -> Arc<Awake> {
    Arc::new(Awake {
        start: Instant::now(),
        last_request: AtomicU64::new(0),
        spinners: AtomicUsize::new(0),
        sent: AtomicBool::new(false),
        threads,
    })
}

/// Makes this (pool) thread's [`keep_awake`] calls use `state`.
pub(crate) fn join_pool(state: &Arc<Awake>) {
    POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(state)));
}

/// Asks for the pool's other threads to stay awake for [`SPIN_FOR`] more:
/// called where a kernel is about to start parallel work. Outside a pool
/// set up by `on_pool`, or in a pool of one thread, it does nothing.
pub(crate) fn keep_awake() {
    // A spinner's own kernels (work it took from the requester) need no
    // more spinners, and must not send one to the requester's thread.
    if SPINNING.get() {
        return;
    }
    POOL.with(|p| {
        let p = p.borrow();
        let Some(state) = p.as_ref() else { return };
        if state.threads < 2 {
            return;
        }
        let now = state.start.elapsed().as_nanos() as u64;
        state.last_request.store(now, Ordering::Relaxed);
        if state.spinners.load(Ordering::Relaxed) + 1 >= state.threads
            || state.sent.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let Some(me) = rayon::current_thread_index() else {
            return;
        };
        let state = Arc::clone(state);
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() != me {
                spin(&state);
            }
        });
    });
}

/// Runs the pool's work on this thread until no kernel has asked for
/// [`SPIN_FOR`].
fn spin(state: &Awake) {
    state.sent.store(false, Ordering::Release);
    if SPINNING.get() {
        return;
    }
    // At most one spinner per thread other than the requester's.
    if state
        .spinners
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n + 1 < state.threads).then_some(n + 1)
        })
        .is_err()
    {
        return;
    }
    SPINNING.set(true);
    let limit = SPIN_FOR.as_nanos() as u64;
    loop {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => continue,
            Some(rayon::Yield::Idle) => {}
            None => break,
        }
        let now = state.start.elapsed().as_nanos() as u64;
        if now.saturating_sub(state.last_request.load(Ordering::Relaxed)) > limit {
            break;
        }
        std::thread::yield_now();
    }
    SPINNING.set(false);
    state.spinners.fetch_sub(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use rayon::prelude::*;

    use super::{keep_awake, POOL};

    fn spinners() -> usize {
        POOL.with(|p| {
            let p = p.borrow();
            p.as_ref().map_or(0, |s| s.spinners.load(Ordering::Acquire))
        })
    }

    /// Waits up to a second for `spinners()` to be `want`.
    fn settles_at(want: usize) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1) {
            if spinners() == want {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    /// A request starts one spinner on the other thread of a two-thread
    /// pool (not one per request); parallel work still runs and gives the
    /// same results while it spins; without requests it ends, so an idle
    /// process stops using the cores.
    #[test]
    fn spinners_start_help_and_stop() {
        crate::cpu::on_pool(Some(2), || {
            assert_eq!(spinners(), 0);
            keep_awake();
            assert!(settles_at(1), "no spinner started");
            for _ in 0..100 {
                keep_awake();
            }
            let want: u64 = (0..100_000u64).map(|i| i * i % 7).sum();
            for _ in 0..50 {
                keep_awake();
                let got: u64 = (0..100_000u64).into_par_iter().map(|i| i * i % 7).sum();
                assert_eq!(got, want);
            }
            assert!(spinners() <= 1, "more than one spinner for two threads");
            assert!(settles_at(0), "the spinner did not stop");
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Outside a pool set up by `on_pool`, and in a pool of one thread, a
    /// request does nothing.
    #[test]
    fn requests_elsewhere_do_nothing() {
        keep_awake();
        assert_eq!(spinners(), 0);
        crate::cpu::on_pool(Some(1), || {
            keep_awake();
            assert_eq!(spinners(), 0);
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
