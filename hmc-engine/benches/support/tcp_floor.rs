//! The floor under any one-sided op over TCP on this machine: two processes, one
//! connection, both spinning on non-blocking sockets (no runtime, no protocol beyond a
//! 9-byte header), the same shapes as the engine's sync ops: WRITE sends a header and the
//! bytes and waits for a 1-byte answer, READ sends a header and waits for the bytes.
//! What the engine takes beyond it is the engine's and its transport's own cost.
//!
//! [`variants`] measures the same shapes with the sockets driven in other ways (larger
//! socket buffers, sends in pieces so the receiver can copy while the sender still does,
//! blocking calls), to show which way is the floor on this machine.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WRITE: u8 = 0;
const READ: u8 = 1;

/// How both ends drive the socket. The default is the floor the bench reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct Variant {
    /// Bytes per `write` of the data (0: all at once).
    pub send_piece: usize,
    /// `SO_SNDBUF` and `SO_RCVBUF` of both sockets (0: the kernel's autotuning).
    pub sock_buf: usize,
    /// Blocking sockets (the kernel wakes the reader) instead of spinning ones.
    pub blocking: bool,
}

impl Variant {
    fn name(&self) -> String {
        match (self.send_piece, self.sock_buf, self.blocking) {
            (0, 0, false) => "spinning, one write (the floor)".into(),
            (p, 0, false) => format!("spinning, writes of {} KiB", p >> 10),
            (0, b, false) => format!("spinning, {} MiB socket buffers", b >> 20),
            (0, 0, true) => "blocking sockets".into(),
            (p, b, bl) => format!("piece {p}, buffers {b}, blocking {bl}"),
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.send_piece, self.sock_buf, self.blocking as u8
        )
    }
}

impl std::str::FromStr for Variant {
    type Err = String;
    fn from_str(s: &str) -> Result<Variant, String> {
        let f: Vec<&str> = s.split('/').collect();
        let n = |i: usize| -> Result<usize, String> {
            f.get(i)
                .and_then(|v| v.parse().ok())
                .ok_or(format!("variant `{s}`: PIECE/BUF/BLOCKING"))
        };
        Ok(Variant {
            send_piece: n(0)?,
            sock_buf: n(1)?,
            blocking: n(2)? != 0,
        })
    }
}

/// Sets up a connected socket as `v` says.
fn prepare(s: &TcpStream, v: Variant) {
    s.set_nodelay(true).unwrap();
    if v.sock_buf > 0 {
        set_buffers(s.as_raw_fd(), v.sock_buf);
    }
    s.set_nonblocking(!v.blocking).unwrap();
}

fn set_buffers(fd: std::os::fd::RawFd, bytes: usize) {
    let b = bytes as libc::c_int;
    for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        // SAFETY: `b` lives on this frame for the call and its size is passed with it; the
        // fd is open (its owner outlives the call).
        let rc = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&b as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "setsockopt: {}", std::io::Error::last_os_error());
    }
}

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

/// Writes all of `buf` in writes of at most `piece` bytes (0: no limit), spinning while
/// the socket buffer is full.
fn spin_write(s: &mut TcpStream, buf: &[u8], piece: usize) {
    let mut done = 0;
    while done < buf.len() {
        let end = if piece == 0 {
            buf.len()
        } else {
            buf.len().min(done + piece)
        };
        match s.write(&buf[done..end]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("floor peer: {e}"),
        }
    }
}

/// Waits for the next request: spins for up to a millisecond, then sleeps in the kernel
/// until one comes, so that the target takes no core while the bench runs the other
/// systems' rounds. False at end of stream.
fn await_request(s: &mut TcpStream, blocking: bool) -> bool {
    let mut probe = [0u8; 1];
    let start = Instant::now();
    while !blocking && start.elapsed() < Duration::from_millis(1) {
        match s.peek(&mut probe) {
            Ok(n) => return n > 0,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => panic!("floor peer: {e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
    let more = matches!(s.peek(&mut probe), Ok(n) if n > 0);
    s.set_nonblocking(!blocking).unwrap();
    more
}

/// The target side (this bench with `--tcp-floor LEN VARIANT`): prints its port, serves
/// one connection until the initiator closes it.
pub fn serve(max_len: usize, v: Variant) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    if v.sock_buf > 0 {
        // Accepted sockets inherit the listener's buffers (and the window scale they imply).
        set_buffers(l.as_raw_fd(), v.sock_buf);
    }
    println!("READY {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().unwrap();
    prepare(&s, v);
    let mut buf = vec![0u8; max_len];
    let mut head = [0u8; 9];
    while await_request(&mut s, v.blocking) && spin_read(&mut s, &mut head) {
        let len = u64::from_le_bytes(head[1..].try_into().unwrap()) as usize;
        if head[0] == WRITE {
            if !spin_read(&mut s, &mut buf[..len]) {
                return;
            }
            spin_write(&mut s, &[0], 0);
        } else {
            spin_write(&mut s, &buf[..len], v.send_piece);
        }
    }
}

/// The floor's target process, and the connection to it.
pub struct Floor {
    child: Child,
    conn: TcpStream,
    buf: Vec<u8>,
    variant: Variant,
}

impl Floor {
    pub fn start(max_len: usize, variant: Variant) -> Floor {
        let me = std::env::current_exe().unwrap();
        let mut child = Command::new(me)
            .args(["--tcp-floor", &max_len.to_string(), &variant.to_string()])
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
        prepare(&conn, variant);
        Floor {
            child,
            conn,
            buf: vec![1u8; 9 + max_len],
            variant,
        }
    }

    /// Microseconds per op of `len` bytes (`read`: READ, else WRITE), over `secs`, after
    /// one op of warm-up.
    pub fn us_per_op(&mut self, read: bool, len: usize, secs: f64) -> f64 {
        let (ops, secs) = self.timed(read, len, secs);
        secs * 1e6 / ops.max(1) as f64
    }

    /// Ops of `len` bytes over `secs`, after one op of warm-up: (ops, seconds).
    pub fn timed(&mut self, read: bool, len: usize, secs: f64) -> (u64, f64) {
        self.op(read, len);
        let start = Instant::now();
        let mut ops = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            self.op(read, len);
            ops += 1;
        }
        (ops, start.elapsed().as_secs_f64())
    }

    /// The floor's target process (for its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn op(&mut self, read: bool, len: usize) {
        self.buf[0] = if read { READ } else { WRITE };
        self.buf[1..9].copy_from_slice(&(len as u64).to_le_bytes());
        if read {
            spin_write(&mut self.conn, &self.buf[..9], 0);
            assert!(spin_read(&mut self.conn, &mut self.buf[9..9 + len]));
        } else {
            spin_write(
                &mut self.conn,
                &self.buf[..9 + len],
                self.variant.send_piece,
            );
            assert!(spin_read(&mut self.conn, &mut self.buf[..1]));
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
        let _ = self.child.wait();
    }
}

/// `--floor-client LEN`: the floor (default variant, ops up to `len` bytes) for a bench in
/// another language, which alternates it with its own rounds: each stdin line `read|write
/// BYTES SECONDS` is answered with one line, the µs per op. Ends at the end of stdin.
pub fn client(len: usize) {
    let mut floor = Floor::start(len, Variant::default());
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        let [op, bytes, secs] = f[..] else {
            panic!("--floor-client: expected `read|write BYTES SECONDS`, got `{line}`");
        };
        let bytes: usize = bytes.parse().expect("bytes");
        assert!(
            bytes <= len,
            "--floor-client: {bytes} bytes exceed its {len}"
        );
        let us = floor.us_per_op(op == "read", bytes, secs.parse().expect("seconds"));
        writeln!(out, "{us:.2}").unwrap();
        out.flush().unwrap();
    }
}

/// `--floor-variants`: the floor's shapes at each size under each variant, alternated
/// round by round (medians of 3), as a table.
pub fn variants(sizes: &[usize], secs: f64) {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let v = |send_piece, sock_buf, blocking| Variant {
        send_piece,
        sock_buf,
        blocking,
    };
    let list = [
        Variant::default(),
        v(0, 4 << 20, false),
        v(16 << 10, 0, false),
        v(32 << 10, 0, false),
        v(256 << 10, 0, false),
        v(0, 0, true),
    ];
    let mut floors: Vec<Floor> = list.iter().map(|&v| Floor::start(max, v)).collect();
    println!("## the TCP floor, driven in other ways (alternated rounds, medians of 3; us/op)\n");
    let head: Vec<String> = list.iter().map(|v| v.name()).collect();
    println!("| op | size | {} |", head.join(" | "));
    println!("|{}", " --- |".repeat(2 + list.len()));
    for (op, read) in [("WRITE", false), ("READ", true)] {
        for &size in sizes {
            eprintln!("floor variants {op} {size} B");
            let mut us = vec![Vec::new(); list.len()];
            for _ in 0..3 {
                for (f, u) in floors.iter_mut().zip(&mut us) {
                    u.push(f.us_per_op(read, size, secs / 3.0));
                }
            }
            let cells: Vec<String> = us
                .iter_mut()
                .map(|u| {
                    u.sort_by(f64::total_cmp);
                    format!("{:.1}", u[1])
                })
                .collect();
            println!("| {op} | {size} | {} |", cells.join(" | "));
        }
    }
}
