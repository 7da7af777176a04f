//! The floor under any one-sided op over TCP on this machine: two processes, one
//! connection, both spinning on non-blocking sockets (no runtime, no protocol beyond a
//! 9-byte header), the same shapes as the engine's sync ops: WRITE sends a header and the
//! bytes and waits for a 1-byte answer, READ sends a header and waits for the bytes.
//! What the engine takes beyond it is the engine's and its transport's own cost.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

const WRITE: u8 = 0;
const READ: u8 = 1;

/// Reads all of `buf`, spinning while the socket is empty; false at end of stream.
fn spin_read(s: &mut TcpStream, buf: &mut [u8]) -> bool {
    let mut done = 0;
    while done < buf.len() {
        match s.read(&mut buf[done..]) {
            Ok(0) => return false,
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("floor peer: {e}"),
        }
    }
    true
}

/// Writes all of `buf`, spinning while the socket buffer is full.
fn spin_write(s: &mut TcpStream, buf: &[u8]) {
    let mut done = 0;
    while done < buf.len() {
        match s.write(&buf[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("floor peer: {e}"),
        }
    }
}

/// The target side (this bench with `--tcp-floor`): prints its port, serves one
/// connection until the initiator closes it.
pub fn serve(max_len: usize) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("READY {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; max_len];
    let mut head = [0u8; 9];
    while spin_read(&mut s, &mut head) {
        let len = u64::from_le_bytes(head[1..].try_into().unwrap()) as usize;
        if head[0] == WRITE {
            if !spin_read(&mut s, &mut buf[..len]) {
                return;
            }
            spin_write(&mut s, &[0]);
        } else {
            spin_write(&mut s, &buf[..len]);
        }
    }
}

/// The floor's target process, and the connection to it.
pub struct Floor {
    child: Child,
    conn: TcpStream,
    buf: Vec<u8>,
}

impl Floor {
    pub fn start(max_len: usize) -> Floor {
        let me = std::env::current_exe().unwrap();
        let mut child = Command::new(me)
            .args(["--tcp-floor", &max_len.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("floor peer said `{line}`"));
        let conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
        conn.set_nodelay(true).unwrap();
        conn.set_nonblocking(true).unwrap();
        Floor {
            child,
            conn,
            buf: vec![1u8; 9 + max_len],
        }
    }

    /// Microseconds per op of `len` bytes (`read`: READ, else WRITE), over `secs`.
    pub fn us_per_op(&mut self, read: bool, len: usize, secs: f64) -> f64 {
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            self.buf[0] = if read { READ } else { WRITE };
            self.buf[1..9].copy_from_slice(&(len as u64).to_le_bytes());
            if read {
                spin_write(&mut self.conn, &self.buf[..9]);
                assert!(spin_read(&mut self.conn, &mut self.buf[9..9 + len]));
            } else {
                spin_write(&mut self.conn, &self.buf[..9 + len]);
                assert!(spin_read(&mut self.conn, &mut self.buf[..1]));
            }
            ops += 1;
        }
        start.elapsed().as_secs_f64() * 1e6 / ops as f64
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}
