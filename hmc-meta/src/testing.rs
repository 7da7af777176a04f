//! Test support (feature `testing`): a real `etcd` process on free ports in a temporary
//! directory, that tests kill, restart, stop and continue.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::MetadataUrl;

/// An `etcd` server this process started. Killed on drop.
pub struct EtcdProcess {
    dir: tempfile::TempDir,
    ip: IpAddr,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind(SocketAddr::new(ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The `etcd` binary: `$HMC_ETCD`, else `etcd` on `PATH`.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HMC_ETCD") {
        return Some(p.into());
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    })
}

impl EtcdProcess {
    /// Starts etcd on loopback. Panics, saying how to install it, when there is no `etcd`.
    pub fn start() -> Self {
        Self::start_on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }

    /// Starts etcd listening on `ip`.
    pub fn start_on(ip: IpAddr) -> Self {
        let mut p = EtcdProcess {
            dir: tempfile::tempdir().expect("a temporary directory"),
            ip,
            client_port: free_port(ip),
            peer_port: free_port(ip),
            child: None,
        };
        p.restart();
        p
    }

    /// `host:port` of its client endpoint.
    pub fn endpoint(&self) -> String {
        SocketAddr::new(self.ip, self.client_port).to_string()
    }

    /// `etcd://<endpoint>/<namespace>`.
    pub fn url(&self, namespace: &str) -> MetadataUrl {
        format!("etcd://{}/{namespace}", self.endpoint())
            .parse()
            .expect("a valid URL")
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILLs the server and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server (again) with the same data directory and ports, and waits until
    /// its client port accepts connections.
    pub fn restart(&mut self) {
        self.kill();
        let bin = etcd_binary().expect(
            "no `etcd` binary: install etcd-server (apt-get install etcd-server; `cargo xtask test` does it when root) or set HMC_ETCD",
        );
        let client = format!("http://{}", SocketAddr::new(self.ip, self.client_port));
        let peer = format!("http://{}", SocketAddr::new(self.ip, self.peer_port));
        let mut cmd = Command::new(bin);
        cmd.arg("--name=hmc-test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=hmc-test={peer}"))
            // Short election timings let leases as short as 1 s be granted.
            .arg("--heartbeat-interval=50")
            .arg("--election-timeout=500")
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join("etcd.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            );
        if cfg!(target_arch = "aarch64") {
            cmd.env("ETCD_UNSUPPORTED_ARCH", "arm64");
        }
        self.child = Some(cmd.spawn().expect("start etcd"));
        let addr = SocketAddr::new(self.ip, self.client_port);
        let start = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "etcd did not listen on {addr} within 30 s; its log: {}",
                std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal to the server (SIGSTOP to hang it, SIGCONT to resume).
    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .status();
        }
    }
}

impl Drop for EtcdProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
