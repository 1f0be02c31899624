//! The master's state directory on a [`SimDisk`]: journals and snapshots get the simulated
//! disk's faults (torn writes on a crash, flipped bits, failed syncs, a full disk), so the
//! simulation can break what a real directory only breaks once in a long while.

use std::io;
use std::sync::Arc;

use mooring_proto::state_dir::{OpenMode, StateDir, StateFile};

use crate::disk::SimDisk;

/// A state directory whose files live on `disk` (the disk holds nothing else).
#[derive(Clone)]
pub struct SimStateDir {
    disk: Arc<SimDisk>,
}

impl SimStateDir {
    /// The directory on `disk`.
    pub fn new(disk: Arc<SimDisk>) -> SimStateDir {
        SimStateDir { disk }
    }

    /// The disk under it, to inject faults into.
    pub fn disk(&self) -> &Arc<SimDisk> {
        &self.disk
    }
}

/// A file of a [`SimStateDir`]: named by its id, so it follows renames.
struct SimStateFile {
    disk: Arc<SimDisk>,
    id: u64,
}

impl StateFile for SimStateFile {
    fn len(&self) -> io::Result<u64> {
        let mut state = self.disk.lock();
        let name = state.name_of(self.id)?;
        state.len(&name)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut state = self.disk.lock();
        let name = state.name_of(self.id)?;
        if state.read(&name, offset, buf)? < buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{name} ends before {} bytes from {offset}", buf.len()),
            ));
        }
        Ok(())
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let mut state = self.disk.lock();
        let name = state.name_of(self.id)?;
        state.write(&name, offset, bytes)
    }

    fn sync(&self) -> io::Result<()> {
        let mut state = self.disk.lock();
        let name = state.name_of(self.id)?;
        state.sync(&name)
    }

    fn id(&self) -> u64 {
        self.id
    }
}

impl StateDir for SimStateDir {
    fn location(&self) -> String {
        "sim:state".into()
    }

    fn prepare(&self) -> io::Result<()> {
        Ok(())
    }

    fn list(&self) -> io::Result<Vec<String>> {
        Ok(self
            .disk
            .files()
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Box<dyn StateFile>> {
        let id = {
            let mut state = self.disk.lock();
            match (mode, state.id_of(name)) {
                (OpenMode::CreateNew, Some(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{name} exists"),
                    ));
                }
                (OpenMode::CreateNew, None) => state.create(name),
                (_, Some(id)) => id,
                (_, None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("no file {name:?}"),
                    ));
                }
            }
        };
        Ok(Box::new(SimStateFile {
            disk: self.disk.clone(),
            id,
        }))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.disk.lock().rename(from, to)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.disk.lock().remove(name)
    }

    fn sync_dir(&self) -> io::Result<()> {
        // Namespace changes on the simulated disk are durable when they return.
        Ok(())
    }

    fn id_of(&self, name: &str) -> io::Result<u64> {
        self.disk
            .lock()
            .id_of(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no file {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::DiskFaults;

    #[test]
    fn a_full_disk_refuses_growth_and_a_crash_keeps_what_was_synced() {
        let disk = Arc::new(SimDisk::new(3));
        let dir = SimStateDir::new(disk.clone());
        let file = dir.open("j", OpenMode::CreateNew).unwrap();
        file.write_at(b"synced", 0).unwrap();
        file.sync().unwrap();
        disk.set_faults(DiskFaults {
            capacity: Some(8),
            lost_on_crash: 1.0,
            ..DiskFaults::default()
        });
        let full = file.write_at(b" and more", 6).unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::StorageFull);
        // Overwriting bytes the file has needs no room.
        file.write_at(b"S", 0).unwrap();
        file.write_at(b"!!", 6).unwrap();
        assert_eq!(dir.read("j").unwrap(), b"Synced!!");
        disk.crash();
        assert_eq!(dir.read("j").unwrap(), b"synced");

        dir.rename("j", "k").unwrap();
        assert_eq!(dir.id_of("k").unwrap(), file.id());
        assert!(!dir.exists("j"));
        assert_eq!(file.len().unwrap(), 6, "the handle follows its file");
        let taken = dir.open("k", OpenMode::CreateNew).err().unwrap();
        assert_eq!(taken.kind(), io::ErrorKind::AlreadyExists);
        dir.write_whole("snap", &[b"a", b"b"]).unwrap();
        let mut names = dir.list().unwrap();
        names.sort();
        assert_eq!(names, ["k", "snap"]);
    }
}
