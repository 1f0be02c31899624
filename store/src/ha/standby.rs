//! The standby's side of log shipping: fetch the leader's state files with `Follow` and keep
//! a byte-for-byte copy in the standby's own state directory, synced before each next request
//! (which acknowledges it). A standby that takes over recovers from that copy exactly as a
//! restarted master recovers from its own directory.

use std::io;
use std::sync::Arc;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::state_dir::{OpenMode, StateDir, StateFile as OpenFile};
use mooring_proto::transport::ControlPlane;
use mooring_proto::wire::{Follow, FollowChunk, StateFile};
use tracing::{debug, info};

use crate::master::journal;

/// The file that names a state directory's contents: a fresh one each time a standby starts
/// copying a leader from scratch, so a copy that is not yet complete can never be taken for
/// one the leader recorded as in sync.
const INCARNATION: &str = "incarnation";

/// This directory's incarnation, created if it has none.
pub fn incarnation(dir: &dyn StateDir) -> Result<u64> {
    if let Ok(bytes) = dir.read(INCARNATION)
        && let Ok(text) = std::str::from_utf8(&bytes)
        && let Ok(n) = text.trim().parse()
    {
        return Ok(n);
    }
    renew_incarnation(dir)
}

fn renew_incarnation(dir: &dyn StateDir) -> Result<u64> {
    let n = new_incarnation();
    write_incarnation(dir, n)?;
    Ok(n)
}

/// A fresh incarnation number: random in production, seeded in the simulation.
fn new_incarnation() -> u64 {
    (crate::client::connect::random_client_id().0 as u64) >> 1
}

fn write_incarnation(dir: &dyn StateDir, n: u64) -> Result<()> {
    dir.prepare()
        .and_then(|()| dir.write_whole(INCARNATION, &[n.to_string().as_bytes()]))
        .map_err(|e| failed(dir, INCARNATION, e))
}

fn failed(dir: &dyn StateDir, name: &str, e: io::Error) -> Error {
    Error::new(
        ErrorCode::FILE_WRITE_FAIL,
        format!("cannot write {name} in {}: {e}", dir.location()),
    )
}

/// A standby copying one leader's state files.
pub struct Copier {
    dir: Arc<dyn StateDir>,
    advertise: String,
    /// The name the leader knows this copy by: `<advertised address>#<incarnation>`.
    name: String,
    at: StateFile,
    offset: u64,
    /// The file being written: a snapshot goes to a temporary name until complete.
    file: Option<Box<dyn OpenFile>>,
    /// The incarnation this copy will have, until the leader's first answer makes it the
    /// directory's (then `None`).
    pending: Option<u64>,
}

impl Copier {
    /// Starts a copy from scratch in `dir` under a fresh incarnation (the old copy may have
    /// diverged from this leader's history): its state files are deleted when the leader
    /// first answers. Until then the old copy, and its place in the in-sync set, stay: a
    /// master that is elected but steps back without ever leading (it found itself out of
    /// sync) must not cost the group the copy that may take over.
    pub fn fresh(dir: Arc<dyn StateDir>, advertise: &str) -> Result<Copier> {
        let incarnation = new_incarnation();
        Ok(Copier {
            dir,
            advertise: advertise.to_string(),
            name: format!("{advertise}#{incarnation}"),
            at: StateFile::Journal(0),
            offset: 0,
            file: None,
            pending: Some(incarnation),
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
        if let Some(incarnation) = self.pending {
            // The new incarnation first: from here the old one's files are not a copy anyone
            // may lead from.
            write_incarnation(&*self.dir, incarnation)?;
            wipe(&*self.dir)?;
            self.pending = None;
        }
        if (chunk.file, chunk.offset) != (self.at, self.offset) {
            self.move_to(chunk.file, chunk.offset)?;
        }
        if !chunk.bytes.is_empty() {
            let name = self.writing_name();
            let dir = &*self.dir;
            let written = (|| {
                if self.file.is_none() {
                    // Nothing is there (a fresh copy is wiped, and each file is begun once).
                    let file = dir.open(&name, OpenMode::CreateNew)?;
                    dir.sync_dir()?;
                    self.file = Some(file);
                }
                let file = self.file.as_ref().expect("opened above");
                file.write_at(&chunk.bytes, self.offset)?;
                file.sync()
            })();
            written.map_err(|e| failed(dir, &name, e))?;
            self.offset += chunk.bytes.len() as u64;
        }
        if chunk.complete
            && let StateFile::Snapshot(g) = self.at
        {
            let name = journal::snapshot_name(g);
            let dir = &*self.dir;
            self.file = None;
            dir.rename(&self.writing_name(), &name)
                .and_then(|()| dir.sync_dir())
                .map_err(|e| failed(dir, &name, e))?;
            journal::delete_before(dir, g);
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
                let incarnation = renew_incarnation(&*self.dir)?;
                self.name = format!("{}#{incarnation}", self.advertise);
                self.file = None;
                wipe(&*self.dir)?;
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

    fn writing_name(&self) -> String {
        match self.at {
            StateFile::Snapshot(g) => format!("{}.tmp", journal::snapshot_name(g)),
            StateFile::Journal(g) => journal::journal_name(g),
        }
    }
}

/// Deletes every state file in `dir` (not the directory or anything else in it).
fn wipe(dir: &dyn StateDir) -> Result<()> {
    let names = dir
        .prepare()
        .and_then(|()| dir.list())
        .map_err(|e| failed(dir, "the directory", e))?;
    for name in names {
        let state = (name.starts_with("journal-") && name.ends_with(".log"))
            || (name.starts_with("snapshot-") && name.contains(".snap"));
        if state {
            dir.remove(&name).map_err(|e| failed(dir, &name, e))?;
        }
    }
    dir.sync_dir().map_err(|e| failed(dir, "the directory", e))
}
