//! `moshid::http` over real loopback sockets: a glommio executor serves, std
//! threads act as clients (raw bytes, or tungstenite's blocking client).
//! Every client socket has read/write timeouts and every server read a
//! deadline, so a hung side fails the test instead of hanging it.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream as StdTcpStream};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures_lite::StreamExt;
use glommio::net::{TcpListener, TcpStream};
use glommio::LocalExecutorBuilder;
use moshid::http::{self, HeadLimits, HttpError};
use tungstenite::protocol::frame::coding::{CloseCode, Data, OpCode};
use tungstenite::protocol::frame::{CloseFrame, Frame};
use tungstenite::protocol::Role;
use tungstenite::Message;

const IO_TIMEOUT: Duration = Duration::from_secs(10);
const HEAD_DEADLINE: Duration = Duration::from_secs(5);
const LINGER: Duration = Duration::from_secs(2);

/// Serves `connections` connections one after another with `handler` in a
/// glommio executor; the join handle yields each handler's outcome.
fn serve<F, Fut>(connections: usize, handler: F) -> (SocketAddr, JoinHandle<Vec<String>>)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = String> + 'static,
{
    let (tx, rx) = mpsc::channel();
    let thread = std::thread::spawn(move || {
        LocalExecutorBuilder::default()
            .spawn(move || async move {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
                tx.send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                let mut outcomes = Vec::new();
                for _ in 0..connections {
                    let stream = listener.accept().await.expect("accept");
                    outcomes.push(handler(stream).await);
                }
                outcomes
            })
            .expect("spawn executor")
            .join()
            .expect("executor")
    });
    let addr = rx.recv_timeout(IO_TIMEOUT).expect("server address");
    (addr, thread)
}

fn connect(addr: SocketAddr) -> StdTcpStream {
    let s = StdTcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
    s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

fn parse_response(raw: &[u8]) -> Response {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(raw).expect("valid response") {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => panic!("incomplete response: {raw:?}"),
    };
    let headers: Vec<_> = resp
        .headers
        .iter()
        .map(|h| {
            (
                h.name.to_owned(),
                String::from_utf8_lossy(h.value).into_owned(),
            )
        })
        .collect();
    Response {
        status: resp.code.unwrap(),
        headers,
        body: raw[len..].to_vec(),
    }
}

/// Sends `request`, reads until the server closes, parses the response.
fn roundtrip(addr: SocketAddr, request: &[u8]) -> Response {
    let mut s = connect(addr);
    s.write_all(request).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let resp = parse_response(&raw);
    assert_eq!(resp.header("connection"), Some("close"));
    let length: usize = resp
        .header("content-length")
        .expect("Content-Length")
        .parse()
        .unwrap();
    assert_eq!(length, resp.body.len());
    resp
}

/// A small control-API server: /health, echo of a POST body, errors answered
/// with `respond_error`.
async fn control_handler(mut stream: TcpStream, limits: HeadLimits) -> String {
    let mut buf = Vec::new();
    let head = match http::deadline(
        HEAD_DEADLINE,
        http::read_head(&mut stream, &mut buf, &limits),
    )
    .await
    {
        Ok(head) => head,
        Err(e) => {
            let outcome = format!("head error: {e}");
            http::respond_error(&mut stream, &e).await.expect("respond");
            http::close_gracefully(stream, LINGER).await;
            return outcome;
        }
    };
    let result = match (head.method.as_str(), head.path.as_str()) {
        ("GET", "/health") => {
            http::write_json(&mut stream, 200, &serde_json::json!({"status": "ok"})).await
        }
        ("POST", "/v1/rtp/sessions") => {
            match http::deadline(
                HEAD_DEADLINE,
                http::read_body(&mut stream, &head, &mut buf, &limits),
            )
            .await
            {
                Ok(body) => {
                    let body: serde_json::Value = serde_json::from_slice(body).expect("JSON");
                    let query = head.query_pairs().expect("query");
                    let reply = serde_json::json!({
                        "body": body,
                        "query": query,
                        "bearer": head.bearer_token(),
                        "api_key": head.api_key(),
                    });
                    http::write_json(&mut stream, 201, &reply).await
                }
                Err(e) => {
                    let r = http::respond_error(&mut stream, &e).await;
                    http::close_gracefully(stream, LINGER).await;
                    r.expect("respond");
                    return format!("body error: {e}");
                }
            }
        }
        _ => http::write_error(&mut stream, 404, "no such endpoint").await,
    };
    result.expect("write response");
    http::close_gracefully(stream, LINGER).await;
    "ok".to_owned()
}

#[test]
fn health_and_not_found() {
    let (addr, server) = serve(2, |s| control_handler(s, HeadLimits::default()));
    let resp = roundtrip(addr, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    assert_eq!(resp.json(), serde_json::json!({"status": "ok"}));

    let resp = roundtrip(addr, b"GET /nope HTTP/1.1\r\n\r\n");
    assert_eq!(resp.status, 404);
    assert_eq!(
        resp.json(),
        serde_json::json!({"error": "no such endpoint"})
    );
    assert_eq!(server.join().unwrap(), ["ok", "ok"]);
}

#[test]
fn post_with_body_in_pieces_and_with_expect_continue() {
    let (addr, server) = serve(2, |s| control_handler(s, HeadLimits::default()));
    let body = br#"{"call_id": "abc", "codec": "pcmu"}"#;

    // Head and the start of the body in one write, the rest in another.
    let mut s = connect(addr);
    let head = format!(
        "POST /v1/rtp/sessions?port=4000&name=a+b%21 HTTP/1.1\r\nContent-Length: {}\r\n\
         Authorization: Bearer s3cret\r\nkyutai-api-key: key1\r\n\r\n",
        body.len()
    );
    s.write_all(&[head.as_bytes(), &body[..5]].concat())
        .unwrap();
    s.write_all(&body[5..]).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    drop(s);
    let resp = parse_response(&raw);
    assert_eq!(resp.status, 201);
    assert_eq!(
        resp.json(),
        serde_json::json!({
            "body": {"call_id": "abc", "codec": "pcmu"},
            "query": [["port", "4000"], ["name", "a b!"]],
            "bearer": "s3cret",
            "api_key": "key1",
        })
    );

    // `Expect: 100-continue`: the body is sent only after the interim answer.
    let mut s = connect(addr);
    let head = format!(
        "POST /v1/rtp/sessions HTTP/1.1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let interim = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; interim.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, interim);
    s.write_all(body).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    drop(s);
    assert_eq!(parse_response(&raw).status, 201);
    assert_eq!(server.join().unwrap(), ["ok", "ok"]);
}

#[test]
fn bad_requests_get_their_status() {
    let limits = HeadLimits {
        max_head_bytes: 1024,
        max_headers: 16,
        max_body_bytes: 4096,
    };
    let many_headers: String = (0..20).map(|i| format!("X-{i}: {i}\r\n")).collect();
    let cases: Vec<(Vec<u8>, u16, &str)> = vec![
        // A TLS ClientHello on the plain port.
        (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03".to_vec(), 400, "malformed request"),
        (b"GET /health HTTP/1.1\r\nBad Header: x\r\n\r\n".to_vec(), 400, "invalid header name"),
        (
            format!("GET /health HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(8000)).into_bytes(),
            431,
            "larger than 1024 bytes",
        ),
        (format!("GET / HTTP/1.1\r\n{many_headers}\r\n").into_bytes(), 431, "more than 16"),
        (
            b"POST /v1/rtp/sessions HTTP/1.1\r\nContent-Length: 10000000\r\n\r\n{}".to_vec(),
            413,
            "larger than the limit of 4096",
        ),
        (
            b"POST /v1/rtp/sessions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
                .to_vec(),
            411,
            "Content-Length",
        ),
        (b"POST /v1/rtp/sessions HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n".to_vec(), 400, "Content-Length"),
    ];
    let (addr, server) = serve(cases.len(), move |s| control_handler(s, limits));
    for (request, status, message) in &cases {
        let resp = roundtrip(addr, request);
        let shown = String::from_utf8_lossy(&request[..request.len().min(40)]).into_owned();
        assert_eq!(resp.status, *status, "{shown}");
        let error = resp.json()["error"]
            .as_str()
            .expect("error message")
            .to_owned();
        assert!(error.contains(message), "{shown}: {error}");
    }
    let outcomes = server.join().unwrap();
    assert!(outcomes.iter().all(|o| o.contains("error")), "{outcomes:?}");
}

#[test]
fn silent_client_gets_408() {
    let (addr, server) = serve(1, |mut stream| async move {
        let mut buf = Vec::new();
        let limits = HeadLimits::default();
        let r = http::deadline(
            Duration::from_millis(200),
            http::read_head(&mut stream, &mut buf, &limits),
        )
        .await;
        let e = r.expect_err("no complete head");
        http::respond_error(&mut stream, &e).await.unwrap();
        http::close_gracefully(stream, LINGER).await;
        format!("{e:?}")
    });
    let mut s = connect(addr);
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x").unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    drop(s);
    assert_eq!(parse_response(&raw).status, 408);
    assert_eq!(server.join().unwrap(), ["Timeout"]);
}

/// Upgrades `/api/chat` with the given limits, sends a greeting, then echoes:
/// binary reversed, text upper-cased; reports how many bytes followed the
/// head and how the session ended.
async fn ws_echo_handler(mut stream: TcpStream, max_message: usize, max_frame: usize) -> String {
    let mut buf = Vec::with_capacity(1024);
    let limits = HeadLimits::default();
    let head = http::deadline(
        HEAD_DEADLINE,
        http::read_head(&mut stream, &mut buf, &limits),
    )
    .await
    .expect("head");
    assert_eq!(head.path, "/api/chat");
    assert!(head.is_websocket_upgrade());
    let leftover = std::mem::take(&mut buf);
    let leftover_len = leftover.len();
    let config = http::ws_config(max_message, max_frame);
    let mut ws = http::accept_websocket(stream, &head, leftover, config)
        .await
        .expect("upgrade");
    ws.send(Message::text("hello from server"))
        .await
        .expect("greeting");
    let end = loop {
        let next = glommio::timer::timeout(IO_TIMEOUT, async { Ok(ws.next().await) }).await;
        match next.expect("message within timeout") {
            Some(Ok(Message::Binary(b))) => {
                let reversed: Vec<u8> = b.iter().rev().copied().collect();
                ws.send(Message::binary(reversed)).await.expect("send");
            }
            Some(Ok(Message::Text(t))) => {
                ws.send(Message::text(t.to_uppercase()))
                    .await
                    .expect("send");
            }
            Some(Ok(Message::Close(_))) | None => break "closed".to_owned(),
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                // Refused by the protocol layer: tell the client why, then end
                // the TCP connection without a reset.
                let frame = CloseFrame {
                    code: CloseCode::Size,
                    reason: "too big".into(),
                };
                let _ = ws.close(Some(frame)).await;
                http::close_gracefully(ws.into_inner(), LINGER).await;
                break format!("error: {e}");
            }
        }
    };
    format!("leftover={leftover_len} {end}")
}

fn ws_client(addr: SocketAddr) -> tungstenite::WebSocket<StdTcpStream> {
    let url = format!("ws://{addr}/api/chat");
    let (ws, resp) = tungstenite::client(url.as_str(), connect(addr)).expect("handshake");
    assert_eq!(resp.status().as_u16(), 101);
    ws
}

fn read_data(ws: &mut tungstenite::WebSocket<StdTcpStream>) -> Message {
    loop {
        let m = ws.read().expect("read message");
        if matches!(m, Message::Text(_) | Message::Binary(_) | Message::Close(_)) {
            return m;
        }
    }
}

#[test]
fn websocket_messages_both_ways() {
    let (addr, server) = serve(1, |s| ws_echo_handler(s, 1 << 20, 1 << 20));
    let mut ws = ws_client(addr);
    assert_eq!(read_data(&mut ws), Message::text("hello from server"));
    ws.send(Message::binary(vec![1u8, 2, 3])).unwrap();
    assert_eq!(read_data(&mut ws), Message::binary(vec![3u8, 2, 1]));
    ws.send(Message::text("bonjour")).unwrap();
    assert_eq!(read_data(&mut ws), Message::text("BONJOUR"));
    let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
    ws.send(Message::binary(big.clone())).unwrap();
    let back: Vec<u8> = big.iter().rev().copied().collect();
    assert_eq!(read_data(&mut ws), Message::binary(back));
    ws.close(None).unwrap();
    while ws.read().is_ok() {}
    drop(ws);
    assert_eq!(server.join().unwrap(), ["leftover=0 closed"]);
}

/// A masked client frame, built by hand so it can ride in the same write as
/// the upgrade request.
fn masked_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mask = [0x12u8, 0x34, 0x56, 0x78];
    let mut f = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

#[test]
fn websocket_frames_sent_with_the_upgrade_request_are_not_lost() {
    let (addr, server) = serve(1, |s| ws_echo_handler(s, 1 << 20, 1 << 20));
    let mut s = connect(addr);
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let request = format!(
        "GET /api/chat?voice=x HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
    );
    let mut bytes = request.into_bytes();
    bytes.extend(masked_frame(0x2, b"\x00early"));
    bytes.extend(masked_frame(0x1, b"second"));
    s.write_all(&bytes).unwrap();

    // Read the 101 head byte by byte so no frame byte is consumed here.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
        assert!(head.len() < 1024, "response head too long");
    }
    let resp = parse_response(&head);
    assert_eq!(resp.status, 101);
    assert_eq!(
        resp.header("sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );

    let mut ws = tungstenite::WebSocket::from_raw_socket(s, Role::Client, None);
    assert_eq!(read_data(&mut ws), Message::text("hello from server"));
    assert_eq!(read_data(&mut ws), Message::binary(b"ylrae\x00".to_vec()));
    assert_eq!(read_data(&mut ws), Message::text("SECOND"));
    ws.send(Message::text("after")).unwrap();
    assert_eq!(read_data(&mut ws), Message::text("AFTER"));
    ws.close(None).unwrap();
    while ws.read().is_ok() {}
    drop(ws);
    let outcome = server.join().unwrap().remove(0);
    // Both frames (2 + 4 + 6 bytes each) followed the head in the same write.
    assert_eq!(outcome, "leftover=24 closed");
}

#[test]
fn oversized_websocket_messages_are_refused() {
    let (addr, server) = serve(2, |s| ws_echo_handler(s, 1024, 512));

    // One frame over max_frame_size.
    let mut ws = ws_client(addr);
    assert_eq!(read_data(&mut ws), Message::text("hello from server"));
    ws.send(Message::binary(vec![7u8; 512])).unwrap();
    assert_eq!(read_data(&mut ws), Message::binary(vec![7u8; 512]));
    ws.send(Message::binary(vec![7u8; 4096])).unwrap();
    match read_data(&mut ws) {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Size),
        other => panic!("expected a Close(1009), got {other:?}"),
    }
    while ws.read().is_ok() {}
    drop(ws);

    // Fragments each under max_frame_size whose message is over max_message_size.
    let mut ws = ws_client(addr);
    assert_eq!(read_data(&mut ws), Message::text("hello from server"));
    let first = Frame::message(vec![1u8; 400], OpCode::Data(Data::Binary), false);
    ws.send(Message::Frame(first)).unwrap();
    for i in 0..3 {
        let last = i == 2;
        let frame = Frame::message(vec![1u8; 400], OpCode::Data(Data::Continue), last);
        ws.send(Message::Frame(frame)).unwrap();
    }
    match read_data(&mut ws) {
        Message::Close(Some(frame)) => assert_eq!(frame.code, CloseCode::Size),
        other => panic!("expected a Close(1009), got {other:?}"),
    }
    while ws.read().is_ok() {}
    drop(ws);

    let outcomes = server.join().unwrap();
    assert_eq!(outcomes.len(), 2);
    for o in &outcomes {
        assert!(
            o.starts_with("leftover=0 error:") && o.contains("Message too long"),
            "{o}"
        );
    }
    assert!(outcomes[0].contains("> 512"), "{}", outcomes[0]);
    assert!(outcomes[1].contains("> 1024"), "{}", outcomes[1]);
}

#[test]
fn bad_upgrade_is_answered() {
    let (addr, server) = serve(2, |mut stream| async move {
        let mut buf = Vec::new();
        let limits = HeadLimits::default();
        let head = http::deadline(
            HEAD_DEADLINE,
            http::read_head(&mut stream, &mut buf, &limits),
        )
        .await
        .expect("head");
        let config = http::ws_config(1024, 1024);
        match http::accept_websocket(stream, &head, Vec::new(), config).await {
            Ok(_) => "upgraded".to_owned(),
            Err(e) => format!("{e}"),
        }
    });
    let resp = roundtrip(
        addr,
        b"GET /api/chat HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: short\r\n\r\n",
    );
    assert_eq!(resp.status, 400);
    assert!(resp.json()["error"]
        .as_str()
        .unwrap()
        .contains("Sec-WebSocket-Key"));
    let resp = roundtrip(
        addr,
        b"GET /api/chat HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    assert_eq!(resp.status, 426);
    assert_eq!(resp.header("sec-websocket-version"), Some("13"));
    let outcomes = server.join().unwrap();
    assert!(
        outcomes[0].starts_with("bad Sec-WebSocket-Key"),
        "{outcomes:?}"
    );
    assert!(
        outcomes[1].contains("unsupported Sec-WebSocket-Version `8`"),
        "{outcomes:?}"
    );
}

#[test]
fn http_error_messages_are_specific() {
    let e = HttpError::HeadTooLarge { limit: 8192 };
    assert_eq!(e.to_string(), "request head larger than 8192 bytes");
    assert_eq!(e.status(), Some(431));
    let e: HttpError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
    assert!(e.to_string().starts_with("I/O error"));
    assert_eq!(e.status(), None);
}
