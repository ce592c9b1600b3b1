//! The parking lot: where idle plain-TCP connections wait without a task (hibernation).
//!
//! A connection that has had nothing to do for `mqtt.idle_hibernate_ms` (no input, nothing to
//! write, no wake-up, nothing buffered or waiting for the store) leaves its tokio task: its
//! state goes into one box here, its socket leaves tokio's reactor and is watched by this
//! lot's own epoll instance (mio), on one thread. The task's memory (its future, the
//! reactor's per-socket registration) is given back; an idle connection then costs its boxed
//! state, a slot here and its session (docs/benchmarks.md, "Idle connections").
//!
//! A parked connection is resumed — handed back to the runtime as a new task — by the first
//! of: input on its socket (or its end), a wake-up of its [`ConnWaker`] (a delivery, a kick, a
//! shutdown: the parked connection's waker is this lot's), or its keep-alive deadline.
//!
//! This module imports nothing of the connection layer: what it parks is a [`Parked`].
//!
//! Invariants:
//! - a parked connection is in exactly one slot until an event takes it out, and is resumed
//!   exactly once; the token of a slot carries its generation, so a late event for a
//!   connection that already left never resumes the one that took its slot;
//! - its socket is registered with the lot's epoll only while it is in its slot (deregistered
//!   before it is resumed, so the runtime's reactor can take it again);
//! - a wake-up that came before the lot's waker was installed is not lost: [`Lot::park`]
//!   checks the [`ConnWaker`]'s permit after installing it;
//! - the lot's lock is a leaf: nothing is called while it is held (a [`ConnWaker`] may wake
//!   the lot under a session lock).

use crate::waker::ConnWaker;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::task::{Wake, Waker};
use std::time::Instant;

/// A connection that can wait in the lot.
pub trait Parked: Send {
    /// The socket whose input resumes it.
    fn fd(&self) -> RawFd;
    /// When it must be resumed even if nothing happens (its keep-alive deadline).
    fn deadline(&self) -> Option<Instant>;
    /// Serve it again: spawn its task on `handle`.
    fn resume(self: Box<Self>, handle: &tokio::runtime::Handle);
}

/// The token reserved for the lot's own waker.
const WAKE_TOKEN: Token = Token(usize::MAX);

/// A broker's parking lot. Its thread starts with the first connection parked.
#[derive(Default)]
pub struct Lot {
    shared: OnceLock<Arc<Shared>>,
}

struct Shared {
    registry: Registry,
    waker: mio::Waker,
    handle: tokio::runtime::Handle,
    state: Mutex<State>,
    stop: AtomicBool,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Tokens whose connection waker was woken, for the lot's thread.
    woken: Vec<u64>,
    /// Keep-alive deadlines, earliest first; entries of connections that left stay until
    /// they come due or the heap is rebuilt.
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    parked: usize,
}

#[derive(Default)]
struct Slot {
    generation: u32,
    conn: Option<Box<dyn Parked>>,
}

fn token_of(index: u32, generation: u32) -> u64 {
    (u64::from(generation) << 32) | u64::from(index)
}

impl State {
    /// Takes the connection a token names, if it is still there.
    fn take(&mut self, token: u64) -> Option<Box<dyn Parked>> {
        let index = (token & 0xffff_ffff) as u32;
        let slot = self.slots.get_mut(index as usize)?;
        if u64::from(slot.generation) != token >> 32 {
            return None;
        }
        let conn = slot.conn.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.parked -= 1;
        Some(conn)
    }

    fn insert(&mut self, conn: Box<dyn Parked>) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        let token = token_of(index, slot.generation);
        if let Some(at) = conn.deadline() {
            self.deadlines.push(Reverse((at, token)));
        }
        slot.conn = Some(conn);
        self.parked += 1;
        token
    }

    /// Drops the deadlines of connections that left, once they are a third of the heap
    /// (amortised O(1) per parking).
    fn compact_deadlines(&mut self) {
        if self.deadlines.len() <= self.parked + self.parked / 2 + 1024 {
            return;
        }
        let slots = &self.slots;
        self.deadlines.retain(|Reverse((_, token))| {
            let slot = &slots[(token & 0xffff_ffff) as usize];
            u64::from(slot.generation) == token >> 32 && slot.conn.is_some()
        });
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The waker a parked connection's [`ConnWaker`] holds.
struct ParkWake {
    shared: Weak<Shared>,
    token: u64,
}

impl Wake for ParkWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(shared) = self.shared.upgrade() {
            lock(&shared.state).woken.push(self.token);
            let _ = shared.waker.wake();
        }
    }
}

impl Lot {
    pub fn new() -> Lot {
        Lot::default()
    }

    /// Connections parked now.
    pub fn parked(&self) -> usize {
        self.shared.get().map_or(0, |s| lock(&s.state).parked)
    }

    /// Parks `conn`, whose wake-ups go through `waker`. Called from a task of the runtime the
    /// connection is resumed on. On an error (the lot's epoll could not be set up or take the
    /// socket) the connection is given back, unparked.
    pub fn park(
        &self,
        conn: Box<dyn Parked>,
        waker: &ConnWaker,
    ) -> Result<(), (Box<dyn Parked>, std::io::Error)> {
        let shared = match self.shared() {
            Ok(s) => s,
            Err(e) => return Err((conn, e)),
        };
        let fd = conn.fd();
        let token = lock(&shared.state).insert(conn);
        let registered = shared.registry.register(
            &mut SourceFd(&fd),
            Token(token as usize),
            Interest::READABLE,
        );
        if let Err(e) = registered {
            // Still in its slot: nothing else can have taken it (no event, no waker yet).
            let conn = lock(&shared.state).take(token);
            return match conn {
                Some(c) => Err((c, e)),
                None => Ok(()),
            };
        }
        let park_waker = Waker::from(Arc::new(ParkWake {
            shared: Arc::downgrade(shared),
            token,
        }));
        waker.set_waker(park_waker.clone());
        if waker.is_notified() {
            // A wake-up the connection had not taken yet, or one that came before this
            // waker was installed: resume at once.
            park_waker.wake();
        }
        // The lot's thread may sleep until a later deadline than this one.
        let _ = shared.waker.wake();
        Ok(())
    }

    fn shared(&self) -> std::io::Result<&Arc<Shared>> {
        if let Some(s) = self.shared.get() {
            return Ok(s);
        }
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let waker = mio::Waker::new(poll.registry(), WAKE_TOKEN)?;
        let handle = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let shared = Arc::new(Shared {
            registry,
            waker,
            handle,
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        if self.shared.set(shared.clone()).is_err() {
            // Another connection started the lot first; this one's poll is dropped unused.
            return self
                .shared
                .get()
                .ok_or_else(|| std::io::Error::other("parking lot"));
        }
        let weak = Arc::downgrade(&shared);
        drop(shared);
        std::thread::Builder::new()
            .name("lanemq-park".into())
            .spawn(move || run(poll, weak))?;
        self.shared
            .get()
            .ok_or_else(|| std::io::Error::other("parking lot"))
    }
}

impl Drop for Lot {
    fn drop(&mut self) {
        if let Some(s) = self.shared.get() {
            s.stop.store(true, Ordering::Release);
            let _ = s.waker.wake();
        }
    }
}

/// The lot's thread: waits for input, wake-ups and deadlines, and resumes the connections
/// they name. Ends when the lot is dropped.
fn run(mut poll: Poll, shared: Weak<Shared>) {
    let mut events = Events::with_capacity(1024);
    let mut due: Vec<u64> = Vec::new();
    loop {
        let timeout = {
            let Some(s) = shared.upgrade() else { return };
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            let next = lock(&s.state).deadlines.peek().map(|Reverse((at, _))| *at);
            next.map(|at| at.saturating_duration_since(Instant::now()))
        };
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!(error = %e, "parking lot: poll failed");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            continue;
        }
        let Some(s) = shared.upgrade() else { return };
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        due.clear();
        due.extend(
            events
                .iter()
                .map(|e| e.token())
                .filter(|t| *t != WAKE_TOKEN)
                .map(|t| t.0 as u64),
        );
        let mut resumed: Vec<Box<dyn Parked>> = Vec::new();
        {
            let mut st = lock(&s.state);
            due.append(&mut st.woken);
            let now = Instant::now();
            while let Some(Reverse((at, token))) = st.deadlines.peek().copied() {
                if at > now {
                    break;
                }
                st.deadlines.pop();
                due.push(token);
            }
            for &token in &due {
                if let Some(c) = st.take(token) {
                    resumed.push(c);
                }
            }
            st.compact_deadlines();
        }
        for conn in resumed {
            let fd = conn.fd();
            let _ = s.registry.deregister(&mut SourceFd(&fd));
            conn.resume(&s.handle);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    struct Probe {
        stream: std::net::TcpStream,
        deadline: Option<Instant>,
        resumed: Arc<AtomicUsize>,
    }

    impl Parked for Probe {
        fn fd(&self) -> RawFd {
            self.stream.as_raw_fd()
        }
        fn deadline(&self) -> Option<Instant> {
            self.deadline
        }
        fn resume(self: Box<Self>, _: &tokio::runtime::Handle) {
            self.resumed.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        s.set_nonblocking(true).expect("nonblocking");
        (s, c)
    }

    async fn until(n: &AtomicUsize, want: usize) {
        for _ in 0..200 {
            if n.load(Ordering::SeqCst) >= want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("resumed {} times, want {want}", n.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn input_wake_up_and_deadline_each_resume_once() {
        let lot = Lot::new();
        let resumed = Arc::new(AtomicUsize::new(0));
        // Input.
        let (s1, mut c1) = pair();
        let w1 = ConnWaker::new();
        let p = Box::new(Probe {
            stream: s1,
            deadline: None,
            resumed: resumed.clone(),
        });
        assert!(lot.park(p, &w1).is_ok());
        assert_eq!(lot.parked(), 1);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(resumed.load(Ordering::SeqCst), 0, "nothing happened yet");
        c1.write_all(b"x").expect("write");
        until(&resumed, 1).await;
        assert_eq!(lot.parked(), 0);
        // A wake-up of its connection waker.
        let (s2, _c2) = pair();
        let w2 = ConnWaker::new();
        let p = Box::new(Probe {
            stream: s2,
            deadline: None,
            resumed: resumed.clone(),
        });
        assert!(lot.park(p, &w2).is_ok());
        w2.notify_one();
        until(&resumed, 2).await;
        // A notification before parking is not lost.
        let (s3, _c3) = pair();
        let w3 = ConnWaker::new();
        w3.notify_one();
        let p = Box::new(Probe {
            stream: s3,
            deadline: None,
            resumed: resumed.clone(),
        });
        assert!(lot.park(p, &w3).is_ok());
        until(&resumed, 3).await;
        // The deadline.
        let (s4, _c4) = pair();
        let w4 = ConnWaker::new();
        let p = Box::new(Probe {
            stream: s4,
            deadline: Some(Instant::now() + Duration::from_millis(50)),
            resumed: resumed.clone(),
        });
        assert!(lot.park(p, &w4).is_ok());
        until(&resumed, 4).await;
        // Late wake-ups of connections that left resume nothing.
        w1.notify_one();
        w2.notify_one();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(resumed.load(Ordering::SeqCst), 4);
        assert_eq!(lot.parked(), 0);
    }
}
