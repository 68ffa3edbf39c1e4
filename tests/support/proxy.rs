//! A TCP proxy between an agent and its server that counts the bytes the server sends,
//! can damage or cut a delta in flight, and can lose an answer: what a test needs to see what
//! crossed the wire, and what a flaky network does.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What every delta starts with (agent_delta::format::MAGIC).
const DELTA_MAGIC: &[u8] = b"AGDELTA1";

pub struct Proxy {
    pub port: u16,
    down: Arc<AtomicU64>,
    flipped: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

/// What the proxy does to the traffic besides passing it on.
#[derive(Clone, Copy)]
enum Damage {
    None,
    /// Flip the byte this many bytes after a delta's magic, once.
    FlipDelta(usize),
    /// Pass a delta on up to this many bytes after its magic, then cut the connection,
    /// once.
    CutDelta(usize),
    /// Pass the first request whose head starts with this on to the server, then cut the
    /// connection before its answer reaches the client, once.
    LoseAnswerTo(&'static str),
}

impl Proxy {
    /// Forwards 127.0.0.1:<port> to 127.0.0.1:`upstream`.
    pub fn start(upstream: u16) -> Self {
        Self::start_with(upstream, Damage::None)
    }

    /// Like [`Proxy::start`]; the first delta that passes through has the byte
    /// `flip_at` bytes after its magic flipped, once.
    pub fn flipping_a_delta(upstream: u16, flip_at: usize) -> Self {
        Self::start_with(upstream, Damage::FlipDelta(flip_at))
    }

    /// Like [`Proxy::start`]; the first delta that passes through is cut `cut_at` bytes
    /// after its magic (its client has those bytes, then the connection ends), once.
    pub fn cutting_a_delta(upstream: u16, cut_at: usize) -> Self {
        Self::start_with(upstream, Damage::CutDelta(cut_at))
    }

    /// Like [`Proxy::start`]; the first request whose head starts with `request` (say
    /// `POST /agent/register`) reaches the server, and its answer is lost: the
    /// connection is cut once the server has answered.
    pub fn losing_the_answer_to(upstream: u16, request: &'static str) -> Self {
        Self::start_with(upstream, Damage::LoseAnswerTo(request))
    }

    fn start_with(upstream: u16, damage: Damage) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = Arc::new(AtomicU64::new(0));
        let flip_at = match damage {
            Damage::FlipDelta(at) => Some(Hit::Flip(at)),
            Damage::CutDelta(at) => Some(Hit::Cut(at)),
            _ => None,
        };
        // Without a flip there is nothing to do: mark it done.
        let flipped = Arc::new(AtomicBool::new(flip_at.is_none()));
        let lost = Arc::new(AtomicBool::new(false));
        let (counter, once, lost_once) = (down.clone(), flipped.clone(), lost.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (client_r, server_w) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                // Set before the request is passed on, so its answer is never forwarded.
                let cut = Arc::new(AtomicBool::new(false));
                let lose = match damage {
                    Damage::LoseAnswerTo(head) => Some((head, lost_once.clone(), cut.clone())),
                    _ => None,
                };
                std::thread::spawn(move || pipe(client_r, server_w, lose));
                let (counter, once) = (counter.clone(), once.clone());
                std::thread::spawn(move || {
                    downstream(server, client, &counter, &once, flip_at, &cut)
                });
            }
        });
        Self {
            port,
            down,
            flipped,
            lost,
        }
    }

    /// True once an answer was lost.
    pub fn lost_an_answer(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Bytes the server has sent through the proxy so far.
    pub fn bytes_down(&self) -> u64 {
        self.down.load(Ordering::SeqCst)
    }

    /// True once a delta was damaged or cut (always true for a proxy that damages
    /// nothing).
    pub fn flipped(&self) -> bool {
        self.flipped.load(Ordering::SeqCst)
    }
}

type Lose = (&'static str, Arc<AtomicBool>, Arc<AtomicBool>);

/// What happens to a delta, so many bytes after its magic.
#[derive(Clone, Copy)]
enum Hit {
    Flip(usize),
    Cut(usize),
}

impl Hit {
    fn after(self) -> usize {
        match self {
            Hit::Flip(at) | Hit::Cut(at) => at,
        }
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream, lose: Option<Lose>) {
    let mut buf = [0u8; 64 * 1024];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        if let Some((head, lost_once, cut)) = &lose
            && buf[..n].starts_with(head.as_bytes())
            && !lost_once.swap(true, Ordering::SeqCst)
        {
            cut.store(true, Ordering::SeqCst);
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn downstream(
    mut from: TcpStream,
    mut to: TcpStream,
    counter: &AtomicU64,
    once: &AtomicBool,
    flip_at: Option<Hit>,
    cut: &AtomicBool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    // The stream's last bytes, so a magic split across two reads is still found.
    let mut seen: Vec<u8> = Vec::new();
    let mut offset = 0usize;
    let mut flip: Option<usize> = None;
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 {
            break;
        }
        if cut.load(Ordering::SeqCst) {
            // The server answered; the client never hears it.
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
            return;
        }
        let chunk = &mut buf[..n];
        if let Some(hit) = flip_at
            && flip.is_none()
            && !once.load(Ordering::SeqCst)
        {
            let start = offset - seen.len();
            seen.extend_from_slice(chunk);
            if let Some(at) = seen
                .windows(DELTA_MAGIC.len())
                .position(|w| w == DELTA_MAGIC)
            {
                flip = Some(start + at + hit.after());
            }
            let keep = seen.len().saturating_sub(DELTA_MAGIC.len());
            seen.drain(..keep);
        }
        if let Some(at) = flip
            && (offset..offset + n).contains(&at)
            && !once.swap(true, Ordering::SeqCst)
        {
            if let Some(Hit::Cut(_)) = flip_at {
                // Its client gets the bytes before `at`, then the end of the connection.
                counter.fetch_add((at - offset) as u64, Ordering::SeqCst);
                let _ = to.write_all(&chunk[..at - offset]);
                let _ = to.shutdown(Shutdown::Both);
                let _ = from.shutdown(Shutdown::Both);
                return;
            }
            chunk[at - offset] ^= 0x40;
        }
        offset += n;
        counter.fetch_add(n as u64, Ordering::SeqCst);
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
