//! A TCP link to a database server whose replies can be slowed down: a proxy on a local
//! port that forwards both ways and holds each chunk the server sends for the latency set
//! at that moment. Lease tests use it to make a reply come back late.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A proxy to one server address.
pub struct SlowLink {
    /// The local port to connect to instead of the server's.
    pub port: u16,
    latency_micros: Arc<AtomicU64>,
}

impl SlowLink {
    /// A proxy to `server` (`127.0.0.1:5432`), forwarding at full speed for now.
    pub fn to(server: &str) -> SlowLink {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a local port");
        let port = listener.local_addr().unwrap().port();
        let latency_micros = Arc::new(AtomicU64::new(0));
        let (server, latency) = (server.to_string(), Arc::clone(&latency_micros));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(upstream) = TcpStream::connect(&server) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = upstream.set_nodelay(true);
                forward(
                    client.try_clone().unwrap(),
                    upstream.try_clone().unwrap(),
                    None,
                );
                forward(upstream, client, Some(Arc::clone(&latency)));
            }
        });
        SlowLink {
            port,
            latency_micros,
        }
    }

    /// Holds every chunk the server sends from now on for `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.latency_micros
            .store(latency.as_micros() as u64, Ordering::SeqCst);
    }

    /// `url` (`scheme://user@127.0.0.1:<port>/...`) through this link.
    pub fn url(&self, url: &str, server_port: u16) -> String {
        let from = format!(":{server_port}/");
        assert!(url.contains(&from), "{url} names port {server_port}");
        url.replacen(&from, &format!(":{}/", self.port), 1)
    }
}

/// Copies `from` to `to` on a thread of its own, holding each chunk for the latency.
fn forward(mut from: TcpStream, mut to: TcpStream, latency: Option<Arc<AtomicU64>>) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(latency) = &latency {
                let micros = latency.load(Ordering::SeqCst);
                if micros > 0 {
                    std::thread::sleep(Duration::from_micros(micros));
                }
            }
            if to.write_all(&buffer[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
