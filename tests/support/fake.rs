//! A scripted HTTP server for the agent's attack tests: each path answers whatever the
//! test's handler writes to the raw socket, and every request is recorded with its time.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Request {
    pub at: Instant,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Writes a whole answer; `n` is how many times this path was asked before (0 first).
pub type Handler = Box<dyn Fn(&Request, usize, &mut TcpStream) + Send + Sync>;

pub struct FakeServer {
    pub port: u16,
    log: Arc<Mutex<Vec<Request>>>,
}

impl FakeServer {
    pub fn start(routes: HashMap<&'static str, Handler>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let routes = Arc::new(routes);
        let thread_log = log.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let routes = routes.clone();
                let log = thread_log.clone();
                std::thread::spawn(move || serve(stream, &routes, &log));
            }
        });
        Self { port, log }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn requests(&self, path: &str) -> Vec<Request> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

fn serve(stream: TcpStream, routes: &HashMap<&'static str, Handler>, log: &Mutex<Vec<Request>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    // Routed by path alone, as a real server routes `connect?wait=30`.
    let target = parts.next().unwrap_or_default();
    let path = target.split_once('?').map_or(target, |(p, _)| p).to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    let _ = reader.read_exact(&mut body);
    let req = Request {
        at: Instant::now(),
        method,
        path: path.clone(),
        headers,
        body,
    };
    let n = {
        let mut log = log.lock().unwrap();
        let n = log.iter().filter(|r| r.path == path).count();
        log.push(req.clone());
        n
    };
    let mut stream = stream;
    match routes.get(path.as_str()) {
        Some(handler) => handler(&req, n, &mut stream),
        None => respond(&mut stream, 404, &[], b"not here"),
    }
}

/// A complete answer that closes the connection.
pub fn respond(stream: &mut TcpStream, status: u16, headers: &[(&str, &str)], body: &[u8]) {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let _ = stream.flush();
}
