//! `--metrics-listen`: `GET /metrics` over HTTP/1.1, on tokio's own TCP
//! listener. A scraper asks one thing and reads one answer, so a request
//! line and a `Connection: close` answer is all the HTTP this needs; hyper
//! stays out of the shipped binary (ARCHITECTURE.md: it is the test
//! machinery's).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::state::StateDir;

use super::openmetrics::{CONTENT_TYPE, render};
use super::sample::Sample;

/// A request head larger than this is refused.
const MAX_HEAD: usize = 8 * 1024;
/// A client that has not sent its request by then is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `addr`; the listener and the address it got (port 0 picks one).
pub(super) async fn bind(addr: SocketAddr) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("cannot listen for metrics on {addr}"))?;
    Ok((listener, bound))
}

/// Answers scrapes until `done`.
pub(super) async fn serve(listener: TcpListener, dir: Option<StateDir>, done: CancellationToken) {
    loop {
        let stream = tokio::select! {
            () = done.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    continue;
                }
            },
        };
        let dir = dir.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, dir.as_ref()).await {
                tracing::debug!(error = %e, "metrics: a scrape failed");
            }
        });
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { head_only: bool },
    NotFound,
    BadMethod,
    Malformed,
}

/// The request line of `head`: `GET /metrics` (a query string allowed).
fn asked(head: &str) -> Asked {
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Asked::Malformed;
    };
    if !version.starts_with("HTTP/1.") {
        return Asked::Malformed;
    }
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => Asked::Metrics {
            head_only: method == "HEAD",
        },
        ("GET" | "HEAD", _) => Asked::NotFound,
        _ => Asked::BadMethod,
    }
}

async fn read_head(stream: &mut TcpStream) -> anyhow::Result<String> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        anyhow::ensure!(buf.len() < MAX_HEAD, "request head over {MAX_HEAD} bytes");
        let n = stream.read(&mut chunk).await?;
        anyhow::ensure!(n > 0, "closed before the request ended");
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

async fn answer(mut stream: TcpStream, dir: Option<&StateDir>) -> anyhow::Result<()> {
    let head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream))
        .await
        .context("no request in time")??;
    let (status, content_type, body, head_only) = match asked(&head) {
        Asked::Metrics { head_only } => match Sample::take(dir) {
            Ok(sample) => ("200 OK", CONTENT_TYPE, render(&sample), head_only),
            Err(e) => (
                "500 Internal Server Error",
                "text/plain; charset=utf-8",
                format!("{e:#}\n"),
                head_only,
            ),
        },
        Asked::NotFound => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "GET /metrics\n".into(),
            false,
        ),
        Asked::BadMethod => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "GET /metrics\n".into(),
            false,
        ),
        Asked::Malformed => (
            "400 Bad Request",
            "text/plain; charset=utf-8",
            String::new(),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        out.push_str(&body);
    }
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_or_head_of_metrics_is_answered() {
        assert_eq!(
            asked("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Asked::Metrics { head_only: false }
        );
        assert_eq!(
            asked("HEAD /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Asked::Metrics { head_only: true }
        );
        assert_eq!(asked("GET / HTTP/1.1\r\n\r\n"), Asked::NotFound);
        assert_eq!(asked("POST /metrics HTTP/1.1\r\n\r\n"), Asked::BadMethod);
        assert_eq!(asked("hello\r\n\r\n"), Asked::Malformed);
    }

    #[tokio::test]
    async fn a_scrape_gets_the_exposition_with_its_content_type_and_a_stop_ends_the_server() {
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let done = CancellationToken::new();
        let server = tokio::spawn(serve(listener, None, done.clone()));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        done.cancel();
        server.await.unwrap();
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed"
        );
    }
}
