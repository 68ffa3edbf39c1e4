//! The networks an agent meets: Debian's squid as its proxy and nginx as a download
//! source, each started by the test on a free port with a configuration of its own
//! under the test's directory, and a source that stalls.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{
    TestContext, free_port, pid_gone, read_file, require_tool, run_ok, signal, wait_until,
};

/// True when this process runs as root: squid then drops to its own user, which must be
/// able to reach its files.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A squid on 127.0.0.1, allowing `CONNECT` to the ports it is given only.
pub struct Squid {
    pub port: u16,
    pub dir: PathBuf,
    pid: u32,
}

/// Where Debian keeps squid's basic authentication helper.
const NCSA_AUTH: &str = "/usr/lib/squid/basic_ncsa_auth";

impl Squid {
    /// Starts squid in `ctx`'s `name/`, asking for `user` (name, password) when given,
    /// and waits until it accepts connections.
    pub fn start(
        ctx: &TestContext,
        name: &str,
        connect_ports: &[u16],
        user: Option<(&str, &str)>,
    ) -> Self {
        require_tool("squid");
        require_tool("openssl");
        let dir = ctx.path(name);
        fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let ports: Vec<String> = connect_ports.iter().map(u16::to_string).collect();
        let d = dir.display();
        let mut conf = format!(
            "http_port 127.0.0.1:{port}\n\
             pid_filename {d}/squid.pid\n\
             access_log stdio:{d}/access.log\n\
             cache_log {d}/cache.log\n\
             cache_store_log none\n\
             cache deny all\n\
             coredump_dir {d}\n\
             pinger_enable off\n\
             netdb_filename none\n\
             shutdown_lifetime 0 seconds\n\
             acl CONNECT method CONNECT\n\
             acl test_ports port {}\n\
             http_access deny CONNECT !test_ports\n",
            ports.join(" ")
        );
        match user {
            Some((user, password)) => {
                // basic_ncsa_auth reads htpasswd lines; openssl makes the APR1 hash.
                let hash = run_ok(Command::new("openssl").args(["passwd", "-apr1", password]));
                let hash = String::from_utf8_lossy(&hash.stdout).trim().to_owned();
                fs::write(dir.join("passwd"), format!("{user}:{hash}\n")).unwrap();
                conf.push_str(&format!(
                    "auth_param basic program {NCSA_AUTH} {d}/passwd\n\
                     auth_param basic realm e2e\n\
                     acl authed proxy_auth REQUIRED\n\
                     http_access allow authed\n"
                ));
            }
            None => conf.push_str("http_access allow all\n"),
        }
        conf.push_str("http_access deny all\n");
        if is_root() {
            // Squid refuses to run as root: it becomes `proxy`, which must reach its
            // directory through the test's (private) one.
            conf.push_str("cache_effective_user proxy\n");
            let mut perms = fs::metadata(ctx.dir.path()).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o711);
            fs::set_permissions(ctx.dir.path(), perms).unwrap();
        }
        fs::write(dir.join("squid.conf"), conf).unwrap();
        if is_root() {
            run_ok(Command::new("chown").args(["-R", "proxy"]).arg(&dir));
        }
        let mut cmd = Command::new("squid");
        // Squids of one service name share memory segments (/dev/shm/squid-*): each
        // test's has its own.
        cmd.arg("-N")
            .arg("-n")
            .arg(format!("e2e{port}"))
            .arg("-f")
            .arg(dir.join("squid.conf"));
        cmd.stdout(Stdio::null())
            .stderr(fs::File::create(dir.join("squid.out")).unwrap());
        let pid = ctx.spawn(cmd);
        let squid = Self { port, dir, pid };
        wait_until(
            Duration::from_secs(30),
            "squid to accept connections",
            || {
                assert!(
                    !pid_gone(pid),
                    "squid exited:\n{}\n{}",
                    read_file(&squid.dir.join("squid.out")),
                    read_file(&squid.dir.join("cache.log"))
                );
                read_file(&squid.dir.join("cache.log"))
                    .contains("Accepting HTTP Socket connections")
                    && TcpStream::connect(("127.0.0.1", port)).is_ok()
            },
        );
        squid
    }

    /// `http://127.0.0.1:<port>`, with `user:password@` when given.
    pub fn url(&self, user: Option<(&str, &str)>) -> String {
        match user {
            Some((u, p)) => format!("http://{u}:{p}@127.0.0.1:{}", self.port),
            None => format!("http://127.0.0.1:{}", self.port),
        }
    }

    pub fn access_log(&self) -> String {
        read_file(&self.dir.join("access.log"))
    }

    /// `CONNECT 127.0.0.1:<port>` lines of the access log that squid let through.
    pub fn tunnels_to(&self, port: u16) -> usize {
        let target = format!("CONNECT 127.0.0.1:{port} ");
        self.access_log()
            .lines()
            .filter(|l| l.contains(&target) && l.contains("TCP_TUNNEL/200"))
            .count()
    }

    /// Stops squid (TERM) and waits until it is gone and its port closed.
    pub fn stop(&self) {
        signal(self.pid, "TERM");
        wait_until(Duration::from_secs(20), "squid to stop", || {
            pid_gone(self.pid) && TcpStream::connect(("127.0.0.1", self.port)).is_err()
        });
    }
}

/// An nginx serving the files under `www/` on 127.0.0.1.
pub struct Nginx {
    pub port: u16,
    pub www: PathBuf,
    dir: PathBuf,
}

impl Nginx {
    pub fn start(ctx: &TestContext, name: &str) -> Self {
        require_tool("nginx");
        let dir = ctx.path(name);
        let www = dir.join("www");
        fs::create_dir_all(&www).unwrap();
        fs::create_dir_all(dir.join("tmp")).unwrap();
        let port = free_port();
        let d = dir.display();
        // As root its workers would become nobody, who cannot read the test's files.
        let user = if is_root() { "user root;\n" } else { "" };
        let conf = format!(
            "{user}daemon off;\n\
             worker_processes 1;\n\
             error_log {d}/error.log;\n\
             pid {d}/nginx.pid;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n\
               access_log {d}/access.log;\n\
               client_body_temp_path {d}/tmp/body;\n\
               proxy_temp_path {d}/tmp/proxy;\n\
               fastcgi_temp_path {d}/tmp/fastcgi;\n\
               uwsgi_temp_path {d}/tmp/uwsgi;\n\
               scgi_temp_path {d}/tmp/scgi;\n\
               default_type application/octet-stream;\n\
               server {{\n\
                 listen 127.0.0.1:{port};\n\
                 root {www};\n\
               }}\n\
             }}\n",
            www = www.display()
        );
        fs::write(dir.join("nginx.conf"), conf).unwrap();
        let mut cmd = Command::new("nginx");
        cmd.arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"));
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let pid = ctx.spawn(cmd);
        let nginx = Self { port, www, dir };
        wait_until(
            Duration::from_secs(20),
            "nginx to accept connections",
            || {
                assert!(
                    !pid_gone(pid),
                    "nginx exited:\n{}",
                    read_file(&nginx.dir.join("error.log"))
                );
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            },
        );
        nginx
    }

    /// `http://127.0.0.1:<port>/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!(
            "http://127.0.0.1:{}/{}",
            self.port,
            path.trim_start_matches('/')
        )
    }

    /// Its access log: one line per request, with the status.
    pub fn access_log(&self) -> String {
        read_file(&self.dir.join("access.log"))
    }

    /// Puts `file` under `www/<dir>/` with its own name.
    pub fn serve(&self, dir: &str, file: &Path) -> PathBuf {
        let into = self.www.join(dir);
        fs::create_dir_all(&into).unwrap();
        let to = into.join(file.file_name().unwrap());
        fs::copy(file, &to).unwrap();
        to
    }
}

/// A download source that answers `200` with the whole file's length, sends `head`, and
/// then sends nothing more while holding the connection open: a stalled CDN node.
/// Returns its port.
pub fn stalled_source(head: Vec<u8>, full_length: u64) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut writer = &stream;
            let _ = write!(
                writer,
                "HTTP/1.1 200 OK\r\nContent-Length: {full_length}\r\nContent-Type: application/octet-stream\r\n\r\n"
            );
            let _ = writer.write_all(&head);
            let _ = writer.flush();
            held.push(stream);
        }
    });
    port
}
