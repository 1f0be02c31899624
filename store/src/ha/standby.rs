//! The standby's side of log shipping: fetch the leader's state files with `Follow` and keep
//! a byte-for-byte copy in the standby's own state directory, synced before each next request
//! (which acknowledges it). A standby that takes over recovers from that copy exactly as a
//! restarted master recovers from its own directory.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{Follow, FollowChunk, StateFile};
use tracing::{debug, info};

use mooring_disk::PosixStateDir;
use mooring_proto::state_dir::StateDir;

use crate::master::journal;

/// The file that names a state directory's contents: a fresh one each time a standby starts
/// copying a leader from scratch, so a copy that is not yet complete can never be taken for
/// one the leader recorded as in sync.
const INCARNATION: &str = "incarnation";

/// This directory's incarnation, created if it has none.
pub fn incarnation(dir: &Path) -> Result<u64> {
    let path = dir.join(INCARNATION);
    if let Ok(text) = fs::read_to_string(&path)
        && let Ok(n) = text.trim().parse()
    {
        return Ok(n);
    }
    renew_incarnation(dir)
}

fn renew_incarnation(dir: &Path) -> Result<u64> {
    // Random in production, seeded in the simulation.
    let n = (crate::client::connect::random_client_id().0 as u64) >> 1;
    let path = dir.join(INCARNATION);
    let temporary = dir.join(format!("{INCARNATION}.tmp"));
    (|| {
        fs::create_dir_all(dir)?;
        let file = File::create(&temporary)?;
        file.write_all_at(n.to_string().as_bytes(), 0)?;
        file.sync_all()?;
        fs::rename(&temporary, &path)?;
        PosixStateDir::new(dir).sync_dir()
    })()
    .map_err(|e| failed(format!("cannot write {}: {e}", path.display())))?;
    Ok(n)
}

fn failed(what: String) -> Error {
    Error::new(ErrorCode::FILE_WRITE_FAIL, what)
}

/// A standby copying one leader's state files.
pub struct Copier {
    dir: PathBuf,
    advertise: String,
    /// The name the leader knows this copy by: `<advertised address>#<incarnation>`.
    name: String,
    at: StateFile,
    offset: u64,
    /// The file being written: a snapshot goes to a temporary name until complete.
    file: Option<File>,
}

impl Copier {
    /// Starts a copy from scratch in `dir`: deletes its state files and takes a fresh
    /// incarnation (the old copy may have diverged from this leader's history).
    pub fn fresh(dir: &Path, advertise: &str) -> Result<Copier> {
        // A new incarnation first: from here the old one's files are not a copy anyone may
        // lead from.
        let incarnation = renew_incarnation(dir)?;
        wipe(dir)?;
        Ok(Copier {
            dir: dir.to_path_buf(),
            advertise: advertise.to_string(),
            name: format!("{advertise}#{incarnation}"),
            at: StateFile::Journal(0),
            offset: 0,
            file: None,
        })
    }

    /// The name the leader knows this copy by.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the copy stands: the file and how many of its bytes are on disk.
    pub fn position(&self) -> (StateFile, u64) {
        (self.at, self.offset)
    }

    /// Asks the leader for what follows, writes and syncs it.
    pub async fn step(&mut self, leader: &(dyn ControlPlane + 'static)) -> Result<()> {
        let chunk = leader
            .call(Follow {
                follower: self.name.clone(),
                at: self.at,
                offset: self.offset,
            })
            .await?;
        self.write(chunk)
    }

    fn write(&mut self, chunk: FollowChunk) -> Result<()> {
        if (chunk.file, chunk.offset) != (self.at, self.offset) {
            self.move_to(chunk.file, chunk.offset)?;
        }
        if !chunk.bytes.is_empty() {
            let path = self.writing_path();
            let written = (|| {
                if self.file.is_none() {
                    let file = OpenOptions::new()
                        .create(true)
                        .truncate(false)
                        .write(true)
                        .open(&path)?;
                    file.set_len(self.offset)?;
                    self.file = Some(file);
                    PosixStateDir::new(&self.dir).sync_dir()?;
                }
                let file = self.file.as_ref().expect("opened above");
                file.write_all_at(&chunk.bytes, self.offset)?;
                file.sync_data()
            })();
            written.map_err(|e| failed(format!("cannot write {}: {e}", path.display())))?;
            self.offset += chunk.bytes.len() as u64;
        }
        if chunk.complete
            && let StateFile::Snapshot(g) = self.at
        {
            let path = self.dir.join(journal::snapshot_name(g));
            (|| {
                fs::rename(self.writing_path(), &path)?;
                PosixStateDir::new(&self.dir).sync_dir()
            })()
            .map_err(|e| failed(format!("cannot write {}: {e}", path.display())))?;
            journal::delete_before(&PosixStateDir::new(&self.dir), g);
            info!(
                generation = g,
                bytes = self.offset,
                "copied the leader's snapshot"
            );
            self.at = StateFile::Journal(g);
            self.offset = 0;
            self.file = None;
        }
        Ok(())
    }

    /// Goes where the leader sent this copy: the next journal, or the snapshot that begins
    /// it, follows a complete journal; any other snapshot starts the copy over, under a new
    /// incarnation (until the leader counts it in sync again, it may not take over).
    fn move_to(&mut self, file: StateFile, offset: u64) -> Result<()> {
        // A fresh copy holds nothing yet: wherever the leader starts it is a beginning.
        let empty = (self.at, self.offset) == (StateFile::Journal(0), 0);
        let next = empty
            || match (self.at, file) {
                (StateFile::Journal(a), StateFile::Journal(b) | StateFile::Snapshot(b)) => {
                    b == a + 1
                }
                _ => false,
            };
        match (file, offset) {
            (StateFile::Journal(_) | StateFile::Snapshot(_), 0) if next => {}
            (StateFile::Snapshot(_), 0) => {
                debug!(
                    ?file,
                    "the leader sends its snapshot: starting the copy over"
                );
                let incarnation = renew_incarnation(&self.dir)?;
                self.name = format!("{}#{incarnation}", self.advertise);
                wipe(&self.dir)?;
            }
            _ => {
                return Err(Error::new(
                    ErrorCode::INTERNAL_ERROR,
                    format!(
                        "the leader sent {file:?} at {offset} to a copy at {:?} {}",
                        self.at, self.offset
                    ),
                ));
            }
        }
        self.at = file;
        self.offset = 0;
        self.file = None;
        Ok(())
    }

    fn writing_path(&self) -> PathBuf {
        match self.at {
            StateFile::Snapshot(g) => self
                .dir
                .join(journal::snapshot_name(g))
                .with_extension("snap.tmp"),
            StateFile::Journal(g) => self.dir.join(journal::journal_name(g)),
        }
    }
}

/// Deletes every state file in `dir` (not the directory or anything else in it).
fn wipe(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| failed(format!("cannot create {}: {e}", dir.display())))?;
    let entries =
        fs::read_dir(dir).map_err(|e| failed(format!("cannot read {}: {e}", dir.display())))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let state = (name.starts_with("journal-") && name.ends_with(".log"))
            || (name.starts_with("snapshot-") && name.contains(".snap"));
        if state {
            fs::remove_file(entry.path())
                .map_err(|e| failed(format!("cannot delete {}: {e}", entry.path().display())))?;
        }
    }
    PosixStateDir::new(dir)
        .sync_dir()
        .map_err(|e| failed(format!("cannot sync {}: {e}", dir.display())))
}
