//! A test double of cantal's peer list: serves `GET /all_peers.json` in cantal's format (the
//! fields verwalter reads, as tk-cantal decodes them), for a local cluster without cantal.
//!
//! Built with `cargo build -p fake-cantal` (a crate of its own, see its Cargo.toml).
//!
//! Usage: `fake_cantal --listen 127.0.0.1:22682 NAME...` lists node i (1-based) as
//! `{"id": "77985419c732412ea38b94db<i, 8 digits>", "hostname": <NAME up to the first dot>,
//! "name": NAME, "primary_addr": "127.0.0.<i>:22682", ...}`; start verwalter node i with
//! `--override-machine-id 77985419c732412ea38b94db0000000<i> --host 127.0.0.<i>`. verwalter drops
//! its own entry from the list (real cantal never lists the local node).
//!
//! `--peers-file FILE` instead reads the list on every request from FILE, a JSON array of
//! `{"id", "hostname", "name", "ip"}`, so a test can change the view while nodes run.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

struct Args {
    listen: String,
    names: Vec<String>,
    peers_file: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut out = Args {
        listen: "127.0.0.1:22682".into(),
        names: Vec::new(),
        peers_file: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--listen" => out.listen = it.next().ok_or("--listen needs ADDR")?,
            "--peers-file" => out.peers_file = Some(it.next().ok_or("--peers-file needs FILE")?),
            "-h" | "--help" => {
                return Err(
                    "usage: fake_cantal [--listen ADDR] (NAME... | --peers-file FILE)".into(),
                );
            }
            name if !name.starts_with('-') => out.names.push(name.to_string()),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if out.names.is_empty() && out.peers_file.is_none() {
        return Err("give node names or --peers-file".into());
    }
    Ok(out)
}

/// The peer list as `(id, hostname, name, ip)`.
fn peers(args: &Args) -> Result<Vec<(String, String, String, String)>, String> {
    if let Some(file) = &args.peers_file {
        let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
        let list: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
        return list
            .iter()
            .map(|p| {
                let field = |k: &str| {
                    p.get(k)
                        .and_then(|v| v.as_str())
                        .map(String::from)
                        .ok_or(format!("{file}: a peer without {k}"))
                };
                Ok((
                    field("id")?,
                    field("hostname")?,
                    field("name")?,
                    field("ip")?,
                ))
            })
            .collect();
    }
    Ok(args
        .names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let n = i + 1;
            let hostname = name.split('.').next().unwrap_or(name).to_string();
            (
                format!("77985419c732412ea38b94db{n:08}"),
                hostname,
                name.clone(),
                format!("127.0.0.{n}"),
            )
        })
        .collect())
}

fn answer(stream: TcpStream, args: &Args, started: u64) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" || header == "\n" {
            break;
        }
    }
    let mut stream = stream;
    let (status, body) = if request.starts_with("GET /all_peers.json ") {
        match peers(args) {
            Ok(list) => {
                let now = now_ms();
                let peers: Vec<serde_json::Value> = list
                    .into_iter()
                    .map(|(id, hostname, name, ip)| {
                        let addr = format!("{ip}:22682");
                        serde_json::json!({
                            "id": id, "hostname": hostname, "name": name,
                            "primary_addr": addr, "addresses": [addr],
                            "known_since": started, "last_report_direct": now,
                        })
                    })
                    .collect();
                ("200 OK", serde_json::json!({ "peers": peers }).to_string())
            }
            Err(e) => ("500 Internal Server Error", e),
        }
    } else {
        ("404 Not Found", "only /all_peers.json here".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn main() {
    let args = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("fake_cantal: {e}");
            std::process::exit(2);
        }
    };
    let listener = match TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("fake_cantal: cannot listen on {}: {e}", args.listen);
            std::process::exit(1);
        }
    };
    // With port 0 the system picks the port: say which, for whoever started us.
    let bound = listener
        .local_addr()
        .map_or_else(|_| args.listen.clone(), |a| a.to_string());
    eprintln!("fake_cantal: serving /all_peers.json on {bound}");
    let started = now_ms();
    for stream in listener.incoming().flatten() {
        if let Err(e) = answer(stream, &args, started) {
            eprintln!("fake_cantal: {e}");
        }
    }
}
