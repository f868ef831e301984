//! Where a forward pass's time goes, per backend op, without a profiler:
//! `ferrum bench --profile`. Lent machines have no `perf`, and a sampling
//! profiler cannot tell a short serial stretch from the pool's idle
//! threads anyway; this clocks each op on the thread that drives the
//! model and the pool's other threads' waits, split by whether an op was
//! running.
//!
//! Off by default: then a span costs one relaxed load. On, each op costs
//! two clock reads (100-200 ns on a VM), so a profiled run is a little
//! slower than a plain one; compare shares, not its tokens per second.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The ops a profile tells apart (the CPU backend's trait methods, some
/// grouped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    GemmQuant,
    ActQuant,
    Gemm,
    Attention,
    QkNormRope,
    KvAppend,
    Norm,
    Activation,
    Copy,
    Embedding,
}

impl Op {
    const ALL: [Op; 10] = [
        Op::GemmQuant,
        Op::ActQuant,
        Op::Gemm,
        Op::Attention,
        Op::QkNormRope,
        Op::KvAppend,
        Op::Norm,
        Op::Activation,
        Op::Copy,
        Op::Embedding,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::GemmQuant => "quantized GEMM",
            Op::ActQuant => "activation quantizing",
            Op::Gemm => "float GEMM",
            Op::Attention => "attention",
            Op::QkNormRope => "QK norm / RoPE",
            Op::KvAppend => "KV append",
            Op::Norm => "norms",
            Op::Activation => "activations, adds",
            Op::Copy => "copies, layout",
            Op::Embedding => "embedding",
        }
    }
}

const OPS: usize = Op::ALL.len();

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; OPS] = [const { AtomicU64::new(0) }; OPS];
static CALLS: [AtomicU64; OPS] = [const { AtomicU64::new(0) }; OPS];
/// The pool's other threads' waits for work, while an op ran and not.
static IDLE_IN_OPS: AtomicU64 = AtomicU64::new(0);
static IDLE_BETWEEN: AtomicU64 = AtomicU64::new(0);
/// Pool threads inside a counted wait ([`timed_wait`]). Turning profiling
/// off waits for them, so that no wait which began while it was on lands
/// after the caller's next [`take`].
static WAITING: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Spans open on this thread: only the outermost is counted, so an op
    /// that calls another (a default trait method) is not counted twice.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// Nanoseconds of [`phase`]s on this thread so far, which the span
    /// around them leaves out of its own time.
    static CARVED: Cell<u64> = const { Cell::new(0) };
}

/// Turns profiling on or off for the whole process. Turning it off
/// returns once no pool thread is still inside a counted wait.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::SeqCst);
    // A thread that saw `ENABLED` on had raised `WAITING` before this
    // store (both `SeqCst`), so this load sees it until its wait is added.
    while !on && WAITING.load(Ordering::SeqCst) > 0 {
        std::thread::yield_now();
    }
}

pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// An op being timed (see [`span`]).
pub(crate) struct Span {
    op: Op,
    start: Instant,
    carved: u64,
}

/// Times `op` until the returned span drops, where profiling is on and no
/// other span is open on this thread.
pub(crate) fn span(op: Op) -> Option<Span> {
    if !enabled() {
        return None;
    }
    let depth = DEPTH.with(|d| d.replace(d.get() + 1));
    if depth > 0 {
        DEPTH.with(|d| d.set(depth));
        return None;
    }
    Some(Span {
        op,
        start: Instant::now(),
        carved: CARVED.with(Cell::get),
    })
}

impl Drop for Span {
    fn drop(&mut self) {
        let phases = CARVED.with(Cell::get) - self.carved;
        let ns = (self.start.elapsed().as_nanos() as u64).saturating_sub(phases);
        NANOS[self.op as usize].fetch_add(ns, Ordering::Relaxed);
        CALLS[self.op as usize].fetch_add(1, Ordering::Relaxed);
        DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// A stretch of an op counted as `op` of its own (activation
/// quantizing, inside a quantized GEMM), where profiling is on.
pub(crate) struct Phase {
    op: Op,
    start: Instant,
}

/// Times part of the op being timed as `op` until the returned phase
/// drops; the op's own time leaves it out. Phases do not nest.
pub(crate) fn phase(op: Op) -> Option<Phase> {
    enabled().then(|| Phase { op, start: Instant::now() })
}

impl Drop for Phase {
    fn drop(&mut self) {
        let ns = self.start.elapsed().as_nanos() as u64;
        NANOS[self.op as usize].fetch_add(ns, Ordering::Relaxed);
        CALLS[self.op as usize].fetch_add(1, Ordering::Relaxed);
        CARVED.with(|c| c.set(c.get() + ns));
    }
}

/// Runs `wait` (a pool thread's wait for work) and, where profiling is
/// on, counts its time as idle, during an op or between ops as
/// `during_op` says.
pub(crate) fn timed_wait(during_op: impl FnOnce() -> bool, wait: impl FnOnce()) {
    if !enabled() {
        return wait();
    }
    WAITING.fetch_add(1, Ordering::SeqCst);
    let counted = ENABLED.load(Ordering::SeqCst).then(|| {
        let to = if during_op() {
            &IDLE_IN_OPS
        } else {
            &IDLE_BETWEEN
        };
        (to, Instant::now())
    });
    wait();
    if let Some((to, t)) = counted {
        to.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    WAITING.fetch_sub(1, Ordering::SeqCst);
}

/// What [`take`] read since the last call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Per op that ran: its name, total time and calls.
    pub ops: Vec<(&'static str, Duration, u64)>,
    /// The pool's other threads' summed waits for work while a parallel
    /// kernel (a GEMM, attention) ran, i.e. work that did not split
    /// evenly, and between kernels, i.e. serial code.
    pub idle_in_ops: Duration,
    pub idle_between: Duration,
}

impl Profile {
    /// Time inside ops on the driving thread.
    pub fn in_ops(&self) -> Duration {
        self.ops.iter().map(|o| o.1).sum()
    }

    /// Adds `other`'s figures to this one's.
    pub fn add(&mut self, other: &Profile) {
        for &(name, t, calls) in &other.ops {
            match self.ops.iter_mut().find(|o| o.0 == name) {
                Some(o) => (o.1, o.2) = (o.1 + t, o.2 + calls),
                None => self.ops.push((name, t, calls)),
            }
        }
        self.idle_in_ops += other.idle_in_ops;
        self.idle_between += other.idle_between;
    }
}

/// The figures since the last call (or the start), reset to zero.
pub fn take() -> Profile {
    let ns = |a: &AtomicU64| Duration::from_nanos(a.swap(0, Ordering::Relaxed));
    let ops = Op::ALL
        .iter()
        .filter_map(|&op| {
            let calls = CALLS[op as usize].swap(0, Ordering::Relaxed);
            let t = ns(&NANOS[op as usize]);
            (calls > 0).then_some((op.name(), t, calls))
        })
        .collect();
    Profile {
        ops,
        idle_in_ops: ns(&IDLE_IN_OPS),
        idle_between: ns(&IDLE_BETWEEN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only the outermost span on a thread is timed, and a phase inside it
    /// is left out of its time. One test, since enabling is process-wide;
    /// other tests' ops may be counted meanwhile, so the checks are on an
    /// op they do not run (embedding) and lower bounds. `tests/profile.rs`
    /// checks exact counts in a process of its own.
    #[test]
    fn nested_spans_are_not_timed_and_phases_are_carved_out() {
        let ms = Duration::from_millis;
        set_enabled(true);
        {
            let outer = span(Op::Embedding);
            assert!(outer.is_some());
            assert!(span(Op::Copy).is_none(), "a nested span is not timed");
            std::thread::sleep(ms(2));
            let _phase = phase(Op::ActQuant);
            std::thread::sleep(ms(20));
        }
        assert!(span(Op::Copy).is_some(), "the next op is outermost again");
        set_enabled(false);
        assert!(span(Op::Copy).is_none(), "disabled");
        let p = take();
        let time = |name| p.ops.iter().find(|o| o.0 == name).map(|o| o.1);
        let own = time("embedding").unwrap_or_default();
        assert!(own >= ms(2) && own < ms(20), "{own:?}");
        assert!(time("activation quantizing").unwrap_or_default() >= ms(20));
    }

    #[test]
    fn profiles_add_up_per_op() {
        let ms = Duration::from_millis;
        let a = Profile {
            ops: vec![("norms", ms(2), 3)],
            idle_in_ops: ms(1),
            idle_between: ms(4),
        };
        let b = Profile {
            ops: vec![("attention", ms(5), 1), ("norms", ms(1), 1)],
            idle_in_ops: ms(2),
            idle_between: ms(0),
        };
        let mut sum = a.clone();
        sum.add(&b);
        assert_eq!(sum.ops, [("norms", ms(3), 4), ("attention", ms(5), 1)]);
        assert_eq!((sum.idle_in_ops, sum.idle_between), (ms(3), ms(4)));
        assert_eq!(sum.in_ops(), ms(8));
    }
}
