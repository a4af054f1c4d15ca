//! Every wait of this process on the boot clock, on one `timerfd`.
//!
//! A wait on [`super::boot`]'s clock must end as soon as the host resumes past its deadline, which only a
//! timer on `CLOCK_BOOTTIME` does. A timerfd per wait cost each running job two more descriptors of the
//! worker (its watchdog's next renewal and its stop deadline) beside the three its child holds, and each
//! run waiting for a child slot one: the slots, sized for three per child, let a herd run the worker out of
//! descriptors, and every wait paid four system calls. So one thread owns one timerfd, armed for the
//! earliest deadline of all the waits, and wakes every wait whose deadline has passed when it fires. It
//! also looks at least once a second, so that even a timer that could not be armed (never seen) delays a
//! wait by a second at most, as the fallback of [`super::boot::sleep_until`] would.
//!
//! The timer is armed with a *relative* value (still counted on `CLOCK_BOOTTIME`, suspend included), not
//! an absolute deadline: libfaketime — which operators and our own chaos test use to skew a worker's wall
//! clock — shifts every absolute timer by the skew whatever its clock, so a worker set 2 s behind woke its
//! lease watchdog 2 s late and let a job outlive its lease. A relative value is left alone, and differs
//! from the absolute one only by the instant between reading the clock and arming the timer.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use super::boot::BootInstant;

/// The process's alarm: one timerfd and the waits it serves.
pub(crate) struct Alarm {
    timer: OwnedFd,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each pending wait by `(deadline, id)`: the waker of the task that waits.
    waits: BTreeMap<(BootInstant, u64), Waker>,
    next_id: u64,
    /// The deadline the timer is armed for, if it is.
    armed: Option<BootInstant>,
}

/// The process's alarm, started on first use; the error if no timerfd or thread could be made (then
/// the waits fall back to tokio timers, see [`super::boot::sleep_until`]).
pub(crate) fn shared() -> Result<&'static Alarm, &'static std::io::Error> {
    static ALARM: OnceLock<std::io::Result<Alarm>> = OnceLock::new();
    static RINGER: OnceLock<std::io::Result<()>> = OnceLock::new();
    let alarm = ALARM.get_or_init(Alarm::new).as_ref()?;
    let ringer = RINGER.get_or_init(|| {
        std::thread::Builder::new()
            .name("redcron-alarm".to_string())
            .spawn(move || alarm.ring())
            .map(drop)
    });
    ringer.as_ref().map(|()| alarm)
}

impl Alarm {
    fn new() -> std::io::Result<Alarm> {
        // SAFETY: plain syscall; the returned descriptor is checked and then owned by `OwnedFd`.
        let fd = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC)
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Alarm {
            // SAFETY: `fd` is a fresh descriptor that nothing else owns.
            timer: unsafe { OwnedFd::from_raw_fd(fd) },
            state: Mutex::new(State::default()),
        })
    }

    /// A future that is ready once the boot clock has reached `deadline`. Cancel-safe: dropping it
    /// withdraws its wait.
    pub(crate) fn sleep_until(&'static self, deadline: BootInstant) -> Sleep {
        Sleep {
            alarm: self,
            deadline,
            id: None,
        }
    }

    /// The alarm's thread: waits for the timer (a second at most), then wakes the waits that are due and
    /// arms the timer for the next one. Runs as long as the process.
    fn ring(&self) {
        loop {
            let mut ready = libc::pollfd {
                fd: self.timer.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd that we own, for the timerfd this alarm owns. Whatever it returns
            // (fired, a second passed, EINTR), the waits are looked at next.
            unsafe { libc::poll(&mut ready, 1, 1_000) };
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into a buffer of 8 from the non-blocking timerfd this alarm
            // owns; it only clears the expiration count (EAGAIN if the timer had not fired).
            unsafe {
                libc::read(
                    self.timer.as_raw_fd(),
                    expirations.as_mut_ptr().cast(),
                    expirations.len(),
                )
            };
            let due = {
                let mut state = self.lock();
                let now = BootInstant::now();
                let later = state.waits.split_off(&(now, u64::MAX));
                let due = std::mem::replace(&mut state.waits, later);
                state.armed = None;
                if let Some(&(next, _)) = state.waits.keys().next() {
                    self.arm(&mut state, next);
                }
                due
            };
            for waker in due.into_values() {
                // A waker of another executor that panicked must not stop every other wait's alarm.
                let _ = std::panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
            }
        }
    }

    /// Registers (or renews the waker of) the wait `id` for `deadline`, arming the timer earlier if
    /// it is the earliest.
    fn register(&self, deadline: BootInstant, id: Option<u64>, waker: &Waker) -> u64 {
        let mut state = self.lock();
        let id = id.unwrap_or_else(|| {
            state.next_id += 1;
            state.next_id
        });
        state.waits.insert((deadline, id), waker.clone());
        if state.armed.is_none_or(|armed| deadline < armed) {
            self.arm(&mut state, deadline);
        }
        id
    }

    fn withdraw(&self, deadline: BootInstant, id: u64) {
        self.lock().waits.remove(&(deadline, id));
    }

    /// Arms the timer to fire at `deadline` (at once if it has passed), relative to now.
    fn arm(&self, state: &mut State, deadline: BootInstant) {
        // An all-zero it_value disarms a timer: wait at least a nanosecond.
        let after = deadline.remaining().max(Duration::from_nanos(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `spec` is a valid itimerspec, the old value is not asked for, the fd is ours.
        let set = unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut())
        };
        // It cannot fail on a valid timerfd and value. If it did, the next registration tries again, and
        // the thread's look once a second serves the wait meanwhile.
        state.armed = (set == 0).then_some(deadline);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A wait on the boot clock ([`Alarm::sleep_until`]).
pub(crate) struct Sleep {
    alarm: &'static Alarm,
    deadline: BootInstant,
    /// Its id in the alarm, once it is registered.
    id: Option<u64>,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if BootInstant::now() >= self.deadline {
            if let Some(id) = self.id.take() {
                self.alarm.withdraw(self.deadline, id);
            }
            return Poll::Ready(());
        }
        let id = self.alarm.register(self.deadline, self.id, cx.waker());
        self.id = Some(id);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.alarm.withdraw(self.deadline, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_end_in_deadline_order_on_one_timer() {
        let alarm = shared().expect("a timerfd and a thread");
        let start = BootInstant::now();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let mut waits = tokio::task::JoinSet::new();
        for ms in [300u64, 100, 200] {
            let order = std::sync::Arc::clone(&order);
            waits.spawn(async move {
                alarm.sleep_until(start + Duration::from_millis(ms)).await;
                assert!(start.elapsed() >= Duration::from_millis(ms));
                order.lock().expect("not poisoned").push(ms);
            });
        }
        // A broken alarm fails the test instead of hanging it.
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(done) = waits.join_next().await {
                done.expect("a wait ended without panicking");
            }
        })
        .await
        .expect("every wait ended within 30 s");
        assert_eq!(*order.lock().expect("not poisoned"), vec![100, 200, 300]);
    }

    #[tokio::test]
    async fn a_dropped_wait_is_withdrawn() {
        let alarm = shared().expect("a timerfd and a thread");
        let far = BootInstant::now() + Duration::from_secs(3600);
        let woke = tokio::time::timeout(Duration::from_millis(20), alarm.sleep_until(far)).await;
        assert!(woke.is_err());
        let pending = alarm
            .lock()
            .waits
            .keys()
            .any(|(deadline, _)| *deadline == far);
        assert!(!pending, "the dropped wait is still registered");
    }
}
