//! The file-system seam: everything the log does to disk goes through [`Fs`] and
//! [`LogFile`], so tests can fail, tear and crash it.
//!
//! - [`StdFs`] is the real thing (`std::fs`, positional `pread`/`pwrite`, `fdatasync`,
//!   directory fsync).
//! - [`MemFs`] keeps files in memory with a model of what is durable: a file's bytes are
//!   durable as of its last `sync_data`, a directory's entries (creations, renames,
//!   removals) as of its last `sync_dir`. [`MemFs::crash`] returns a new file system holding
//!   only the durable state, and makes every handle of the old one fail, as if the process
//!   died. Faults: fail the Nth write or fsync, tear the Nth write after N bytes (those bytes
//!   count as reached the disk), or stop the world after the Nth mutating operation.
//!
//! Invariant for implementors: `write_all_at` either writes every byte or returns an error;
//! a short write is reported, never silent.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// One open file, shared between the writer thread and readers (all methods take `&self`).
pub trait LogFile: Send + Sync + fmt::Debug {
    /// Reads exactly `buf.len()` bytes at `pos` (an error if the file is shorter).
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()>;
    /// Writes all of `buf` at `pos`, extending the file if needed.
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()>;
    /// `fdatasync`: makes the file's data durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends the file.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn size(&self) -> io::Result<u64>;
}

/// The directory operations the log needs.
pub trait Fs: Send + Sync + fmt::Debug {
    /// `mkdir -p`.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names of the entries of `dir` (files only), unsorted.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Opens a file for reading and writing; `create` makes it if missing (and then it is
    /// durable only after [`Fs::sync_dir`] of its directory).
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>>;
    /// Opens a file for reading only (offline tools).
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn LogFile>>;
    /// Removes a file.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames `from` over `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory's entries durable (fsync of the directory).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
}

// ---------------------------------------------------------------------------------------
// std::fs
// ---------------------------------------------------------------------------------------

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFs;

#[derive(Debug)]
struct StdFile(std::fs::File);

#[cfg(unix)]
impl LogFile for StdFile {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(&self.0, buf, pos)
    }
    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, buf, pos)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }
}

impl Fs for StdFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_type()?.is_file() {
                if let Some(n) = e.file_name().to_str() {
                    out.push(n.to_owned());
                }
            }
        }
        Ok(out)
    }
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(StdFile(f)))
    }
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        Ok(Arc::new(StdFile(std::fs::File::open(path)?)))
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        std::fs::File::open(dir)?.sync_all()
    }
}

// ---------------------------------------------------------------------------------------
// In-memory, fault-injecting
// ---------------------------------------------------------------------------------------

/// Faults to inject into a [`MemFs`]. Counters are 1-based and count from when the plan is
/// set ([`MemFs::set_faults`]).
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// The Nth `write_all_at` fails without writing anything.
    pub fail_write: Option<u64>,
    /// The Nth `sync_data` (or `sync_dir`) fails. The data stays in memory but is not
    /// made durable.
    pub fail_sync: Option<u64>,
    /// The Nth `write_all_at` writes only its first `.1` bytes, which count as durable (they
    /// reached the disk before the power went), then fails.
    pub torn_write: Option<(u64, usize)>,
    /// After the Nth mutating operation (write, set_len, sync, create, rename, remove)
    /// completes, every later operation fails: the process is dead. Combine with
    /// [`MemFs::crash`].
    pub stop_after_ops: Option<u64>,
}

#[derive(Debug, Default)]
struct MemFileData {
    data: Vec<u8>,
    durable: Vec<u8>,
}

#[derive(Debug, Default)]
struct Dir {
    /// Current entries.
    live: BTreeMap<PathBuf, Arc<MemFileNode>>,
    /// Entries as of the last `sync_dir`.
    durable: BTreeMap<PathBuf, Arc<MemFileNode>>,
}

/// The shared inode: what a crash keeps of a file is its `durable` bytes.
#[derive(Debug, Default)]
struct MemFileNode {
    data: Mutex<MemFileData>,
}

#[derive(Debug, Default)]
struct Counters {
    writes: u64,
    syncs: u64,
    ops: u64,
}

#[derive(Debug, Default)]
struct MemShared {
    dirs: Mutex<BTreeMap<PathBuf, Dir>>,
    known_dirs: Mutex<BTreeSet<PathBuf>>,
    faults: Mutex<(Faults, Counters)>,
    dead: AtomicBool,
    sync_gate: Mutex<bool>,
    sync_gate_cv: Condvar,
    total_syncs: AtomicU64,
    total_writes: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a MemFs lock is a test failure already; keep going with the data.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn dead_err() -> io::Error {
    io::Error::other("memfs: process crashed (injected)")
}

impl MemShared {
    fn check_alive(&self) -> io::Result<()> {
        if self.dead.load(Ordering::SeqCst) {
            Err(dead_err())
        } else {
            Ok(())
        }
    }

    /// Counts one mutating op; kills the fs after it if the plan says so. Returns an error
    /// if the fs was already dead.
    fn count_op(&self) -> io::Result<()> {
        self.check_alive()?;
        let mut g = lock(&self.faults);
        let (f, c) = &mut *g;
        c.ops += 1;
        if f.stop_after_ops == Some(c.ops) {
            self.dead.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// An in-memory file system with a durability model and fault injection (tests only, but
/// public so that the broker's tests can use it too).
#[derive(Debug, Clone, Default)]
pub struct MemFs {
    shared: Arc<MemShared>,
}

#[derive(Debug)]
struct MemHandle {
    node: Arc<MemFileNode>,
    fs: Arc<MemShared>,
    writable: bool,
    path: PathBuf,
}

impl MemFs {
    /// An empty file system.
    pub fn new() -> MemFs {
        MemFs::default()
    }

    /// Replaces the fault plan and restarts its counters.
    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.shared.faults) = (faults, Counters::default());
    }

    /// Mutating operations counted since the last [`Self::set_faults`].
    pub fn ops(&self) -> u64 {
        lock(&self.shared.faults).1.ops
    }

    /// Total `sync_data` calls that succeeded since creation.
    pub fn syncs(&self) -> u64 {
        self.shared.total_syncs.load(Ordering::SeqCst)
    }

    /// Total `write_all_at` calls since creation.
    pub fn writes(&self) -> u64 {
        self.shared.total_writes.load(Ordering::SeqCst)
    }

    /// While held, every `sync_data` blocks (to fill the submission queue in tests).
    pub fn hold_syncs(&self, hold: bool) {
        *lock(&self.shared.sync_gate) = hold;
        self.shared.sync_gate_cv.notify_all();
    }

    /// True once a `stop_after_ops` fault has fired or [`Self::crash`] was called.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::SeqCst)
    }

    /// Simulates a power loss: returns a new file system with only what was durable
    /// (synced file bytes, synced directory entries); every handle of `self` fails from
    /// now on.
    pub fn crash(&self) -> MemFs {
        self.shared.dead.store(true, Ordering::SeqCst);
        let next = MemFs::new();
        let dirs = lock(&self.shared.dirs);
        let mut new_dirs = lock(&next.shared.dirs);
        for (dpath, dir) in dirs.iter() {
            let mut nd = Dir::default();
            for (name, node) in &dir.durable {
                let durable = lock(&node.data).durable.clone();
                let n = Arc::new(MemFileNode {
                    data: Mutex::new(MemFileData {
                        data: durable.clone(),
                        durable,
                    }),
                });
                nd.live.insert(name.clone(), n.clone());
                nd.durable.insert(name.clone(), n);
            }
            new_dirs.insert(dpath.clone(), nd);
        }
        drop(new_dirs);
        *lock(&next.shared.known_dirs) = lock(&self.shared.known_dirs).clone();
        next
    }

    /// Bytes of a file as the process sees them (tests poke at these).
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let (dir, name) = split(path)?;
        let dirs = lock(&self.shared.dirs);
        let node = dirs.get(&dir)?.live.get(&name)?;
        let data = lock(&node.data).data.clone();
        Some(data)
    }

    /// Overwrites a file's bytes, durably (to simulate corruption on disk).
    pub fn write_file(&self, path: &Path, bytes: &[u8]) -> bool {
        let Some((dir, name)) = split(path) else {
            return false;
        };
        let dirs = lock(&self.shared.dirs);
        let Some(node) = dirs.get(&dir).and_then(|d| d.live.get(&name)) else {
            return false;
        };
        let mut d = lock(&node.data);
        d.data = bytes.to_vec();
        d.durable = bytes.to_vec();
        true
    }
}

fn split(path: &Path) -> Option<(PathBuf, PathBuf)> {
    let dir = path.parent()?.to_path_buf();
    let name = PathBuf::from(path.file_name()?);
    Some((dir, name))
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("memfs: {} not found", path.display()),
    )
}

impl LogFile for MemHandle {
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> io::Result<()> {
        self.fs.check_alive()?;
        let d = lock(&self.node.data);
        let start = usize::try_from(pos).map_err(|_| io::Error::other("pos"))?;
        let end = start
            .checked_add(buf.len())
            .ok_or_else(|| io::Error::other("pos"))?;
        if end > d.data.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "memfs: read past end",
            ));
        }
        buf.copy_from_slice(&d.data[start..end]);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], pos: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other("memfs: read-only handle"));
        }
        self.fs.check_alive()?;
        self.fs.total_writes.fetch_add(1, Ordering::SeqCst);
        let (fail, torn) = {
            let mut g = lock(&self.fs.faults);
            let (f, c) = &mut *g;
            c.writes += 1;
            let fail = f.fail_write == Some(c.writes);
            let torn = match f.torn_write {
                Some((n, keep)) if n == c.writes => Some(keep.min(buf.len())),
                _ => None,
            };
            (fail, torn)
        };
        if fail {
            return Err(io::Error::other("memfs: injected write failure"));
        }
        let start = usize::try_from(pos).map_err(|_| io::Error::other("pos"))?;
        let mut d = lock(&self.node.data);
        let n = torn.unwrap_or(buf.len());
        if d.data.len() < start + n {
            d.data.resize(start + n, 0);
        }
        d.data[start..start + n].copy_from_slice(&buf[..n]);
        if torn.is_some() {
            // The torn prefix reached the platter: make exactly those bytes durable.
            let dl = d.durable.len();
            if dl < start + n {
                d.durable.resize(start + n, 0);
            }
            d.durable[start..start + n].copy_from_slice(&buf[..n]);
            drop(d);
            self.fs.dead.store(true, Ordering::SeqCst);
            return Err(io::Error::other("memfs: injected torn write"));
        }
        drop(d);
        self.fs.count_op()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.fs.check_alive()?;
        {
            let mut held = lock(&self.fs.sync_gate);
            while *held {
                held = self
                    .fs
                    .sync_gate_cv
                    .wait(held)
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
        let fail = {
            let mut g = lock(&self.fs.faults);
            let (f, c) = &mut *g;
            c.syncs += 1;
            f.fail_sync == Some(c.syncs)
        };
        if fail {
            return Err(io::Error::other(format!(
                "memfs: injected fsync failure on {}",
                self.path.display()
            )));
        }
        self.fs.check_alive()?;
        {
            let mut d = lock(&self.node.data);
            d.durable = d.data.clone();
        }
        self.fs.total_syncs.fetch_add(1, Ordering::SeqCst);
        self.fs.count_op()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        if !self.writable {
            return Err(io::Error::other("memfs: read-only handle"));
        }
        self.fs.check_alive()?;
        let len = usize::try_from(len).map_err(|_| io::Error::other("len"))?;
        lock(&self.node.data).data.resize(len, 0);
        self.fs.count_op()
    }

    fn size(&self) -> io::Result<u64> {
        self.fs.check_alive()?;
        Ok(lock(&self.node.data).data.len() as u64)
    }
}

impl Fs for MemFs {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.shared.check_alive()?;
        lock(&self.shared.known_dirs).insert(dir.to_path_buf());
        lock(&self.shared.dirs)
            .entry(dir.to_path_buf())
            .or_default();
        Ok(())
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.shared.check_alive()?;
        let dirs = lock(&self.shared.dirs);
        let d = dirs.get(dir).ok_or_else(|| not_found(dir))?;
        Ok(d.live
            .keys()
            .filter_map(|k| k.to_str().map(str::to_owned))
            .collect())
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn LogFile>> {
        self.shared.check_alive()?;
        let (dir, name) = split(path).ok_or_else(|| not_found(path))?;
        let mut dirs = lock(&self.shared.dirs);
        let d = dirs.get_mut(&dir).ok_or_else(|| not_found(&dir))?;
        let node = match d.live.get(&name) {
            Some(n) => n.clone(),
            None if create => {
                let n = Arc::new(MemFileNode::default());
                d.live.insert(name, n.clone());
                drop(dirs);
                self.shared.count_op()?;
                n
            }
            None => return Err(not_found(path)),
        };
        Ok(Arc::new(MemHandle {
            node,
            fs: self.shared.clone(),
            writable: true,
            path: path.to_path_buf(),
        }))
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn LogFile>> {
        self.shared.check_alive()?;
        let (dir, name) = split(path).ok_or_else(|| not_found(path))?;
        let dirs = lock(&self.shared.dirs);
        let node = dirs
            .get(&dir)
            .and_then(|d| d.live.get(&name))
            .ok_or_else(|| not_found(path))?
            .clone();
        Ok(Arc::new(MemHandle {
            node,
            fs: self.shared.clone(),
            writable: false,
            path: path.to_path_buf(),
        }))
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.shared.check_alive()?;
        let (dir, name) = split(path).ok_or_else(|| not_found(path))?;
        {
            let mut dirs = lock(&self.shared.dirs);
            let d = dirs.get_mut(&dir).ok_or_else(|| not_found(&dir))?;
            d.live.remove(&name).ok_or_else(|| not_found(path))?;
        }
        self.shared.count_op()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.shared.check_alive()?;
        let (fdir, fname) = split(from).ok_or_else(|| not_found(from))?;
        let (tdir, tname) = split(to).ok_or_else(|| not_found(to))?;
        {
            let mut dirs = lock(&self.shared.dirs);
            let node = dirs
                .get_mut(&fdir)
                .and_then(|d| d.live.remove(&fname))
                .ok_or_else(|| not_found(from))?;
            dirs.get_mut(&tdir)
                .ok_or_else(|| not_found(&tdir))?
                .live
                .insert(tname, node);
        }
        self.shared.count_op()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.shared.check_alive()?;
        let fail = {
            let mut g = lock(&self.shared.faults);
            let (f, c) = &mut *g;
            c.syncs += 1;
            f.fail_sync == Some(c.syncs)
        };
        if fail {
            return Err(io::Error::other("memfs: injected directory fsync failure"));
        }
        {
            let mut dirs = lock(&self.shared.dirs);
            let d = dirs.get_mut(dir).ok_or_else(|| not_found(dir))?;
            d.durable = d.live.clone();
        }
        self.shared.count_op()
    }
}
