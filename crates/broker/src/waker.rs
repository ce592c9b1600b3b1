//! [`ConnWaker`]: how anything that has news for a connection task (a delivery pushed into its
//! session, a kick, a store completion, the end of a retention carry) wakes it. A types-layer
//! file: it imports nothing of the crate, so sessions, the index thread and the connections
//! can all hold one.
//!
//! Invariant: a notification is never lost — one that arrives with no waiter is kept as the
//! permit, and several coalesce into one wake-up.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// Wakes a connection task (new deliveries, a kick, a store completion): a permit and the
/// waiting task's waker. It behaves as `tokio::sync::Notify` does with `notify_one` and one
/// waiter (a notification with no waiter is kept as the permit; several coalesce), but the
/// waiting future is one pointer instead of an intrusive list node: a connection waits on it
/// in every `select!`, and an idle connection's future is most of its memory.
#[derive(Debug, Default)]
pub struct ConnWaker {
    permit: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl ConnWaker {
    pub fn new() -> ConnWaker {
        ConnWaker::default()
    }

    /// Wake the waiting task, or let its next wait return at once.
    pub fn notify_one(&self) {
        if self.permit.swap(true, Ordering::AcqRel) {
            // Already notified: the waker was taken then, or the task has not waited since.
            return;
        }
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Installs the waker the next notification wakes (a parked connection's: see
    /// `crate::park`), in place of the last waiting task's.
    pub fn set_waker(&self, waker: Waker) {
        *self.waker.lock().unwrap_or_else(|e| e.into_inner()) = Some(waker);
    }

    /// A notification came that no wait has taken yet.
    pub fn is_notified(&self) -> bool {
        self.permit.load(Ordering::Acquire)
    }

    /// Completes once notified (at once if a notification came since the last wait).
    /// Cancel safe: a notification is consumed only when this returns `Ready`.
    pub fn notified(&self) -> Notified<'_> {
        Notified(self)
    }
}

/// The future of [`ConnWaker::notified`].
#[derive(Debug)]
pub struct Notified<'a>(&'a ConnWaker);

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let w = self.0;
        if w.permit.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        {
            let mut slot = w.waker.lock().unwrap_or_else(|e| e.into_inner());
            match &mut *slot {
                Some(old) if old.will_wake(cx.waker()) => {}
                other => *other = Some(cx.waker().clone()),
            }
        }
        // A notification between the first check and storing the waker found no waker.
        if w.permit.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
