//! [`PosixStateDir`]: the state-directory seam on a real directory.
//!
//! The directory is made owner-only (0700) and files are created 0600: journals and
//! snapshots name every key the master holds.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use mooring_proto::state_dir::{OpenMode, StateDir, StateFile, WholeFile, read_into_memory};

use crate::mapped::MappedFile;

/// A state directory on the file system.
#[derive(Clone, Debug)]
pub struct PosixStateDir {
    dir: PathBuf,
}

impl PosixStateDir {
    /// The directory at `dir` (made by [`StateDir::prepare`] if missing).
    pub fn new(dir: impl Into<PathBuf>) -> PosixStateDir {
        PosixStateDir { dir: dir.into() }
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn at(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// A file of a [`PosixStateDir`].
struct PosixStateFile {
    file: File,
    id: u64,
}

impl StateFile for PosixStateFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(bytes, offset)
    }

    fn sync(&self) -> io::Result<()> {
        // A simulated crash kills tasks, not the machine: the page cache survives it, and a
        // real sync per simulated request would only make the runs slow.
        #[cfg(not(madsim))]
        self.file.sync_data()?;
        Ok(())
    }

    fn id(&self) -> u64 {
        self.id
    }
}

fn file_id(metadata: &fs::Metadata) -> u64 {
    // One directory is one file system: the inode names the file.
    metadata.ino()
}

impl StateDir for PosixStateDir {
    fn location(&self) -> String {
        self.dir.display().to_string()
    }

    fn read_whole(&self, name: &str) -> io::Result<Box<dyn WholeFile>> {
        let file = File::open(self.at(name))?;
        match MappedFile::map(&file)? {
            Some(mapped) => Ok(Box::new(mapped)),
            None => read_into_memory(self, name),
        }
    }

    fn prepare(&self) -> io::Result<()> {
        crate::paths::owner_only_dir(&self.dir)
    }

    fn list(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn open(&self, name: &str, mode: OpenMode) -> io::Result<Box<dyn StateFile>> {
        let mut options = OpenOptions::new();
        options.read(true);
        match mode {
            OpenMode::Read => {}
            OpenMode::Write => {
                options.write(true);
            }
            OpenMode::CreateNew => {
                options.write(true).create_new(true).mode(0o600);
            }
        }
        let file = options.open(self.at(name))?;
        let id = file_id(&file.metadata()?);
        Ok(Box::new(PosixStateFile { file, id }))
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        fs::rename(self.at(from), self.at(to))
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        fs::remove_file(self.at(name))
    }

    fn sync_dir(&self) -> io::Result<()> {
        let dir = File::open(&self.dir)?;
        #[cfg(not(madsim))]
        dir.sync_all()?;
        drop(dir);
        Ok(())
    }

    fn id_of(&self, name: &str) -> io::Result<u64> {
        Ok(file_id(&fs::metadata(self.at(name))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_owner_only_and_handles_follow_renames() {
        let root = std::env::temp_dir().join(format!("mooring-state-dir-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = PosixStateDir::new(root.join("state"));
        dir.prepare().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(dir.path()), 0o700);

        let file = dir.open("a", OpenMode::CreateNew).unwrap();
        file.write_at(b"hello", 0).unwrap();
        file.sync().unwrap();
        assert_eq!(mode(&dir.at("a")), 0o600);
        let taken = dir.open("a", OpenMode::CreateNew).err().unwrap();
        assert_eq!(taken.kind(), io::ErrorKind::AlreadyExists);

        dir.rename("a", "b").unwrap();
        assert!(!dir.exists("a"));
        assert_eq!(dir.id_of("b").unwrap(), file.id());
        let mut read = [0u8; 5];
        file.read_at(&mut read, 0).unwrap();
        assert_eq!(&read, b"hello");
        assert_eq!(dir.read("b").unwrap(), b"hello");

        dir.write_whole("c", &[b"x", b"yz"]).unwrap();
        assert_eq!(dir.read("c").unwrap(), b"xyz");
        let mut names = dir.list().unwrap();
        names.sort();
        assert_eq!(names, ["b", "c"], "no temporary file is left behind");
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_whole_file_is_mapped_aligned_and_an_empty_one_read() {
        let root = std::env::temp_dir().join(format!("mooring-whole-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = PosixStateDir::new(&root);
        dir.prepare().unwrap();
        let bytes: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i * 7 % 251) as u8).collect();
        dir.write_whole("big", &[&bytes]).unwrap();
        let whole = dir.read_whole("big").unwrap();
        assert_eq!(whole.bytes(), &bytes[..]);
        assert_eq!(
            whole.bytes().as_ptr().align_offset(16),
            0,
            "a snapshot's payload reads in place"
        );
        // The mapping outlives the name: a snapshot retired while it is restored stays readable.
        dir.remove("big").unwrap();
        assert_eq!(whole.bytes(), &bytes[..]);
        drop(whole);
        dir.write_whole("empty", &[]).unwrap();
        assert!(dir.read_whole("empty").unwrap().bytes().is_empty());
        assert_eq!(
            dir.read_whole("missing").err().unwrap().kind(),
            io::ErrorKind::NotFound
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
