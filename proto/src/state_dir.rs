//! The state-directory seam: the files a master keeps (journals, snapshots) and a standby
//! copies, as a trait the POSIX directory and the simulated disk implement, so the journal's
//! recovery, group commit and snapshots run unchanged under the simulator, where a fault plan
//! tears, flips, fills and fails them.
//!
//! Calls are blocking: the journal writes from its own thread (in the simulation, inline),
//! never from an async task. Semantics are POSIX's, narrowed to what the journal relies on:
//!
//! - A file is named by a plain name inside the directory (no `/`).
//! - [`StateFile::write_at`] is visible to reads at once and durable only once
//!   [`StateFile::sync`] returns; a crash may keep any prefix of an unsynced write. A write
//!   that fails for want of space is [`io::ErrorKind::StorageFull`] and writes nothing the
//!   caller relies on.
//! - A handle follows its file through renames; [`StateFile::id`] names the file, so a reader
//!   can tell whether a name still refers to the file it read ([`StateDir::id_of`]).
//! - Creating, renaming and removing files is durable once [`StateDir::sync_dir`] returns.

use std::io;

use mooring_core::SnapshotBuffer;

/// How [`StateDir::open`] opens a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, to read.
    Read,
    /// An existing file, to read and write.
    Write,
    /// A new file, to read and write; [`io::ErrorKind::AlreadyExists`] if the name is taken.
    CreateNew,
}

/// One open file of a [`StateDir`].
pub trait StateFile: Send + Sync {
    /// The file's length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file holds no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`; [`io::ErrorKind::UnexpectedEof`] if the file ends first.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `bytes` at `offset` (growing the file), not yet durably.
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable. A failure is final for the bytes it covered: they
    /// may be lost even if a later sync succeeds (Linux drops the dirty pages of a failed
    /// `fsync`), so a caller must never take a retry's success for theirs.
    fn sync(&self) -> io::Result<()>;
    /// Names the file (not the name it has): equal for two handles of one file.
    fn id(&self) -> u64;
}

/// A directory of state files (see the module docs).
pub trait StateDir: Send + Sync {
    /// Where the directory is, for messages (a path, or the simulation's name for it).
    fn location(&self) -> String;
    /// Makes the directory if it is missing (owner-only where the system has permissions).
    fn prepare(&self) -> io::Result<()>;
    /// The names of the files in the directory, in no particular order.
    fn list(&self) -> io::Result<Vec<String>>;
    /// Opens `name`.
    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Box<dyn StateFile>>;
    /// Renames `from` to `to`, replacing any file named `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;
    /// Removes `name`.
    fn remove(&self, name: &str) -> io::Result<()>;
    /// Makes the directory's namespace changes so far durable.
    fn sync_dir(&self) -> io::Result<()>;
    /// The [`StateFile::id`] of the file named `name` now.
    fn id_of(&self, name: &str) -> io::Result<u64>;

    /// Whether a file is named `name`.
    fn exists(&self, name: &str) -> bool {
        self.id_of(name).is_ok()
    }

    /// The whole of `name` held for reading, its first byte 16-byte aligned (a snapshot's
    /// payload is then read in place): read into memory here ([`read_into_memory`]). A
    /// directory on a real file system maps the file instead, so restoring a snapshot of
    /// gigabytes does not first need as much fresh memory again to hold it. Only for files
    /// that nothing changes while they are read: a snapshot is written whole under a
    /// temporary name and renamed.
    fn read_whole(&self, name: &str) -> io::Result<Box<dyn WholeFile>> {
        read_into_memory(self, name)
    }

    /// The whole of `name`.
    fn read(&self, name: &str) -> io::Result<Vec<u8>> {
        let file = self.open(name, OpenMode::Read)?;
        let mut bytes = vec![0u8; file.len()? as usize];
        file.read_at(&mut bytes, 0)?;
        Ok(bytes)
    }

    /// Writes `pieces` as the file `name`, durably and whole: to a temporary name, synced,
    /// then renamed over `name`. On failure nothing half-written is left behind.
    fn write_whole(&self, name: &str, pieces: &[&[u8]]) -> io::Result<()> {
        let temporary = format!("{name}.tmp");
        let written = (|| {
            let _ = self.remove(&temporary);
            let file = self.open(&temporary, OpenMode::CreateNew)?;
            let mut at = 0u64;
            for piece in pieces {
                file.write_at(piece, at)?;
                at += piece.len() as u64;
            }
            file.sync()?;
            drop(file);
            self.rename(&temporary, name)?;
            self.sync_dir()
        })();
        if written.is_err() {
            let _ = self.remove(&temporary);
        }
        written
    }
}

/// A whole file's bytes, held for reading ([`StateDir::read_whole`]).
pub trait WholeFile: Send + Sync {
    /// The file's bytes.
    fn bytes(&self) -> &[u8];
}

impl WholeFile for SnapshotBuffer {
    fn bytes(&self) -> &[u8] {
        self.as_slice()
    }
}

/// [`StateDir::read_whole`] by reading the file into an aligned buffer.
pub fn read_into_memory<D: StateDir + ?Sized>(
    dir: &D,
    name: &str,
) -> io::Result<Box<dyn WholeFile>> {
    let file = dir.open(name, OpenMode::Read)?;
    let mut buffer = SnapshotBuffer::new(file.len()? as usize);
    file.read_at(buffer.as_mut_slice(), 0)?;
    Ok(Box::new(buffer))
}
