//! Headless Chromium driven over W3C WebDriver: Debian's `chromium` and
//! `chromium-driver`, one `chromedriver` per test on a loopback port.
//!
//! A minimal client over this crate's own HTTP helper rather than a WebDriver crate:
//! the tests need a dozen endpoints (open a page, find, type, click, read, screenshot),
//! each one JSON request, and a crate such as fantoccini brings an async stack and a
//! TLS client to build for that.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::{TestContext, free_port, require_tool, wait_until};

/// The key W3C WebDriver names an element reference by.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// How long a page opened by a click may take to show.
pub const PAGE_WAIT: Duration = Duration::from_secs(30);

/// A browser session; ended (and its Chromium closed) on drop.
pub struct Browser {
    port: u16,
    session: String,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

impl Browser {
    /// Starts chromedriver (killed with the context) and a headless Chromium with a
    /// fresh profile under the test's directory.
    pub fn start(ctx: &TestContext) -> Self {
        require_tool(CHROMIUM);
        require_tool(CHROMEDRIVER);
        let port = free_port();
        let log = ctx.path("chromedriver.log");
        let mut cmd = Command::new(CHROMEDRIVER);
        cmd.arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        ctx.spawn(cmd);
        wait_until(Duration::from_secs(20), "chromedriver to answer", || {
            call(port, "GET", "/status", None).is_ok_and(|v| v["ready"] == true)
        });
        let profile = ctx.path("chromium-profile");
        std::fs::create_dir_all(&profile).unwrap();
        let args = [
            "--headless=new",
            // Root in a container: Chromium's sandbox needs user namespaces it lacks.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,1000",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect::<Vec<_>>();
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let answer = call(port, "POST", "/session", Some(&caps))
            .unwrap_or_else(|e| panic!("{e}; chromedriver log: {}", read(&log)));
        let session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {answer}"))
            .to_owned();
        Self { port, session }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        call(
            self.port,
            method,
            &format!("/session/{}{path}", self.session),
            body,
        )
    }

    fn ok(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        self.call(method, path, body)
            .unwrap_or_else(|e| panic!("webdriver {method} {path}: {e}"))
    }

    pub fn goto(&self, url: &str) {
        self.ok("POST", "/url", Some(&json!({ "url": url })));
    }

    pub fn url(&self) -> String {
        self.ok("GET", "/url", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// The page's HTML as the browser holds it now.
    pub fn source(&self) -> String {
        self.ok("GET", "/source", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub fn title(&self) -> String {
        self.ok("GET", "/title", None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// The first element matching the CSS selector, if any.
    pub fn try_find(&self, css: &str) -> Option<Element> {
        let v = self
            .call(
                "POST",
                "/element",
                Some(&json!({"using": "css selector", "value": css})),
            )
            .ok()?;
        v[ELEMENT].as_str().map(|id| Element(id.to_owned()))
    }

    pub fn find(&self, css: &str) -> Element {
        self.try_find(css).unwrap_or_else(|| {
            panic!(
                "no element {css:?} on {}; the page:\n{}",
                self.url(),
                self.source()
            )
        })
    }

    /// The first element matching `css`, waiting for a page a click opened to show it.
    pub fn wait_for(&self, css: &str) -> Element {
        let mut found = None;
        wait_until(PAGE_WAIT, &format!("{css:?} on the page"), || {
            found = self.try_find(css);
            found.is_some()
        });
        found.unwrap()
    }

    /// Waits until the first element matching `css` reads `text` (in part).
    pub fn wait_text(&self, css: &str, text: &str) {
        let mut seen = Vec::new();
        let start = std::time::Instant::now();
        while start.elapsed() < PAGE_WAIT {
            seen = self.texts(css);
            if seen.first().is_some_and(|t| t.contains(text)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "{css:?} never read {text:?}; it read {seen:?}; the page:\n{}",
            self.source()
        );
    }

    /// Waits until the browser's address ends with `suffix`.
    pub fn wait_url(&self, suffix: &str) {
        wait_until(
            PAGE_WAIT,
            &format!("the address to end with {suffix:?}"),
            || self.url().ends_with(suffix),
        );
    }

    /// The rendered text of every element matching `css`. Tried again while a page
    /// that a click opened replaces the one the elements were found on.
    pub fn texts(&self, css: &str) -> Vec<String> {
        let mut last = String::new();
        for _ in 0..50 {
            match self.try_texts(css) {
                Ok(texts) => return texts,
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("texts of {css:?}: {last}")
    }

    fn try_texts(&self, css: &str) -> Result<Vec<String>, String> {
        let list = self.call(
            "POST",
            "/elements",
            Some(&json!({"using": "css selector", "value": css})),
        )?;
        let mut texts = Vec::new();
        for id in list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e[ELEMENT].as_str())
        {
            let text = self.call("GET", &format!("/element/{id}/text"), None)?;
            texts.push(text.as_str().unwrap_or("").to_owned());
        }
        Ok(texts)
    }

    pub fn text(&self, el: &Element) -> String {
        self.ok("GET", &format!("/element/{}/text", el.0), None)
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub fn type_into(&self, el: &Element, text: &str) {
        self.ok(
            "POST",
            &format!("/element/{}/value", el.0),
            Some(&json!({ "text": text })),
        );
    }

    pub fn click(&self, el: &Element) {
        self.ok(
            "POST",
            &format!("/element/{}/click", el.0),
            Some(&json!({})),
        );
    }

    /// The text of an open `alert()`, if a script opened one.
    pub fn alert(&self) -> Option<String> {
        self.call("GET", "/alert/text", None)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
    }

    /// The browser's cookies for the current page, as WebDriver describes them.
    pub fn cookies(&self) -> Vec<Value> {
        self.ok("GET", "/cookie", None)
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// A PNG of the viewport, written to `path`.
    pub fn screenshot(&self, path: &Path) {
        use base64::Engine;
        let b64 = self.ok("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap_or(""))
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = call(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// One WebDriver command: its `value`, or the error WebDriver answered.
fn call(port: u16, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
    let body = body.map(Value::to_string).unwrap_or_default();
    let (status, answer) = exchange(port, method, path, &body)
        .map_err(|e| format!("chromedriver on port {port}: {e}"))?;
    let v: Value = serde_json::from_slice(&answer).map_err(|e| {
        format!(
            "{status} answered {e}: {}",
            String::from_utf8_lossy(&answer)
        )
    })?;
    if status == 200 {
        Ok(v["value"].clone())
    } else {
        Err(format!("{status}: {}", v["value"]))
    }
}

/// One request; the status and the body, read to its `Content-Length` (chromedriver
/// keeps the connection open whatever `Connection: close` says).
fn exchange(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, Vec<u8>)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let bad = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    // A page load or a click that navigates can take a while on a loaded machine.
    stream.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad(format!("no status line: {line:?}")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            length = v
                .trim()
                .parse()
                .map_err(|_| bad(format!("bad length: {line:?}")))?;
        }
    }
    let mut answer = vec![0; length];
    reader.read_exact(&mut answer)?;
    Ok((status, answer))
}
