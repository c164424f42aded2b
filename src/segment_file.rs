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
