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
//! 2-core Zen 4 VM decoded Qwen2.5-Coder-1.5B Q4_K_M 15% faster.
//!
//! Rayon has no setting for this, so [`Spinners::start`] gives each of the
//! pool's threads other than the driver's one long-lived job, a *spinner*,
//! for as long as `on_pool` runs. While a kernel runs ([`keep_awake`]'s
//! guard) and for [`SPIN_FOR`] after the last one, it executes whatever
//! work the pool has (`rayon::yield_now`, which steals as an idle worker
//! would) and yields the core between tries, as rayon's own idle rounds
//! do. Otherwise it parks on a condvar, which the next kernel wakes: an
//! idle server or a finished generation leaves the cores free.
//!
//! One job for the pool's lifetime, rather than one sent per burst of
//! kernels, because sending a job allocates, and a decode step must not
//! (`decode_allocations`); a kernel only counts itself in and out and,
//! when a spinner is parked, notifies the condvar (a futex call, no
//! allocation).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long after the last kernel ([`keep_awake`]) ended the spinners keep
/// running: longer than the gap between two decode steps (sampling,
/// scheduling), short enough that an idle process stops using the cores
/// at once.
const SPIN_FOR: Duration = Duration::from_millis(2);

/// A parked spinner also wakes after this long, doubling up to
/// [`LONGEST_PARK`] while nothing asks: parallel work that no kernel
/// announced (the hooks cover the big kernels, not every loop) still gets
/// the other threads soon, and an idle process wakes rarely.
const FIRST_PARK: Duration = Duration::from_millis(1);
const LONGEST_PARK: Duration = Duration::from_millis(100);

/// One pool's spinner state, shared by its threads.
pub(crate) struct Awake {
    /// Kernels running now: the spinners never park while one runs. (A
    /// parked spinner is a job blocked on a condvar, which rayon cannot
    /// wake when the kernel's loop has work to steal: parking by the clock
    /// alone left one thread of two asleep through much of a prefill's
    /// GEMMs, 20% slower.)
    active: AtomicUsize,
    /// Kernels ended so far. Only counted (a clock read costs the driver
    /// 100-200 ns a kernel on a VM); the spinners note when it last
    /// changed, on their own time.
    ended: AtomicU64,
    /// Spinners parked now (a starting kernel notifies only when some are).
    parked: AtomicUsize,
    /// Spinners started and not yet ended.
    running: AtomicUsize,
    /// Set when `on_pool`'s work is done: the spinners end.
    stop: AtomicBool,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Awake {
    fn notify(&self) {
        let _held = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        self.wake.notify_all();
    }
}

thread_local! {
    /// The state of the pool this thread drives or serves (set by
    /// [`Spinners::start`] on every thread of the pool).
    static POOL: RefCell<Option<Arc<Awake>>> = const { RefCell::new(None) };
}

/// The spinners of one `on_pool` call; dropping it (when the work returns
/// or unwinds) ends them, so the pool's threads can exit.
pub(crate) struct Spinners(Option<Arc<Awake>>);

impl Spinners {
    /// Starts a spinner on each thread of the current pool but this one and
    /// returns once all run. Called on the driver thread before any other
    /// work exists, so each spinner is the bottom job of its thread: every
    /// job it executes returns to it, and it never sits on top of a job
    /// the driver waits for. A pool of one thread gets none.
    pub(crate) fn start() -> Self {
        let threads = rayon::current_num_threads();
        let Some(me) = rayon::current_thread_index() else {
            return Self(None);
        };
        if threads < 2 {
            return Self(None);
        }
        let state = Arc::new(Awake {
            active: AtomicUsize::new(0),
            ended: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(&state)));
        let shared = Arc::clone(&state);
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() != me {
                POOL.with(|p| *p.borrow_mut() = Some(Arc::clone(&shared)));
                spin(&shared);
            }
        });
        while state.running.load(Ordering::Acquire) + 1 < threads {
            std::thread::yield_now();
        }
        Self(Some(state))
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        if let Some(state) = self.0.take() {
            state.stop.store(true, Ordering::SeqCst);
            state.notify();
            POOL.with(|p| *p.borrow_mut() = None);
        }
    }
}

/// Keeps the pool's other threads awake while the returned guard lives
/// and for [`SPIN_FOR`] after: held by a kernel for its parallel work.
/// Outside a pool set up by `on_pool`, or in a pool of one thread, it
/// does nothing.
pub(crate) fn keep_awake() -> Kernel {
    Kernel(POOL.with(|p| {
        let p = p.borrow();
        let state = p.as_ref()?;
        state.active.fetch_add(1, Ordering::SeqCst);
        // Pairs with `spin`'s increment of `parked` then check of `active`
        // (all SeqCst): either the spinner sees this kernel and does not
        // park, or this sees it parked and wakes it.
        if state.parked.load(Ordering::SeqCst) > 0 {
            state.notify();
        }
        Some(Arc::clone(state))
    }))
}

/// A running kernel (see [`keep_awake`]).
pub(crate) struct Kernel(Option<Arc<Awake>>);

impl Drop for Kernel {
    fn drop(&mut self) {
        if let Some(state) = &self.0 {
            state.ended.fetch_add(1, Ordering::SeqCst);
            state.active.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Runs the pool's work on this thread while a kernel runs or one ended
/// within [`SPIN_FOR`], parks otherwise, and returns once `state.stop` is
/// set.
fn spin(state: &Awake) {
    state.running.fetch_add(1, Ordering::AcqRel);
    let mut park_for = FIRST_PARK;
    // The count of ended kernels last seen, and when it was seen to change.
    let (mut seen, mut since) = (state.ended.load(Ordering::SeqCst), Instant::now());
    let mut asked_recently = |state: &Awake| {
        if state.active.load(Ordering::SeqCst) > 0 {
            since = Instant::now();
            return true;
        }
        let now = state.ended.load(Ordering::SeqCst);
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
        since.elapsed() <= SPIN_FOR
    };
    while !state.stop.load(Ordering::SeqCst) {
        if let Some(rayon::Yield::Executed) = rayon::yield_now() {
            park_for = FIRST_PARK;
            continue;
        }
        if asked_recently(state) {
            park_for = FIRST_PARK;
            super::profile::timed_wait(
                || state.active.load(Ordering::SeqCst) > 0,
                std::thread::yield_now,
            );
            continue;
        }
        let held = state.lock.lock().unwrap_or_else(PoisonError::into_inner);
        state.parked.fetch_add(1, Ordering::SeqCst);
        if !asked_recently(state) && !state.stop.load(Ordering::SeqCst) {
            let (_held, waited) = state
                .wake
                .wait_timeout(held, park_for)
                .unwrap_or_else(PoisonError::into_inner);
            park_for = if waited.timed_out() {
                (park_for * 2).min(LONGEST_PARK)
            } else {
                FIRST_PARK
            };
        }
        state.parked.fetch_sub(1, Ordering::SeqCst);
    }
    POOL.with(|p| *p.borrow_mut() = None);
    state.running.fetch_sub(1, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rayon::prelude::*;

    use super::{keep_awake, Awake, POOL};

    fn state() -> Option<Arc<Awake>> {
        POOL.with(|p| p.borrow().clone())
    }

    /// Waits for `cond`, up to ten seconds: on a loaded two-core CI
    /// machine a spinner may wait long for a time slice before it parks.
    fn soon(cond: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    }

    /// In a pool of four threads, three spinners run for the pool's whole
    /// work; without requests they park, a request wakes them, parallel
    /// work gives the same results meanwhile, and once the work returns
    /// they end, so the pool's threads can exit.
    #[test]
    fn spinners_park_wake_and_end_with_the_pool() {
        let state = crate::cpu::on_pool(Some(4), || {
            let s = state().unwrap_or_else(|| panic!("no spinner state"));
            assert_eq!(s.running.load(Ordering::Acquire), 3);
            assert!(soon(|| s.parked.load(Ordering::SeqCst) == 3), "not parked");
            let kernel = keep_awake();
            assert!(soon(|| s.parked.load(Ordering::SeqCst) == 0), "not woken");
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(
                s.parked.load(Ordering::SeqCst),
                0,
                "parked while a kernel runs"
            );
            drop(kernel);
            let want: u64 = (0..100_000u64).map(|i| i * i % 7).sum();
            for _ in 0..50 {
                let _kernel = keep_awake();
                let got: u64 = (0..100_000u64).into_par_iter().map(|i| i * i % 7).sum();
                assert_eq!(got, want);
            }
            assert!(
                soon(|| s.parked.load(Ordering::SeqCst) == 3),
                "not parked again"
            );
            s
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(state.stop.load(Ordering::SeqCst));
        assert!(
            soon(|| state.running.load(Ordering::Acquire) == 0),
            "still spinning"
        );
    }

    /// Work that panics still ends the spinners (the pool would otherwise
    /// keep its threads).
    #[test]
    fn a_panic_ends_the_spinners() {
        let caught = std::panic::catch_unwind(|| {
            crate::cpu::on_pool(Some(2), || {
                let s = state().unwrap_or_else(|| panic!("no spinner state"));
                std::panic::panic_any(s)
            })
        });
        let payload = caught.err().unwrap_or_else(|| panic!("no panic"));
        let s = payload
            .downcast::<Arc<Awake>>()
            .unwrap_or_else(|_| panic!("another panic"));
        assert!(
            soon(|| s.running.load(Ordering::Acquire) == 0),
            "still spinning"
        );
    }

    /// Outside a pool set up by `on_pool`, and in a pool of one thread,
    /// there is no state and a request does nothing.
    #[test]
    fn no_spinners_elsewhere() {
        assert!(keep_awake().0.is_none() && state().is_none());
        crate::cpu::on_pool(Some(1), || {
            assert!(keep_awake().0.is_none() && state().is_none());
        })
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
