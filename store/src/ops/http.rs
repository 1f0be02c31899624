//! A minimal read-only HTTP/1.1 server for the metrics endpoints.
//!
//! It answers `GET` requests with whatever the handler returns and closes each connection
//! after one answer. Scrapers are strangers as far as this server knows: a request head is
//! read for at most [`READ_TIMEOUT`] and [`MAX_HEAD`] bytes, at most [`MAX_CONNECTIONS`] are
//! answered at once, and when a bearer token is configured, a request without it gets 401
//! (except for the public paths: pages that carry no figures of their own).
//!
//! Waiting for a request head costs the server a socket and nothing else: up to
//! [`MAX_WAITING`] connections may wait, and when a new one arrives past that, the one that
//! has waited longest is closed. Idle sockets held open by someone else therefore never keep
//! a scraper out (its request arrives with its connection, so it is never the oldest waiting).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::auth::secrets_match;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tracing::{debug, info};

/// Longest request head read, in bytes.
pub const MAX_HEAD: usize = 8 * 1024;
/// How long a client may take to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests answered at once; more wait for a turn.
pub const MAX_CONNECTIONS: usize = 32;
/// Connections waiting for their request head; past this the longest waiting is closed.
pub const MAX_WAITING: usize = 256;

/// An answer: status, content type, body.
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// A 200 answer.
    pub fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Response {
        Response {
            status: 200,
            content_type,
            body: body.into(),
        }
    }

    /// An error answer with a plain-text reason.
    pub fn error(status: u16, reason: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{reason}\n").into_bytes(),
        }
    }
}

/// A request as handlers see it: its path and its query string.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// The path, without the query.
    pub path: &'a str,
    /// What followed the `?`, still encoded ("" if nothing did).
    pub query: &'a str,
}

impl Request<'_> {
    /// The decoded value of query parameter `name` (its first occurrence), if given. `+`
    /// stands for a space, as forms send it; a value that is not UTF-8 once decoded is
    /// taken as not given.
    pub fn param(&self, name: &str) -> Option<String> {
        self.query
            .split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .find(|(key, _)| *key == name)
            .and_then(|(_, value)| {
                let value = value.replace('+', " ");
                percent_encoding::percent_decode_str(&value)
                    .decode_utf8()
                    .ok()
                    .map(|v| v.into_owned())
            })
    }
}

/// Answers a request.
pub type Handler = Arc<dyn Fn(&Request<'_>) -> Response + Send + Sync>;

/// Binds `listen` and serves `handler` there until the returned task is aborted; a bearer
/// token, if given, is required of every request but those for the `public` paths.
pub async fn serve(
    listen: &str,
    handler: Handler,
    bearer: Option<String>,
    public: &'static [&'static str],
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(listen).await.map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cannot listen on {listen} for metrics: {e}"),
        )
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::new(ErrorCode::INTERNAL_ERROR, e.to_string()))?;
    info!(%addr, "metrics listening");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let waiting = Arc::new(Waiting::default());
    let bearer: Option<Arc<str>> = bearer.map(Into::into);
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    debug!("metrics accept failed: {e}");
                    // Out of descriptors, typically: retrying at once would spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let (ticket, dismissed) = waiting.join();
            let handler = handler.clone();
            let bearer = bearer.clone();
            let slots = slots.clone();
            let waiting = waiting.clone();
            tokio::spawn(async move {
                let outcome = answer(
                    stream,
                    dismissed,
                    &slots,
                    &handler,
                    bearer.as_deref(),
                    public,
                );
                if let Err(e) = outcome.await {
                    debug!(%peer, "metrics request failed: {e}");
                }
                waiting.leave(ticket);
            });
        }
    });
    Ok((addr, task))
}

/// The connections waiting for their request head, oldest first, each with the means to
/// dismiss it.
#[derive(Default)]
struct Waiting {
    queue: std::sync::Mutex<WaitQueue>,
}

/// The last ticket handed out, and each waiting connection's ticket and dismissal.
type WaitQueue = (u64, std::collections::VecDeque<(u64, oneshot::Sender<()>)>);

impl Waiting {
    /// Enters a new connection, dismissing the longest waiting past [`MAX_WAITING`]; returns
    /// its ticket and what tells it it was dismissed.
    fn join(&self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let (next, waiting) = &mut *queue;
        *next += 1;
        let ticket = *next;
        while waiting.len() >= MAX_WAITING {
            if let Some((_, dismiss)) = waiting.pop_front() {
                let _ = dismiss.send(());
            }
        }
        waiting.push_back((ticket, tx));
        (ticket, rx)
    }

    /// The connection with `ticket` stopped waiting (its head arrived, or it went).
    fn leave(&self, ticket: u64) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        queue.1.retain(|(t, _)| *t != ticket);
    }
}

async fn answer(
    mut stream: TcpStream,
    dismissed: oneshot::Receiver<()>,
    slots: &Semaphore,
    handler: &Handler,
    bearer: Option<&str>,
    public: &[&str],
) -> std::io::Result<()> {
    let head = tokio::select! {
        head = tokio::time::timeout(READ_TIMEOUT, read_head(&mut stream)) => head,
        // Dismissed for a newer connection: it has waited longest and sent nothing whole.
        _ = dismissed => return Ok(()),
    };
    let head = match head {
        Ok(Ok(Some(head))) => head,
        Ok(Ok(None)) => {
            return write(&mut stream, &Response::error(431, "request head too large")).await;
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return write(&mut stream, &Response::error(408, "request timed out")).await,
    };
    let Ok(_turn) = slots.acquire().await else {
        return Ok(());
    };
    let response = route(&head, handler, bearer, public);
    write(&mut stream, &response).await
}

/// Reads up to the blank line ending the request head; `None` if it is longer than
/// [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Some(String::from_utf8_lossy(&head).into_owned()));
        }
        head.extend_from_slice(&chunk[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            return Ok(Some(String::from_utf8_lossy(&head).into_owned()));
        }
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// The answer to a request head.
fn route(head: &str, handler: &Handler, bearer: Option<&str>, public: &[&str]) -> Response {
    let mut lines = head.lines();
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Response::error(400, "not an HTTP request");
    };
    if method != "GET" {
        return Response::error(405, "only GET is served here");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if let Some(token) = bearer.filter(|_| !public.contains(&path)) {
        let presented = lines
            .filter_map(|l| l.split_once(':'))
            .find(|(name, _)| name.trim().eq_ignore_ascii_case("authorization"))
            .map(|(_, value)| value.trim());
        let expected = format!("Bearer {token}");
        let matches = presented.is_some_and(|p| secrets_match(p.as_bytes(), expected.as_bytes()));
        if !matches {
            return Response::error(
                401,
                "a bearer token is required (Authorization: Bearer ...)",
            );
        }
    }
    handler(&Request { path, query })
}

/// How long [`fetch`] waits for a whole answer.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(5);

/// GETs `target` (a path and query) from this server at `addr`, with `bearer` if given:
/// the status and the body (for the CLI's followers of these pages, such as `mooring events`).
pub async fn fetch(addr: &str, target: &str, bearer: Option<&str>) -> Result<(u16, Vec<u8>)> {
    let unreachable = |e: std::io::Error| {
        Error::new(
            ErrorCode::RPC_FAIL,
            format!("cannot read http://{addr}{target}: {e}"),
        )
    };
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let authorization = bearer
            .map(|token| format!("Authorization: Bearer {token}\r\n"))
            .unwrap_or_default();
        let request = format!(
            "GET {target} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(FETCH_TIMEOUT, exchange)
        .await
        .map_err(|_| unreachable(std::io::ErrorKind::TimedOut.into()))?
        .map_err(unreachable)?;
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| unreachable(std::io::ErrorKind::InvalidData.into()))?;
    let status = std::str::from_utf8(&answer[..split])
        .ok()
        .and_then(|head| head.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| unreachable(std::io::ErrorKind::InvalidData.into()))?;
    Ok((status, answer[split + 4..].to_vec()))
}

async fn write(stream: &mut TcpStream, response: &Response) -> std::io::Result<()> {
    let reason = match response.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&response.body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo() -> Handler {
        Arc::new(|request: &Request| match request.path {
            "/metrics" => Response::ok("text/plain", "up 1\n"),
            "/echo" => Response::ok(
                "text/plain",
                format!("{:?} {:?}", request.param("a"), request.param("b")),
            ),
            _ => Response::error(404, "no such page"),
        })
    }

    /// Sends one GET and returns the status line.
    async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer.lines().next().unwrap_or_default().to_string())
    }

    #[tokio::test]
    async fn idle_sockets_never_keep_a_scraper_out() {
        let (addr, server) = serve("127.0.0.1:0", echo(), None, &[]).await.unwrap();
        // Twice as many idle sockets as may wait (and far more than may be answered at once),
        // all opened before the scrape.
        let mut idle = Vec::new();
        for _ in 0..2 * MAX_WAITING {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // Well inside the head timeout, which is how long a scraper waited behind idle
        // sockets before.
        let status = tokio::time::timeout(READ_TIMEOUT / 2, scrape(addr))
            .await
            .expect("the scrape is answered while the idle sockets stay open")
            .unwrap();
        assert_eq!(status, "HTTP/1.1 200 OK");
        // The oldest idle sockets were closed to make room; the newest still wait.
        let mut closed = 0;
        for stream in &mut idle {
            let mut byte = [0u8; 1];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(1), stream.read(&mut byte)).await
            {
                closed += 1;
            }
        }
        assert!(
            closed >= MAX_WAITING,
            "only {closed} idle sockets were closed"
        );
        server.abort();
    }

    #[tokio::test]
    async fn fetch_reads_status_and_body_with_the_token() {
        let (addr, server) = serve("127.0.0.1:0", echo(), Some("s3cret".into()), &[])
            .await
            .unwrap();
        let addr = addr.to_string();
        let (status, body) = fetch(&addr, "/echo?a=1", Some("s3cret")).await.unwrap();
        assert_eq!((status, body), (200, b"Some(\"1\") None".to_vec()));
        let (status, _) = fetch(&addr, "/echo", None).await.unwrap();
        assert_eq!(status, 401);
        server.abort();
        let closed = fetch("127.0.0.1:1", "/", None).await.unwrap_err();
        assert!(
            closed
                .to_string()
                .contains("cannot read http://127.0.0.1:1/"),
            "{closed}"
        );
    }

    #[test]
    fn routes_methods_paths_and_tokens() {
        let h = echo();
        assert_eq!(
            route("GET /metrics HTTP/1.1\r\n\r\n", &h, None, &["/"]).status,
            200
        );
        assert_eq!(
            route("GET /metrics?x=1 HTTP/1.1\r\n\r\n", &h, None, &["/"]).status,
            200
        );
        assert_eq!(
            route("GET /other HTTP/1.1\r\n\r\n", &h, None, &["/"]).status,
            404
        );
        assert_eq!(
            route("POST /metrics HTTP/1.1\r\n\r\n", &h, None, &["/"]).status,
            405
        );
        assert_eq!(route("garbage\r\n\r\n", &h, None, &["/"]).status, 400);
        let echoed = route(
            "GET /echo?b=x%2Fy+z&a=1&a=2&c HTTP/1.1\r\n\r\n",
            &h,
            None,
            &["/"],
        );
        assert_eq!(echoed.body, b"Some(\"1\") Some(\"x/y z\")");
        let bad = route("GET /echo?a=%FF HTTP/1.1\r\n\r\n", &h, None, &["/"]);
        assert_eq!(bad.body, b"None None");
        assert_eq!(route("", &h, None, &["/"]).status, 400);
        // A public page needs no token (this handler has none there: 404, not 401).
        assert_eq!(
            route("GET / HTTP/1.1\r\n\r\n", &h, Some("s3cret"), &["/"]).status,
            404
        );
        let secret = Some("s3cret");
        assert_eq!(
            route("GET /metrics HTTP/1.1\r\n\r\n", &h, secret, &["/"]).status,
            401
        );
        assert_eq!(
            route(
                "GET /metrics HTTP/1.1\r\nAuthorization: Bearer wrong\r\n\r\n",
                &h,
                secret,
                &["/"]
            )
            .status,
            401
        );
        assert_eq!(
            route(
                "GET /metrics HTTP/1.1\r\nauthorization: Bearer s3cret\r\n\r\n",
                &h,
                secret,
                &["/"]
            )
            .status,
            200
        );
    }
}
