//! Tests of the socket layer: deadlines of bulk reads and writes, read-ahead, busy polls,
//! gathered writes and scattered reads.

use super::*;

/// A connected client stream, and a peer task that reads pieces of `piece` bytes until
/// the stream closes and returns how many it read.
async fn stream_to_a_counting_peer(piece: usize) -> (Stream, tokio::task::JoinHandle<u64>) {
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let s = l.accept().await.unwrap();
        let mut buf = vec![0u8; piece];
        let mut pieces = 0u64;
        while s
            .read_exact_eager(&mut buf, Instant::now() + FAR, Duration::ZERO)
            .await
            .is_ok()
        {
            pieces += 1;
        }
        pieces
    });
    let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    (c, peer)
}

/// A bulk read or write whose deadline has passed fails with `TimedOut` before it moves
/// a byte; within the deadline the same calls move everything (the peer here reads one
/// byte at a time and counts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_reads_and_writes_past_their_deadline_move_nothing() {
    let (c, drain) = stream_to_a_counting_peer(1).await;
    let big = vec![5u8; 8 << 20];
    let e = c
        .write_all_eager(b"hdr", &big, Instant::now())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    // Within the deadline the same call moves everything.
    c.write_all_eager(b"", &big[..4096], Instant::now() + FAR)
        .await
        .unwrap();
    let mut back = [0u8; 16];
    let e = c
        .read_exact_eager(&mut back, Instant::now(), Duration::ZERO)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    drop(c);
    assert_eq!(
        drain.await.unwrap(),
        4096,
        "nothing written past the deadline"
    );
}

/// A peer that reads as fast as the writer writes rarely makes it wait, so the write
/// loop must notice its deadline itself: writes of 64 MiB, one after another, to such a
/// peer end with `TimedOut` soon after the deadline (without the check they would go on
/// until the cap below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_write_to_a_peer_that_keeps_up_stops_at_its_deadline() {
    let (c, drain) = stream_to_a_counting_peer(1 << 20).await;
    let big = vec![5u8; 64 << 20];
    let until = Instant::now() + std::time::Duration::from_millis(100);
    let cap = until + std::time::Duration::from_secs(10);
    let ended = loop {
        match c.write_all_eager(b"", &big, until).await {
            Ok(()) if Instant::now() < cap => continue,
            Ok(()) => break None,
            Err(e) => break Some(e),
        }
    };
    let e = ended.expect("the writes went on past the deadline until the cap");
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    drop(c);
    assert!(
        drain.await.unwrap() > 0,
        "the peer received data before the deadline"
    );
}

/// A small read takes a whole header in one system call and keeps the rest; the
/// bytes kept count as readable (the socket itself is empty by then, so a wait on the
/// poller would never end) and every kind of read takes them first, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_read_ahead_are_readable_and_come_first() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let mut s = l.accept().await.unwrap();
    let message: Vec<u8> = (0..100u8).collect();
    c.write_all(&message).await.unwrap();
    // The whole message is in before the first read.
    s.poll_readable(FAR, 0).await;
    assert_eq!(s.read_u8().await.unwrap(), 0);
    assert!(s.readable_now(READ_AHEAD), "bytes read ahead are readable");
    tokio::time::timeout(Duration::from_secs(5), s.readable())
        .await
        .expect("a wait with bytes read ahead returns at once")
        .unwrap();
    let mut four = [0u8; 4];
    s.read_exact(&mut four).await.unwrap();
    assert_eq!(four, [1, 2, 3, 4]);
    let mut rest = vec![0u8; 95];
    s.read_exact_eager(&mut rest, Instant::now() + FAR, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(rest, &message[5..]);
    // Nothing is left: the next read would block, and a later message reads whole.
    assert_eq!(
        s.try_read(&mut [0u8; 8]).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    c.write_all(&[7, 8]).await.unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).await.unwrap();
    assert_eq!(two, [7, 8]);
}

/// A bulk read that runs dry mid-way polls the socket for its `spin` window before it
/// waits on the poller: bytes that come within the window are read without the stream
/// registering (a wait there is a wake-up by the I/O driver, many per megabyte).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_read_that_runs_dry_polls_before_it_waits_on_the_poller() {
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let mut s = l.accept().await.unwrap();
    let half = vec![9u8; 1000];
    c.write_all_eager(&[], &half, Instant::now() + FAR)
        .await
        .unwrap();
    let sender = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        c.write_all_eager(&[], &[9u8; 1000], Instant::now() + FAR)
            .await
            .unwrap();
        c
    });
    let mut got = vec![0u8; 2000];
    s.read_exact_eager(&mut got, Instant::now() + FAR, FAR)
        .await
        .unwrap();
    assert!(got.iter().all(|&b| b == 9));
    assert!(
        s.reg.get_mut().is_none(),
        "the read waited on the poller although the bytes came within its spin window"
    );
    drop(sender.await.unwrap());
}

/// A bulk send hands the kernel at most [`SEND_PIECE`] bytes per system call, although
/// the socket takes more (on a fresh loopback connection one non-blocking `send` of
/// 1 MiB goes in whole), so the receiver can copy out one piece while the next goes in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_send_hands_the_kernel_one_piece_per_call() {
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let _s = l.accept().await.unwrap();
    let big = vec![1u8; 1 << 20];
    // At most: a host with smaller socket buffers may take less.
    let n = c.try_write_gather(&[], &[&big]).unwrap();
    assert!(n > 0 && n <= SEND_PIECE, "one send took {n} bytes");
    let n = c.try_write_gather(b"hdr", &[&big]).unwrap();
    assert!(n <= 3 + SEND_PIECE, "one send took {n} bytes");
}

/// A gathered write delivers the prefix and then every buffer's bytes in order, whole,
/// however the kernel cuts it: more buffers than one `sendmsg` gathers, empty ones
/// among them, and a peer reading in small pieces so that sends end mid-buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gathered_write_delivers_every_buffer_in_order() {
    use tokio::io::AsyncReadExt;
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let mut s = l.accept().await.unwrap();
        let (mut got, mut piece) = (Vec::new(), [0u8; 1000]);
        loop {
            match s.read(&mut piece).await.unwrap() {
                0 => return got,
                n => got.extend_from_slice(&piece[..n]),
            }
        }
    });
    let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let owned: Vec<Vec<u8>> = (0..3 * MAX_GATHER)
        .map(|i| (0..(i * 1237) % 9000).map(|j| (i * 7 + j) as u8).collect())
        .collect();
    assert!(owned.iter().any(|b| b.is_empty()));
    let bufs: Vec<&[u8]> = owned.iter().map(|b| &b[..]).collect();
    c.write_all_gather_eager(b"hdr!", &bufs, Instant::now() + FAR)
        .await
        .unwrap();
    drop(c);
    let want: Vec<u8> = b"hdr!"
        .iter()
        .chain(owned.iter().flatten())
        .copied()
        .collect();
    let got = peer.await.unwrap();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the bytes arrived out of order");
}

/// A scattered read fills pieces of every size in order, empty ones among them and more
/// than one `recvmsg` can take, with bytes read ahead (a small read first) taken before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scattered_read_fills_every_piece_in_order() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let sizes: Vec<usize> = (0..3 * MAX_GATHER).map(|i| (i * 1237) % 9000).collect();
    let total: usize = sizes.iter().sum();
    let want: Vec<u8> = (0..total).map(|j| (j * 13 % 251) as u8).collect();
    let sent = want.clone();
    let peer = tokio::spawn(async move {
        let mut s = l.accept().await.unwrap();
        s.write_all(b"hd").await.unwrap();
        for part in sent.chunks(7001) {
            s.write_all(part).await.unwrap();
        }
        s.shutdown().await.unwrap();
    });
    let mut c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let mut head = [0u8; 2];
    c.read_exact(&mut head).await.unwrap(); // a small read: the rest is read ahead
    assert_eq!(&head, b"hd");
    let mut bufs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
    let pieces: Vec<Piece> = bufs
        .iter_mut()
        .map(|b| (b.as_mut_ptr() as usize, b.len()))
        .collect();
    // SAFETY: every piece is a buffer of `bufs`, untouched until the read ends.
    unsafe { c.read_exact_scatter_eager(&pieces, Instant::now() + FAR, Duration::ZERO) }
        .await
        .unwrap();
    let got: Vec<u8> = bufs.into_iter().flatten().collect();
    assert!(got == want, "the bytes landed out of order");
    peer.await.unwrap();
}

/// A busy-poll told how much of the coming message its caller will read takes all of
/// a small one (a 4 KiB READ's answer) in one `recv`, not just the first
/// [`READ_AHEAD`] bytes; told nothing, it takes no more than those.
#[rstest::rstest]
#[case::told_the_size(4096 + 65, 4096 + 10)]
#[case::told_nothing(0, READ_AHEAD)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_poll_takes_as_much_of_a_small_message_as_the_caller_expects(
    #[case] expect: usize,
    #[case] taken: usize,
) {
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let mut s = l.accept().await.unwrap();
    let message: Vec<u8> = (0..4096 + 10).map(|i| (i % 251) as u8).collect();
    c.write_all_eager(&[], &message, Instant::now() + FAR)
        .await
        .unwrap();
    // The peer sent it in one system call; on loopback it is all in once any is.
    let until = Instant::now() + FAR;
    while queued(&s) < message.len() && Instant::now() < until {
        std::thread::yield_now();
    }
    s.poll_readable(FAR, expect).await;
    {
        let ahead = s.ahead.lock();
        assert_eq!(
            ahead.end - ahead.start,
            taken,
            "bytes taken by the busy-poll"
        );
    }
    let mut got = vec![0u8; message.len()];
    s.read_exact_eager(&mut got, Instant::now() + FAR, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(got, message);
}

/// A bulk write that fits the socket buffer leaves at once: it never waits for a
/// readiness event first. (A stream that has just left the poller registers again
/// when it must wait, and a fresh registration learns of readiness only at the I/O
/// driver's next turn: a 64 KiB WRITE waited that turn before its first byte.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_write_with_room_in_the_socket_buffer_never_waits_on_the_poller() {
    let (mut c, drain) = stream_to_a_counting_peer(1).await;
    c.poll_readable(Duration::from_micros(1), 0).await;
    assert!(c.reg.get_mut().is_none(), "busy-polling leaves the poller");
    c.write_all_eager(b"hdr", &[5u8; 1024], Instant::now() + FAR)
        .await
        .unwrap();
    assert!(
        c.reg.get_mut().is_none(),
        "the write waited on the poller although the socket had room"
    );
    drop(c);
    assert_eq!(drain.await.unwrap(), 3 + 1024);
}

/// A busy-poll checks with a `recv`, so an error it meets must reach the next read: a
/// peer that resets the connection is a reset there, not a quiet end of stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_met_while_busy_polling_reaches_the_next_read() {
    let l = Listener::bind(&"tcp://127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let mut c = Stream::connect(&addr, Deadline::after(FAR)).await.unwrap();
    let s = l.accept().await.unwrap();
    let set = hmc_transport_kit::nonblocking::reset_on_close(s.fd());
    assert!(set.is_ok(), "SO_LINGER: {set:?}");
    drop(s); // closing with a zero linger sends a reset
    c.poll_readable(FAR, 0).await;
    let e = c.try_read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
}

/// Bytes waiting in `s`'s receive queue (`FIONREAD`).
fn queued(s: &Stream) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` lives on this frame for the call, the size FIONREAD writes; the fd is
    // `s`'s, open for the call.
    let rc = unsafe { libc::ioctl(s.fd(), libc::FIONREAD, &mut n) };
    assert_eq!(rc, 0, "FIONREAD: {}", io::Error::last_os_error());
    n as usize
}

const FAR: std::time::Duration = std::time::Duration::from_secs(20);
use std::time::Duration;
