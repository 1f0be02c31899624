//! The [`Disk`] trait over POSIX positional I/O on a directory.
//!
//! Each call runs on tokio's blocking pool. In [`IoMode::Direct`] files are opened with
//! `O_DIRECT` and the alignment comes from `statx(STATX_DIOALIGN)` on a probe file in the
//! directory: the device and filesystem decide it, nothing here assumes 4096.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mooring_proto::disk::{Disk, IoBuf, IoResult};
use mooring_proto::transport::BoxFuture;
use tracing::info;

use crate::aligned::check_aligned;
use crate::paths::resolve;

/// How file data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoMode {
    /// Through the page cache (alignment 1).
    Buffered,
    /// `O_DIRECT`: around the page cache, with the device's alignment.
    Direct,
}

/// A disk rooted at a directory.
#[derive(Clone)]
pub struct PosixDisk {
    root: Arc<PathBuf>,
    direct: bool,
    alignment: usize,
}

/// Name of the probe file used to learn the direct-I/O alignment.
const PROBE: &str = ".mooring-dio-probe";

impl PosixDisk {
    /// Opens (creating it if needed) the directory `root`. `IoMode::Direct` fails with
    /// `Unsupported` if the filesystem cannot do direct I/O or does not report its alignment.
    pub fn open(root: impl Into<PathBuf>, mode: IoMode) -> io::Result<PosixDisk> {
        let root = root.into();
        crate::paths::owner_only_dir(&root)?;
        let (direct, alignment) = match mode {
            IoMode::Buffered => (false, 1),
            IoMode::Direct => (true, dio_alignment(&root)?),
        };
        info!(root = %root.display(), direct, alignment, "disk opened");
        Ok(PosixDisk {
            root: Arc::new(root),
            direct,
            alignment,
        })
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn open_options(&self) -> OpenOptions {
        let mut options = OpenOptions::new();
        // Values are the users' data: new files are the owner's alone.
        options.mode(0o600);
        if self.direct {
            options.custom_flags(libc::O_DIRECT);
        }
        options
    }

    /// Runs `op` on the blocking pool.
    fn blocking<'a, T: Send + 'static>(
        &'a self,
        op: impl FnOnce(PosixDisk) -> io::Result<T> + Send + 'static,
    ) -> BoxFuture<'a, io::Result<T>> {
        let disk = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || op(disk))
                .await
                .map_err(io::Error::other)?
        })
    }
}

impl PosixDisk {
    /// Runs `op` on the blocking pool with `buf`, which the task owns until `op` returns
    /// (even if the caller stops waiting) and then hands back.
    fn blocking_with<'a, B: Default + Send + 'static, T: Send + 'static>(
        &'a self,
        buf: B,
        op: impl FnOnce(PosixDisk, &mut B) -> io::Result<T> + Send + 'static,
    ) -> BoxFuture<'a, (B, io::Result<T>)> {
        let disk = self.clone();
        Box::pin(async move {
            let task = tokio::task::spawn_blocking(move || {
                let mut buf = buf;
                let result = op(disk, &mut buf);
                (buf, result)
            });
            match task.await {
                Ok(done) => done,
                // The task panicked: the buffer went with it (dropped, or unwound).
                Err(e) => (Default::default(), Err(io::Error::other(e))),
            }
        })
    }

    /// Writes `bufs` back to back from `offset` with no copy (direct I/O writes them as they
    /// are: they are aligned, checked here), then `finish` shapes the result.
    fn write_bufs<'a, R: Send + 'static>(
        &'a self,
        name: &'a str,
        offset: u64,
        bufs: Vec<IoBuf>,
        finish: impl FnOnce(Vec<IoBuf>, io::Result<()>) -> R + Send + 'a,
    ) -> BoxFuture<'a, R> {
        let checked = bufs.iter().try_fold(offset, |at, buf| {
            check_aligned(self.alignment, at, buf.as_ptr(), buf.len())?;
            Ok::<_, io::Error>(at + buf.len() as u64)
        });
        if let Err(e) = checked {
            return Box::pin(async move { finish(bufs, Err(e)) });
        }
        let name = name.to_string();
        let write = self.blocking_with(bufs, move |disk, bufs| {
            let path = resolve(&disk.root, &name)?;
            let file = disk.open_options().write(true).open(&path)?;
            write_all_vectored_at(&file, bufs, offset)
        });
        Box::pin(async move {
            let (bufs, result) = write.await;
            finish(bufs, result)
        })
    }
}

/// The most segments one `pwritev` takes.
const IOV_MAX: usize = 1024;

/// Writes `bufs` back to back from `offset` with as few `pwritev` calls as possible (an
/// extending `O_DIRECT` write holds the inode's lock, so one large write beats many small).
fn write_all_vectored_at(file: &File, bufs: &[IoBuf], offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // (buffer, bytes of it already written)
    let mut next = 0;
    let mut skip = 0usize;
    let mut at = offset;
    while next < bufs.len() {
        let iov: Vec<libc::iovec> = bufs[next..]
            .iter()
            .enumerate()
            .filter(|(i, buf)| buf.len() > if *i == 0 { skip } else { 0 })
            .take(IOV_MAX)
            .map(|(i, buf)| {
                let from = if i == 0 { skip } else { 0 };
                libc::iovec {
                    iov_base: buf[from..].as_ptr() as *mut libc::c_void,
                    iov_len: buf.len() - from,
                }
            })
            .collect();
        if iov.is_empty() {
            break;
        }
        // SAFETY: every iovec points at live bytes of `bufs`, which this function borrows
        // for the call; pwritev only reads them.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                iov.as_ptr(),
                iov.len() as libc::c_int,
                at as libc::off_t,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the write made no progress",
            ));
        }
        // Advance past what was written.
        let mut left = n as usize;
        at += left as u64;
        while left > 0 && next < bufs.len() {
            let rest = bufs[next].len() - skip;
            if left >= rest {
                left -= rest;
                next += 1;
                skip = 0;
            } else {
                skip += left;
                left = 0;
            }
        }
        // Skip empty buffers.
        while next < bufs.len() && bufs[next].len() == skip {
            next += 1;
            skip = 0;
        }
    }
    Ok(())
}

/// The direct-I/O alignment of files in `root`, from `statx` on a probe file.
fn dio_alignment(root: &Path) -> io::Result<usize> {
    let probe = root.join(PROBE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} does not support O_DIRECT ({e}); use buffered I/O",
                    root.display()
                ),
            )
        })?;
    let alignment = statx_dio_alignment(&file);
    drop(file);
    let _ = fs::remove_file(&probe);
    match alignment? {
        Some(a) => Ok(a),
        None => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the filesystem of {} does not report a direct-I/O alignment (statx \
                 STATX_DIOALIGN, Linux 6.1+); use buffered I/O",
                root.display()
            ),
        )),
    }
}

/// `max(stx_dio_mem_align, stx_dio_offset_align)`, or `None` if not reported.
fn statx_dio_alignment(file: &File) -> io::Result<Option<usize>> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx is plain old data; zeroed is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd, an empty NUL-terminated path with AT_EMPTY_PATH, and a pointer to a
    // live statx buffer.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 || stx.stx_dio_offset_align == 0 {
        return Ok(None);
    }
    Ok(Some(
        stx.stx_dio_mem_align.max(stx.stx_dio_offset_align) as usize
    ))
}

/// Makes a directory entry change durable.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `path`'s parent directories, syncing each directory whose entries changed.
fn create_parents(root: &Path, path: &Path) -> io::Result<()> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    if parent.is_dir() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)?;
    let mut dir = parent;
    while dir != root {
        let up = dir.parent().unwrap_or(root);
        sync_dir(up)?;
        dir = up;
    }
    Ok(())
}

fn parent_of(path: &Path) -> &Path {
    path.parent().unwrap_or(path)
}

impl Disk for PosixDisk {
    fn alignment(&self) -> usize {
        self.alignment
    }

    fn create<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        let name = name.to_string();
        self.blocking(move |disk| {
            let path = resolve(&disk.root, &name)?;
            create_parents(&disk.root, &path)?;
            File::create(&path)?.sync_all()?;
            sync_dir(parent_of(&path))
        })
    }

    fn write_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, ()>> {
        self.write_bufs(name, offset, vec![buf], |mut bufs, result| {
            (bufs.pop().expect("the one buffer"), result)
        })
    }

    fn write_all_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        bufs: Vec<IoBuf>,
    ) -> BoxFuture<'a, IoResult<Vec<IoBuf>, ()>> {
        self.write_bufs(name, offset, bufs, |bufs, result| (bufs, result))
    }

    fn read_at<'a>(
        &'a self,
        name: &'a str,
        offset: u64,
        buf: IoBuf,
    ) -> BoxFuture<'a, IoResult<IoBuf, usize>> {
        if let Err(e) = check_aligned(self.alignment, offset, buf.as_ptr(), buf.len()) {
            return Box::pin(async move { (buf, Err(e)) });
        }
        let name = name.to_string();
        let alignment = self.alignment;
        // The blocking task owns the buffer until the read returns, even if this future is
        // dropped first; direct reads go straight into it (it is aligned, checked above).
        self.blocking_with(buf, move |disk, buf| {
            let path = resolve(&disk.root, &name)?;
            let file = disk.open_options().read(true).open(&path)?;
            let len = buf.len();
            let mut done = 0;
            while done < len {
                // Direct reads keep whole aligned blocks: a short read ends the file.
                match file.read_at(&mut buf[done..len], offset + done as u64) {
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                if disk.direct && !done.is_multiple_of(alignment) {
                    break;
                }
            }
            Ok(done)
        })
    }

    fn sync<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        let name = name.to_string();
        self.blocking(move |disk| {
            let path = resolve(&disk.root, &name)?;
            OpenOptions::new().write(true).open(&path)?.sync_data()
        })
    }

    fn len<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<u64>> {
        let name = name.to_string();
        self.blocking(move |disk| Ok(fs::metadata(resolve(&disk.root, &name)?)?.len()))
    }

    fn remove<'a>(&'a self, name: &'a str) -> BoxFuture<'a, io::Result<()>> {
        let name = name.to_string();
        self.blocking(move |disk| {
            let path = resolve(&disk.root, &name)?;
            fs::remove_file(&path)?;
            sync_dir(parent_of(&path))
        })
    }

    fn rename<'a>(&'a self, from: &'a str, to: &'a str) -> BoxFuture<'a, io::Result<()>> {
        let (from, to) = (from.to_string(), to.to_string());
        self.blocking(move |disk| {
            let from = resolve(&disk.root, &from)?;
            let to = resolve(&disk.root, &to)?;
            create_parents(&disk.root, &to)?;
            fs::rename(&from, &to)?;
            sync_dir(parent_of(&to))?;
            if parent_of(&from) != parent_of(&to) {
                sync_dir(parent_of(&from))?;
            }
            Ok(())
        })
    }

    fn list(&self) -> BoxFuture<'_, io::Result<Vec<String>>> {
        self.blocking(|disk| {
            let mut names = Vec::new();
            let mut dirs = vec![PathBuf::new()];
            while let Some(rel) = dirs.pop() {
                for entry in fs::read_dir(disk.root.join(&rel))? {
                    let entry = entry?;
                    let name = rel.join(entry.file_name());
                    if entry.file_type()?.is_dir() {
                        dirs.push(name);
                    } else if name.as_os_str() != PROBE {
                        // Names are built from valid UTF-8 components by this adapter;
                        // anything else was put there by someone else and is skipped.
                        if let Some(s) = name.to_str() {
                            names.push(s.to_string());
                        }
                    }
                }
            }
            names.sort();
            Ok(names)
        })
    }
}
