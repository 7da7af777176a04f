//! Who may speak to a server: the pre-shared-secret exchange (`auth_secret`) in every
//! combination of secrets, and `same_user_only` against a client process of another user
//! (root only: the test drops a child to uid 65534).

use std::time::Duration;

use hmc_core::PeerAddr;
use hmc_rpc::{AuthSecret, Client, ClientConfig, Dispatcher, Server, ServerConfig, demo};
use rstest::rstest;

async fn server(config: ServerConfig) -> hmc_rpc::RunningServer {
    let mut d = Dispatcher::new();
    demo::register_demo(&mut d);
    Server::new(d, config)
        .bind(&"tcp://127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

fn secret(s: &str) -> Option<AuthSecret> {
    Some(AuthSecret::new(s.as_bytes().to_vec()).unwrap())
}

async fn echo(addr: &PeerAddr, auth: Option<AuthSecret>) -> Result<(), String> {
    let config = ClientConfig {
        auth_secret: auth,
        connect_timeout: Duration::from_secs(2),
        default_timeout: Duration::from_secs(2),
        ..ClientConfig::default()
    };
    let c = Client::connect(addr, config)
        .await
        .map_err(|e| e.to_string())?;
    let r = c.call(demo::ECHO, "abc").await.map_err(|e| e.to_string())?;
    assert_eq!(&r[..], b"abc");
    Ok(())
}

#[rstest]
#[case::both_same(Some("0123456789abcdef"), Some("0123456789abcdef"), true)]
#[case::neither(None, None, true)]
#[case::client_lacks(Some("0123456789abcdef"), None, false)]
#[case::server_lacks(None, Some("0123456789abcdef"), false)]
#[case::different(Some("0123456789abcdef"), Some("fedcba9876543210"), false)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_the_servers_secret_are_served(
    #[case] server_secret: Option<&str>,
    #[case] client_secret: Option<&str>,
    #[case] served: bool,
) {
    let s = server(ServerConfig {
        auth_secret: server_secret.and_then(secret),
        ..ServerConfig::default()
    })
    .await;
    let r = echo(s.local_addr(), client_secret.and_then(secret)).await;
    assert_eq!(r.is_ok(), served, "{r:?}");
    if server_secret.is_some() && !served {
        // The refusal is counted (the server closes before reading a frame).
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(s.stats().refused_peers, 1);
    }
    if let Err(e) = r
        && client_secret.is_some()
    {
        assert!(e.contains("auth_secret"), "{e}");
    }
}

/// A client process running as another user on this host is refused by a server with
/// `same_user_only` (by the socket's owner in /proc/net/tcp), and served by one without.
#[rstest]
#[case::same_user_only(true)]
#[case::anyone(false)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_client_of_another_user_is_refused_without_a_secret(#[case] strict: bool) {
    use std::os::unix::process::CommandExt;
    if hmc_transport_kit::owner::euid() != 0 {
        eprintln!("skipped: needs root to run a client as another user");
        return;
    }
    let s = server(ServerConfig {
        same_user_only: strict,
        ..ServerConfig::default()
    })
    .await;
    let PeerAddr::Tcp(at) = s.local_addr().clone() else {
        panic!("tcp")
    };
    // The client sends 64 bytes of garbage and prints how many bytes the server answered
    // before closing: 0 when refused at once, a GOAWAY otherwise.
    let script = format!(
        "import socket\ns=socket.create_connection(('127.0.0.1',{}))\ns.sendall(b'x'*64)\ns.settimeout(5)\nn=0\ntry:\n    while True:\n        b=s.recv(4096)\n        if not b: break\n        n+=len(b)\nexcept Exception: pass\nprint(n)",
        at.port()
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let answered: usize = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    if strict {
        assert_eq!(answered, 0, "refused before a frame was read");
        assert_eq!(s.stats().refused_peers, 1);
    } else {
        assert!(answered > 0, "a GOAWAY for the garbage");
        assert_eq!(s.stats().refused_peers, 0);
    }
    // This process's own user is served either way.
    echo(s.local_addr(), None).await.unwrap();
}
