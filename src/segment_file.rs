//! A segment file as the log writes it: the operations it needs, behind a
//! trait so that tests can inject failures, and the real file's.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The file operations the log needs from a segment. A trait so that tests
/// can inject a failing write or sync without filling a disk.
pub trait SegmentFile: Send {
    /// Writes all of `buf` at byte `offset` of the file.
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    fn sync_data(&mut self) -> io::Result<()>;
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Reserves space so that the file is at least `len` bytes long and
    /// writes below `len` change neither its size nor its allocation
    /// (`fallocate`). Best effort: the log writes whether or not it worked.
    fn reserve(&mut self, len: u64) -> io::Result<()>;
    /// Bytes free on the file's filesystem for an unprivileged writer
    /// (`fstatvfs`); an error means unknown, and the log does not keep
    /// headroom then.
    fn free_bytes(&self) -> io::Result<u64> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

impl SegmentFile for File {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        crate::sys::allocate(self, len)
    }
    fn free_bytes(&self) -> io::Result<u64> {
        crate::sys::free_bytes(self)
    }
}

/// Opens a segment file for appending; swapped in tests.
pub type Opener = Box<dyn FnMut(&Path) -> io::Result<Box<dyn SegmentFile>> + Send>;

/// The real opener: a file opened for writing at the log's own offsets
/// (not `O_APPEND`: the end of the file is reserved space, not the end of
/// the records).
pub fn open_file(path: &Path) -> io::Result<Box<dyn SegmentFile>> {
    let f = OpenOptions::new().create(true).truncate(false).write(true).open(path)?;
    Ok(Box::new(f))
}

/// A segment file whose reserved space is also mapped shared, for
/// `--fsync never`: a turn's records are copied into the page cache with a
/// `memcpy` instead of a `pwrite`. A copy into a shared mapping survives a
/// crash of the process as a `pwrite` does (the pages are the file's, in
/// the kernel), and costs a tenth of the system call at depth 1
/// (bench/README.md, "The non-durable fast path"). Not for `--fsync turn`:
/// there every `fdatasync` write-protects the pages it writes back, and the
/// next copy into the same page faults and waits for it, which measured
/// slower than a `pwrite` (a 160-byte write and `fdatasync` took 840–880
/// µs a turn mapped against 400–510 µs with `pwrite` on the bench
/// machine).
///
/// Writes outside the mapping (a turn past the reservation, or a
/// filesystem that cannot reserve) are plain `pwrite`s; the mapping is
/// dropped before the file is cut back.
pub struct MappedFile {
    file: File,
    /// The file's reserved bytes, mapped; None until the first reservation
    /// (or if mapping failed: the writes are `pwrite`s then).
    map: Option<crate::sys::SharedMap>,
}

impl SegmentFile for MappedFile {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.map.as_mut().is_some_and(|m| m.write_at(buf, offset)) {
            return Ok(());
        }
        FileExt::write_all_at(&self.file, buf, offset)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        // On Linux `fdatasync` writes back the pages a mapping dirtied too.
        self.file.sync_data()
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        if self.map.as_ref().is_some_and(|m| m.mapped_bytes() > len) {
            self.map = None;
        }
        self.file.set_len(len)
    }
    fn reserve(&mut self, len: u64) -> io::Result<()> {
        crate::sys::allocate(&self.file, len)?;
        if self.map.as_ref().is_none_or(|m| m.mapped_bytes() < len) {
            // Unmapped first: an old mapping holds no unwritten bytes (the
            // copies are in the page cache already).
            self.map = None;
            match crate::sys::SharedMap::new(&self.file, len) {
                Ok(m) => self.map = Some(m),
                Err(e) => log::debug!("commit log: cannot map {len} bytes of the active segment: {e}"),
            }
        }
        Ok(())
    }
    fn free_bytes(&self) -> io::Result<u64> {
        crate::sys::free_bytes(&self.file)
    }
}

/// The opener for `--fsync never`: a file opened for reading and writing
/// (a shared writable mapping needs both), mapped as it is reserved.
pub fn open_mapped(path: &Path) -> io::Result<Box<dyn SegmentFile>> {
    let file = OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)?;
    Ok(Box::new(MappedFile { file, map: None }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::TempDir;

    /// The file's bytes as a reader sees them.
    fn contents(path: &Path) -> Vec<u8> {
        std::fs::read(path).expect("read segment")
    }

    #[test]
    fn a_mapped_segment_reads_back_what_was_written_inside_and_past_its_mapping() {
        let dir = TempDir::new("mapped-segment");
        let path = dir.0.join("seg");
        let mut f = open_mapped(&path).expect("open");
        // Before any reservation: a plain write.
        f.write_all_at(b"head", 0).expect("write before reserving");
        f.reserve(4096).expect("reserve");
        // Inside the mapping, and one straddling its end (a pwrite).
        f.write_all_at(b"mapped", 4).expect("write mapped");
        f.write_all_at(b"straddles", 4090).expect("write past the mapping");
        let got = contents(&path);
        assert_eq!(&got[..10], b"headmapped");
        assert_eq!(&got[4090..4099], b"straddles");
        // Cut back below the mapping (as after a failed commit), then
        // reserved again: the writes land where they are asked to.
        f.set_len(8).expect("cut back");
        assert_eq!(contents(&path), b"headmapp");
        f.write_all_at(b"X", 8).expect("write after the cut, unmapped");
        f.reserve(8192).expect("reserve again");
        f.write_all_at(b"again", 5000).expect("write into the new mapping");
        let got = contents(&path);
        assert_eq!(got.len(), 8192);
        assert_eq!(&got[..9], b"headmappX");
        assert_eq!(&got[5000..5005], b"again");
        assert!(got[4090..4099].iter().all(|&b| b == 0), "the cut bytes stay cut");
        f.sync_data().expect("sync");
        drop(f);
        assert_eq!(&contents(&path)[5000..5005], b"again", "the mapping's writes outlive it");
    }
}
