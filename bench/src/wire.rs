//! A buffered TCP connection for the hand-written peer clients (RESP and
//! beanstalkd): requests are appended to `out` and written by `flush`;
//! replies are parsed in place from `input()` and `consume`d.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

use crate::conn::{READ_TIMEOUT, WRITE_TIMEOUT};

/// Bytes read per `read` call.
const READ_CHUNK_BYTES: usize = 64 << 10;

pub struct Wire {
    stream: TcpStream,
    /// Requests not yet written.
    pub out: Vec<u8>,
    /// Received bytes; `pos` is how far parsing got.
    buf: Vec<u8>,
    pos: usize,
    scratch: Box<[u8]>,
    /// Who is at the other end, for error messages.
    peer: &'static str,
}

impl Wire {
    pub fn connect(addr: SocketAddr, peer: &'static str) -> Result<Wire, String> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("{peer} at {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| format!("{peer}: {e}"))?;
        stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(|e| format!("{peer}: {e}"))?;
        stream.set_write_timeout(Some(WRITE_TIMEOUT)).map_err(|e| format!("{peer}: {e}"))?;
        Ok(Wire {
            stream,
            out: Vec::new(),
            buf: Vec::new(),
            pos: 0,
            scratch: vec![0; READ_CHUNK_BYTES].into_boxed_slice(),
            peer,
        })
    }

    pub fn flush(&mut self) -> Result<(), String> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).map_err(|e| format!("{}: write: {e}", self.peer))?;
            self.out.clear();
        }
        Ok(())
    }

    /// Received bytes not yet consumed.
    pub fn input(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos += n;
        debug_assert!(self.pos <= self.buf.len());
    }

    /// Reads at least one more byte, waiting for it.
    pub fn fill(&mut self) -> Result<(), String> {
        self.compact();
        match self.stream.read(&mut self.scratch) {
            Ok(0) => Err(format!("{} closed the connection", self.peer)),
            Ok(n) => {
                self.buf.extend_from_slice(&self.scratch[..n]);
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(format!("{}: no reply within {READ_TIMEOUT:?}", self.peer))
            }
            Err(e) => Err(format!("{}: read: {e}", self.peer)),
        }
    }

    /// Reads what has arrived without waiting; false if nothing had.
    pub fn fill_now(&mut self) -> Result<bool, String> {
        self.compact();
        // SAFETY: the scratch buffer is valid for its whole length for the
        // duration of the call, and recv writes at most that many bytes.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                self.scratch.as_mut_ptr().cast(),
                self.scratch.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(false),
                _ => Err(format!("{}: read: {e}", self.peer)),
            };
        }
        if n == 0 {
            return Err(format!("{} closed the connection", self.peer));
        }
        self.buf.extend_from_slice(&self.scratch[..n as usize]);
        Ok(true)
    }

    /// Drops consumed bytes once they are worth the move.
    fn compact(&mut self) {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > READ_CHUNK_BYTES {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    pub fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}
