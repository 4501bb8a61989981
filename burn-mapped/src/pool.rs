//! The host kernels' thread pool: persistent workers that spin between jobs.
//!
//! A decode step issues 100-200 small parallel products (tens to hundreds of µs each) with
//! gaps of 10-100 µs between them. A pool whose idle workers sleep at once pays a wake-up (a
//! futex call and a context switch per worker) on every product; here a worker that has
//! finished a job spins for [`SPIN`] first, so the next product of the step finds it awake,
//! and parks after that, so an idle process uses no CPU.
//!
//! One job at a time owns the workers. Its tasks are claimed from an atomic counter by the
//! calling thread and the workers alike, so a job with more tasks than threads queues rather
//! than oversubscribes, and a worker that comes late finds nothing left. A caller that finds
//! the pool busy (another thread's job, or a nested call from inside a task) runs its tasks on
//! its own thread.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker (or a caller waiting for its job's last tasks) spins before it
/// sleeps: longer than the gaps between a decode step's products, so they find the workers
/// awake, and short enough that a process between requests is idle within a few ms.
const SPIN: Duration = Duration::from_millis(2);

/// A gap this long between two looks at the clock while spinning means the thread was
/// descheduled: the cores are oversubscribed, and spinning on would take time from threads
/// with work, so the spinner sleeps at once.
const PREEMPTED: Duration = Duration::from_micros(50);

/// Spins between two looks at the clock (a look costs tens of ns, a spin a few to tens).
const SPINS_PER_CLOCK: u32 = 64;

/// The environment variable that overrides the thread count.
pub const THREADS_VAR: &str = "BURN_MAPPED_THREADS";

/// Most threads a pool starts, whatever `BURN_MAPPED_THREADS` asks: each thread costs a stack
/// and a wake-up per job, and no machine this crate runs on has more cores.
pub const MAX_THREADS: usize = 1024;

/// Threads a job runs on, the calling thread included: `BURN_MAPPED_THREADS` if it is an
/// integer from 1 to [`MAX_THREADS`], else the machine's available parallelism (with a
/// warning). Read once, at the first call.
pub fn threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        let default = std::thread::available_parallelism().map_or(1, |n| n.get());
        match threads_from_env() {
            Ok(Some(n)) => n,
            Ok(None) => default,
            Err(e) => {
                log::warn!("{e}; using {default}");
                default
            }
        }
    })
}

/// `BURN_MAPPED_THREADS` was set to something other than an integer from 1 to
/// [`MAX_THREADS`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{THREADS_VAR}={value:?} is not a thread count from 1 to {MAX_THREADS}")]
pub struct ThreadsVarError {
    /// The variable's value.
    pub value: String,
}

/// The thread count `BURN_MAPPED_THREADS` asks for, `None` when it is not set; a program can
/// call this first to refuse a bad value instead of running with the default.
///
/// # Errors
/// [`ThreadsVarError`] for a value that is not an integer from 1 to [`MAX_THREADS`].
pub fn threads_from_env() -> Result<Option<usize>, ThreadsVarError> {
    let Some(value) = std::env::var_os(THREADS_VAR) else {
        return Ok(None);
    };
    let value = value.to_string_lossy().into_owned();
    match value.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
        _ => Err(ThreadsVarError { value }),
    }
}

/// Runs `f(0)`, ..., `f(tasks - 1)` on the calling thread and the process's pool (started on
/// first use), and returns when all have finished. A panic in a task is resumed here once
/// every task has ended.
pub(crate) fn run(tasks: usize, f: &(dyn Fn(usize) + Sync)) {
    if tasks <= 1 || threads() <= 1 {
        (0..tasks).for_each(f);
        return;
    }
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new(threads(), SPIN))
        .run(tasks, f);
}

/// Tasks per pool thread when a job's count is left to the pool. Threads claim tasks as they
/// come free, so a thread that loses its core in the middle of a job (another process wants
/// it) holds back one small task while the others take the rest, instead of half the job.
pub(crate) const TASKS_PER_THREAD: usize = 4;

/// Runs `f(first, piece)` over `data` cut into pieces of whole `chunk`-element chunks
/// (`first`: the index of a piece's first chunk), [`TASKS_PER_THREAD`] per pool thread when
/// `parallel` (the caller says whether the work is worth a hand-off), else all of it on the
/// calling thread; returns when all have ended. For a model's own parallel work between
/// products (attention, activations), on the products' workers instead of threads of its own.
///
/// # Panics
/// If `chunk` is 0 or does not divide `data.len()`; a panic in `f` is resumed here.
pub fn for_each_piece<T: Send>(
    data: &mut [T],
    chunk: usize,
    parallel: bool,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    assert!(
        chunk > 0 && data.len().is_multiple_of(chunk),
        "pieces of whole chunks"
    );
    let chunks = data.len() / chunk;
    if chunks == 0 {
        return;
    }
    let tasks = if parallel {
        threads() * TASKS_PER_THREAD
    } else {
        1
    };
    let per = chunks.div_ceil(tasks.clamp(1, chunks));
    let pieces = chunks.div_ceil(per);
    if pieces == 1 {
        f(0, data);
        return;
    }
    let base = SharedMut::new(data);
    run(pieces, &|i| {
        let first = i * per;
        let n = per.min(chunks - first);
        // SAFETY: piece `i` is elements `first * chunk..(first + n) * chunk` of `data`, inside
        // it (`first + n <= chunks`) and disjoint from every other piece; `run` calls each
        // index once and returns only after every call has ended, while `data` stays mutably
        // borrowed by this function, so this is the only reference to the piece while it lives.
        let piece = unsafe { base.piece(first * chunk, n * chunk) };
        f(first, piece);
    });
}

/// The start of a slice whose disjoint pieces the pool's threads take.
pub(crate) struct SharedMut<T>(*mut T);

// SAFETY: `SharedMut` is only read to form pieces that never overlap (see `piece`); sharing
// the address is then like handing each thread its own `&mut` piece of `T: Send`.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The start of `data`, whose borrow the caller keeps for as long as pieces live.
    pub(crate) fn new(data: &mut [T]) -> Self {
        Self(data.as_mut_ptr())
    }

    /// Elements `offset..offset + len` (a method, so closures capture `SharedMut` whole).
    ///
    /// # Safety
    /// The range lies inside the slice given to [`new`](Self::new), which is still mutably
    /// borrowed, and no other reference to any of its elements lives meanwhile.
    pub(crate) unsafe fn piece<'a>(&self, offset: usize, len: usize) -> &'a mut [T] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(offset), len) }
    }
}

/// Workers and the state they share with callers.
struct Pool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

struct Shared {
    /// Set while a job owns the workers.
    busy: AtomicBool,
    /// The newest job and its sequence number.
    slot: RwLock<(usize, Option<Arc<Job>>)>,
    /// The newest job's sequence number, which spinning workers watch.
    posted: AtomicUsize,
    /// Workers asleep on `wake`, or about to be.
    parked: AtomicUsize,
    sleep: Mutex<()>,
    wake: Condvar,
    /// Set (with a new `posted`) when the pool is dropped.
    stop: AtomicBool,
    /// How long an idle worker, or a waiting caller, spins.
    spin: Duration,
}

/// One call's tasks. Workers may hold it after the call has returned (it is reference
/// counted), but by then every index is claimed, so they never reach the closure.
struct Job {
    /// The caller's closure, its lifetime erased; see [`Job::work`] for when it is called.
    f: *const (dyn Fn(usize) + Sync + 'static),
    tasks: usize,
    /// The next unclaimed index (it runs past `tasks` as threads find nothing left).
    next: AtomicUsize,
    /// Tasks ended, with or without a panic.
    done: AtomicUsize,
    /// The first panic of a task.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    /// Set once the caller stops spinning and sleeps on `finished`.
    caller_asleep: AtomicBool,
    finished_lock: Mutex<()>,
    finished: Condvar,
}

// SAFETY: the only field that is not `Send` is `f`, a pointer to a `Sync` closure: calling it
// through a shared reference from any thread is what `Sync` allows, and it is dereferenced
// only while its owner is blocked in `Pool::run` (see `Job::work`).
unsafe impl Send for Job {}
// SAFETY: as for `Send`; every other field is an atomic, a lock or immutable.
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs tasks until none is left; returns at once for a job already finished.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tasks {
                return;
            }
            // SAFETY: this thread alone claimed `i < tasks`, so task `i` has not ended and
            // `done < tasks`. `Pool::run` returns (or unwinds) only once `done == tasks`, which
            // takes this task's increment below, so the closure is still alive.
            let f = unsafe { &*self.f };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                lock(&self.panic).get_or_insert(payload);
            }
            // Release: the task's writes are visible to the caller once it sees `done == tasks`.
            // SeqCst: against the caller's `caller_asleep` store (see `Pool::run`).
            if self.done.fetch_add(1, Ordering::SeqCst) + 1 == self.tasks
                && self.caller_asleep.load(Ordering::SeqCst)
            {
                let _guard = lock(&self.finished_lock);
                self.finished.notify_one();
            }
        }
    }
}

impl Pool {
    /// A pool of `threads - 1` workers (the caller is the other thread) that spin for `spin`.
    fn new(threads: usize, spin: Duration) -> Self {
        let shared = Arc::new(Shared {
            busy: AtomicBool::new(false),
            slot: RwLock::new((0, None)),
            posted: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            sleep: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            spin,
        });
        let workers = (1..threads)
            .map_while(|i| {
                let shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name(format!("burn-mapped-{i}"))
                    .spawn(move || worker(&shared));
                // Fewer workers still run every task: the caller claims what is left.
                spawned
                    .inspect_err(|e| log::warn!("burn-mapped pool: worker {i} not started: {e}"))
                    .ok()
            })
            .collect();
        Pool { shared, workers }
    }

    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        if tasks <= 1
            || self.workers.is_empty()
            || sh
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            (0..tasks).for_each(f);
            return;
        }
        let busy = Busy(&sh.busy);
        let f: *const (dyn Fn(usize) + Sync + '_) = f;
        // SAFETY: only the trait object's lifetime bound changes (same pointer layout). The
        // job calls the closure only for claimed indices below `tasks` (see `Job::work`), and
        // this function returns or unwinds only after `done == tasks`, once every such call
        // has returned, so no call outlives the borrow.
        let f = unsafe {
            std::mem::transmute::<
                *const (dyn Fn(usize) + Sync + '_),
                *const (dyn Fn(usize) + Sync + 'static),
            >(f)
        };
        let job = Arc::new(Job {
            f,
            tasks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            caller_asleep: AtomicBool::new(false),
            finished_lock: Mutex::new(()),
            finished: Condvar::new(),
        });
        {
            let mut slot = sh.slot.write().unwrap_or_else(PoisonError::into_inner);
            slot.0 += 1;
            slot.1 = Some(Arc::clone(&job));
            // SeqCst: against a parking worker's `parked` increment (see `Shared::park`).
            sh.posted.store(slot.0, Ordering::SeqCst);
        }
        let parked = sh.parked.load(Ordering::SeqCst);
        if parked > 0 {
            let _guard = lock(&sh.sleep);
            for _ in 0..parked.min(tasks - 1) {
                sh.wake.notify_one();
            }
        }
        job.work();
        let mut spin = Spin::new(sh.spin);
        while job.done.load(Ordering::Acquire) < tasks {
            if !spin.tick() {
                let mut guard = lock(&job.finished_lock);
                // SeqCst: either the last task's `done` increment is followed by a load that
                // sees this flag (and notifies under the lock), or the load below sees it.
                job.caller_asleep.store(true, Ordering::SeqCst);
                while job.done.load(Ordering::SeqCst) < tasks {
                    guard = job
                        .finished
                        .wait(guard)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                break;
            }
        }
        let panic = lock(&job.panic).take();
        drop(busy);
        if let Some(payload) = panic {
            resume_unwind(payload);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let sh = &*self.shared;
        sh.stop.store(true, Ordering::SeqCst);
        {
            let mut slot = sh.slot.write().unwrap_or_else(PoisonError::into_inner);
            slot.0 += 1;
            sh.posted.store(slot.0, Ordering::SeqCst);
        }
        {
            let _guard = lock(&sh.sleep);
            sh.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// Frees the pool for the next job when the owning call ends.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

fn worker(sh: &Shared) {
    let mut seen = 0;
    loop {
        sh.wait(seen);
        if sh.stop.load(Ordering::SeqCst) {
            return;
        }
        let (posted, job) = {
            let slot = sh.slot.read().unwrap_or_else(PoisonError::into_inner);
            (slot.0, slot.1.clone())
        };
        seen = posted;
        if let Some(job) = job {
            job.work();
        }
    }
}

impl Shared {
    /// Returns once a job newer than `seen` is posted: spins first, then sleeps.
    fn wait(&self, seen: usize) {
        let mut spin = Spin::new(self.spin);
        while self.posted.load(Ordering::Acquire) == seen {
            if !spin.tick() {
                self.park(seen);
                return;
            }
        }
    }

    fn park(&self, seen: usize) {
        let mut guard = lock(&self.sleep);
        // SeqCst: a caller posting a job either loads `parked` after this increment (and then
        // notifies under `sleep`, which it cannot take before this thread waits), or posted
        // before it, and the load below sees the job.
        self.parked.fetch_add(1, Ordering::SeqCst);
        while self.posted.load(Ordering::SeqCst) == seen {
            guard = self
                .wake
                .wait(guard)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A bounded spin: a few tens of ns per [`tick`](Spin::tick), with a look at the clock every
/// [`SPINS_PER_CLOCK`] ticks.
struct Spin {
    start: Instant,
    last: Instant,
    window: Duration,
    spins: u32,
}

impl Spin {
    fn new(window: Duration) -> Self {
        let now = Instant::now();
        Spin {
            start: now,
            last: now,
            window,
            spins: 0,
        }
    }

    /// Spins once; false once the window has passed or the thread was descheduled.
    fn tick(&mut self) -> bool {
        std::hint::spin_loop();
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CLOCK) {
            return true;
        }
        let now = Instant::now();
        let go_on = now - self.start < self.window && now - self.last < PREEMPTED;
        self.last = now;
        go_on
    }
}

/// Locks a mutex whose data a panic cannot leave inconsistent (tasks run outside every lock).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many times each index ran.
    fn counts(run: impl FnOnce(usize, &(dyn Fn(usize) + Sync)), tasks: usize) -> Vec<usize> {
        let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
        run(tasks, &|i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        hits.into_iter().map(AtomicUsize::into_inner).collect()
    }

    #[test]
    fn every_index_runs_exactly_once() {
        let pool = Pool::new(4, SPIN);
        for tasks in [0, 1, 2, 3, 100, 1000] {
            assert_eq!(counts(|n, f| pool.run(n, f), tasks), vec![1; tasks]);
            assert_eq!(counts(run, tasks), vec![1; tasks], "the process's pool");
        }
    }

    #[test]
    fn concurrent_and_nested_callers_all_complete() {
        let pool = Pool::new(4, SPIN);
        std::thread::scope(|s| {
            for caller in 0..4 {
                let pool = &pool;
                s.spawn(move || {
                    for round in 0..200 {
                        let tasks = 1 + (caller * 7 + round) % 40;
                        assert_eq!(counts(|n, f| pool.run(n, f), tasks), vec![1; tasks]);
                        assert_eq!(counts(run, tasks), vec![1; tasks]);
                    }
                });
            }
        });
        // A task that calls the pool again runs the inner job on its own thread.
        let inner: Vec<AtomicUsize> = (0..8 * 8).map(|_| AtomicUsize::new(0)).collect();
        pool.run(8, &|i| {
            pool.run(8, &|j| {
                inner[i * 8 + j].fetch_add(1, Ordering::Relaxed);
            });
        });
        assert!(inner.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn a_panicking_task_is_resumed_on_the_caller() {
        let pool = Pool::new(4, SPIN);
        for panicking in [0, 5, 15] {
            let ran = AtomicUsize::new(0);
            let result = catch_unwind(AssertUnwindSafe(|| {
                pool.run(16, &|i| {
                    ran.fetch_add(1, Ordering::Relaxed);
                    // Slow enough that the workers take some of the tasks.
                    std::thread::sleep(Duration::from_micros(100));
                    if i == panicking {
                        panic!("task {i}");
                    }
                })
            }));
            let payload = result.expect_err("the panic reaches the caller");
            assert_eq!(
                payload.downcast_ref::<String>(),
                Some(&format!("task {panicking}"))
            );
            assert_eq!(ran.load(Ordering::Relaxed), 16, "the other tasks still ran");
            assert_eq!(counts(|n, f| pool.run(n, f), 100), vec![1; 100]);
        }
    }

    /// Workers that slept past the spin window wake for the next job and take its tasks: each
    /// task waits until all have started, which needs every thread of the pool.
    #[test]
    fn parked_workers_wake_and_take_tasks() {
        let threads = 4;
        let spin = Duration::from_micros(200);
        let pool = Pool::new(threads, spin);
        for _ in 0..3 {
            assert_eq!(counts(|n, f| pool.run(n, f), 10), vec![1; 10]);
            let deadline = Instant::now() + Duration::from_secs(10);
            while pool.shared.parked.load(Ordering::SeqCst) < threads - 1 {
                assert!(Instant::now() < deadline, "workers never parked");
                std::thread::sleep(spin);
            }
            let started = AtomicUsize::new(0);
            let all_met = AtomicUsize::new(0);
            pool.run(threads, &|_| {
                started.fetch_add(1, Ordering::SeqCst);
                let deadline = Instant::now() + Duration::from_secs(10);
                while started.load(Ordering::SeqCst) < threads && Instant::now() < deadline {
                    std::thread::yield_now();
                }
                if started.load(Ordering::SeqCst) == threads {
                    all_met.fetch_add(1, Ordering::SeqCst);
                }
            });
            assert_eq!(all_met.load(Ordering::SeqCst), threads);
        }
    }

    /// A caller whose workers' tasks outlast its spin sleeps until the last one wakes it.
    #[test]
    fn a_caller_outwaiting_its_spin_is_woken() {
        let pool = Pool::new(3, Duration::from_micros(100));
        let hits: Vec<AtomicUsize> = (0..6).map(|_| AtomicUsize::new(0)).collect();
        pool.run(6, &|i| {
            std::thread::sleep(Duration::from_millis(if i % 2 == 0 { 1 } else { 20 }));
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn threads_is_positive() {
        assert!(threads() >= 1);
    }
}
