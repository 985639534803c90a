//! A TCP link to a database server whose replies can be slowed down: a proxy on a local
//! port that forwards both ways and holds each chunk the server sends for the latency set
//! at that moment. Lease tests use it to make a reply come back late, and to cut the link
//! right after the server answered a given statement.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A proxy to one server address.
pub struct SlowLink {
    /// The local port to connect to instead of the server's.
    pub port: u16,
    latency_micros: Arc<AtomicU64>,
    cut: Arc<Cut>,
}

/// A cut armed on a statement: the connection whose client sends a chunk holding
/// `marker` is closed right after the server's next reply to it is passed on. It fires
/// once.
#[derive(Default)]
struct Cut {
    marker: Mutex<Option<Vec<u8>>>,
    fired: AtomicU64,
}

impl Cut {
    /// Whether `chunk` (from a client) fires the armed cut.
    fn fires_on(&self, chunk: &[u8]) -> bool {
        let mut marker = self.marker.lock().unwrap();
        let hit = marker
            .as_deref()
            .is_some_and(|m| chunk.windows(m.len()).any(|w| w == m));
        if hit {
            *marker = None;
            self.fired.fetch_add(1, Ordering::SeqCst);
        }
        hit
    }
}

impl SlowLink {
    /// A proxy to `server` (`127.0.0.1:5432`), forwarding at full speed for now.
    pub fn to(server: &str) -> SlowLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let port = listener.local_addr().unwrap().port();
        let latency_micros = Arc::new(AtomicU64::new(0));
        let cut = Arc::new(Cut::default());
        let (server, latency, cuts) = (
            server.to_string(),
            Arc::clone(&latency_micros),
            Arc::clone(&cut),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                // This connection's cut, once its client sent the marked statement.
                let fired = Arc::new(AtomicBool::new(false));
                forward(
                    client.try_clone().unwrap(),
                    upstream.try_clone().unwrap(),
                    Direction::ToServer(Arc::clone(&cuts)),
                    Arc::clone(&fired),
                );
                forward(
                    upstream,
                    client,
                    Direction::ToClient(Arc::clone(&latency)),
                    fired,
                );
            }
        });
        SlowLink {
            port,
            latency_micros,
            cut,
        }
    }

    /// Closes the connection that next sends a statement holding `marker` (`b"COMMIT"`)
    /// right after the server's reply to it reached the client: the client has its answer,
    /// and its next statement finds the connection lost.
    pub fn cut_after_reply_to(&self, marker: &[u8]) {
        *self.cut.marker.lock().unwrap() = Some(marker.to_vec());
    }

    /// How many armed cuts found their statement.
    pub fn cuts(&self) -> u64 {
        self.cut.fired.load(Ordering::SeqCst)
    }

    /// Holds every chunk the server sends from now on for `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_micros
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// `url` (`scheme://user@127.0.0.1:<port>/...`) through this link, in clear text so
    /// that a cut can find its statement: libpq would negotiate TLS where the server
    /// offers it, and mysql_async would leave the link for the server's Unix socket on a
    /// loopback address.
    pub fn url(&self, url: &str, server_port: u16) -> String {
        let from = format!(":{server_port}/");
        assert!(url.contains(&from), "{url} names port {server_port}");
        let linked = url.replacen(&from, &format!(":{}/", self.port), 1);
        let join = if linked.contains('?') { '&' } else { '?' };
        if linked.starts_with("mysql:") {
            format!("{linked}{join}prefer_socket=false")
        } else {
            format!("{linked}{join}sslmode=disable")
        }
    }
}

/// Which way a [`forward`] copies.
enum Direction {
    /// Statements, watched for the armed cut.
    ToServer(Arc<Cut>),
    /// Replies, each chunk held for the latency.
    ToClient(Arc<AtomicU64>),
}

/// Copies `from` to `to` on a thread of its own, holding each reply for the latency and
/// closing the link where an armed cut says.
fn forward(mut from: TcpStream, mut to: TcpStream, direction: Direction, fired: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // A reply read after the marked statement was sent is its reply: the client
            // sends a statement only after the previous reply was passed on whole. Read
            // here, before passing the chunk on, so that the reply to the statement before
            // the marked one is never taken for the marked one's.
            let last_reply =
                matches!(direction, Direction::ToClient(_)) && fired.load(Ordering::SeqCst);
            match &direction {
                Direction::ToServer(cut) => {
                    if cut.fires_on(&buffer[..n]) {
                        fired.store(true, Ordering::SeqCst);
                    }
                }
                Direction::ToClient(latency) => {
                    let micros = latency.load(Ordering::SeqCst);
                    if micros > 0 {
                        std::thread::sleep(Duration::from_micros(micros));
                    }
                }
            }
            if to.write_all(&buffer[..n]).is_err() {
                break;
            }
            if last_reply {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
