//! A typed RPC service and a client of it in two processes: requests and responses are serde types, 8 calls are kept in flight on one connection, and an expired call is told apart by its variant.
//!
//! ```text
//! cargo run -p hmc-rpc --example typed_service                 # both: starts the server itself
//! cargo run -p hmc-rpc --example typed_service -- serve        # prints `listening tcp://...`
//! cargo run -p hmc-rpc --example typed_service -- call tcp://127.0.0.1:PORT [--calls N]
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use futures::StreamExt;
use hmc_core::PeerAddr;
use hmc_rpc::{
    CallError, CallOptions, Client, ClientConfig, Dispatcher, RpcError, Server, ServerConfig,
    Status,
};
use serde::{Deserialize, Serialize};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Method ids: one per request type (the payload carries no type tag).
const ADD: u32 = 1;
const SLOW: u32 = 2;

#[derive(Serialize, Deserialize)]
struct AddRequest {
    a: u64,
    b: u64,
    label: String,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct AddResponse {
    sum: u64,
    label_len: u32,
}

async fn serve() -> Result<()> {
    let mut d = Dispatcher::new();
    d.register(ADD, |_ctx, r: AddRequest| async move {
        Ok(AddResponse {
            sum: r.a + r.b,
            label_len: r.label.len() as u32,
        })
    });
    d.register(SLOW, |ctx, ms: u64| async move {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => Ok(ms),
            // The call was cancelled or expired: this branch always gets to run.
            _ = ctx.cancel.cancelled() => Err(RpcError::new(Status::CANCELLED, "gave up")),
        }
    });
    let server = Server::new(d, ServerConfig::default())
        .bind(&"tcp://127.0.0.1:0".parse()?)
        .await?;
    println!("listening {}", server.local_addr());
    // Serve until the client process closes our stdin.
    tokio::task::spawn_blocking(|| std::io::stdin().lines().count()).await?;
    server.shutdown().await;
    Ok(())
}

async fn call(addr: &PeerAddr, calls: u64) -> Result<()> {
    let client = Client::connect(addr, ClientConfig::default()).await?;
    let answers: Vec<_> = futures::stream::iter(0..calls)
        .map(|i| {
            let client = client.clone();
            async move {
                let req = AddRequest {
                    a: i,
                    b: 2 * i,
                    label: format!("call {i}"),
                };
                let resp: AddResponse = client.call_typed(ADD, &req).await?;
                Ok::<_, CallError>((i, resp))
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    for answer in answers {
        let (i, resp) = answer?;
        let want = AddResponse {
            sum: 3 * i,
            label_len: format!("call {i}").len() as u32,
        };
        if resp != want {
            return Err(format!("call {i}: got {resp:?}, want {want:?}").into());
        }
    }
    println!("{calls} typed calls answered and checked, 8 in flight");

    let opts = CallOptions {
        timeout: Some(Duration::from_millis(20)),
        ..CallOptions::default()
    };
    match client
        .call_typed_with::<u64, u64>(SLOW, &10_000, opts)
        .await
    {
        Err(CallError::DeadlineExceeded(after)) => {
            println!("the slow call expired after {after:?}, as CallError::DeadlineExceeded")
        }
        other => return Err(format!("expected an expired call, got {other:?}").into()),
    }
    Ok(())
}

async fn both(calls: u64) -> Result<()> {
    let mut server = Command::new(std::env::current_exe()?)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    let addr = match lines.next() {
        Some(line) => line?
            .strip_prefix("listening ")
            .ok_or("the server printed something else first")?
            .parse()?,
        None => return Err("the server exited before listening".into()),
    };
    let r = call(&addr, calls).await;
    drop(server.stdin.take());
    let status = server.wait()?;
    r?;
    if !status.success() {
        return Err(format!("the server failed: {status}").into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let calls = args
        .iter()
        .position(|a| a == "--calls")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(10_000), |n| n.parse::<u64>());
    let Ok(calls) = calls else {
        eprintln!("--calls takes a number");
        return ExitCode::from(2);
    };
    let r = match args.first().map(String::as_str) {
        Some("serve") => serve().await,
        Some("call") => match args.get(1).map(|a| a.parse::<PeerAddr>()) {
            Some(Ok(addr)) => call(&addr, calls).await,
            Some(Err(e)) => Err(e.into()),
            None => Err("call needs the server's address".into()),
        },
        _ => both(calls).await,
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("typed_service: {e}");
            ExitCode::FAILURE
        }
    }
}
