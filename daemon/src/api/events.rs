//! `GET /v1/sessions/{id}/events`: one session's events as Server-Sent
//! Events, and `GET /v1/sessions`: the live sessions.
//!
//! `{id}` is the id the transport handed out (the chat upgrade's
//! `Moshid-Session-Id` header, the RTP control call's `id`, the record's
//! `id`), or the name the far end gave the session (AudioSocket's call
//! UUID, Media Streams' `streamSid`). The stream:
//!
//! ```text
//! retry: 1000
//!
//! event: session
//! data: {"id":"7","transport":"rtp","alias":null,"core":0,"state":"waiting",…}
//!
//! id: 1
//! event: state
//! data: {"state":"active","at_ms":212.4}
//!
//! id: 2
//! event: text
//! data: {"frame":3,"audio_ms":240,"at_ms":530.1,"token":1043,"text":" hello"}
//!
//! id: 3
//! event: dtmf
//! data: {"digit":"5","duration_ms":160,"at_ms":1200.0}
//!
//! event: lost
//! data: {"events":12,"lost_total":12}
//!
//! event: end
//! data: {"session":{…the record…},"text":" hello …","text_pieces":42,…}
//! ```
//!
//! A new subscriber first gets what the session's ring still holds (the
//! last `events.ring_events`), or, with `Last-Event-ID: N`, what followed
//! event `N`. After `end` the server closes the stream.
//!
//! Bounds: subscribers per session and per daemon (429, 503); a subscriber
//! that falls `events.ring_events` behind loses the oldest events (told by
//! `lost`, counted in `/metrics`); one that does not take a write within
//! `session.send_timeout_ms` is closed (counted). None of it reaches the
//! session: it never waits for a subscriber. Unknown ids answer 404, ended
//! sessions 410. Authentication is the listener's (the bearer token where
//! one is configured).

use crate::app::CoreApp;
use crate::events::relay::Watch;
use crate::events::SESSIONS_PATH;
use crate::events::{Channel, Subscription};
use crate::http::{self, HttpError, RequestHead};
use futures_lite::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use std::io::Write as _;
use std::time::{Duration, Instant};

/// Whether `path` belongs to these endpoints.
pub fn owns(path: &str) -> bool {
    path == SESSIONS_PATH
        || path
            .strip_prefix(SESSIONS_PATH)
            .is_some_and(|r| r.starts_with('/'))
}

const SSE_HEAD: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
Cache-Control: no-cache\r\nConnection: close\r\nX-Accel-Buffering: no\r\n\r\nretry: 1000\n\n";

/// Serves one request to these endpoints (the caller has checked the
/// bearer token).
pub async fn handle<S>(stream: &mut S, app: &CoreApp, head: &RequestHead) -> Result<(), HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let rest = &head.path[SESSIONS_PATH.len()..];
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    match (head.method.as_str(), parts.as_slice()) {
        ("GET", []) => {
            let body = serde_json::json!({ "sessions": app.shared.events.list() });
            http::write_json(stream, 200, &body).await
        }
        ("GET", [id, "events"]) => {
            let id = http::percent_decode(id)?;
            serve(stream, app, head, &id).await
        }
        (_, [] | [_, "events"]) => http::write_error(stream, 405, "method not allowed").await,
        _ => http::write_error(stream, 404, "no such endpoint").await,
    }
}

enum Wake {
    Changed,
    ClientGone,
}

async fn serve<S>(
    stream: &mut S,
    app: &CoreApp,
    head: &RequestHead,
    key: &str,
) -> Result<(), HttpError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let shared = &app.shared;
    let hub = &shared.events;
    let mut sub = match hub.subscribe(key, shared.issued_session_ids()) {
        Ok(s) => s,
        Err(e) => return http::write_error(stream, e.status(), &e.to_string()).await,
    };
    if let Some(last) = head
        .header("last-event-id")
        .and_then(|v| v.trim().parse::<u64>().ok())
    {
        sub.resume_after(last);
    }
    let cfg = hub.config();
    let send_timeout = Duration::from_millis(shared.config.session.send_timeout_ms);
    let keepalive = Duration::from_millis(cfg.keepalive_ms);
    let ch = sub.channel().clone();
    let mut buf = Vec::with_capacity(4096);
    buf.extend_from_slice(SSE_HEAD);
    write_hello(&mut buf, &ch, &sub);
    let watch = Watch::new(ch.clone(), Duration::from_millis(cfg.poll_ms));
    let mut lost_total = 0u64;
    let mut scratch = [0u8; 256];
    loop {
        // Ended first, then drained: every event pushed before the end is seen.
        let ended = ch.final_record();
        let lost = sub.drain(|seq, e| e.write_sse(seq, &shared.pieces, &mut buf));
        if lost > 0 {
            lost_total += lost;
            let _ = write!(
                buf,
                "event: lost\ndata: {{\"events\":{lost},\"lost_total\":{lost_total}}}\n\n"
            );
        }
        if let Some(record) = ended {
            let _ = write!(buf, "event: end\ndata: {record}\n\n");
        }
        if !buf.is_empty() && !send(stream, &mut buf, send_timeout, &sub, &ch).await {
            return Ok(());
        }
        if ended.is_some() {
            http::close_gracefully(&mut *stream, Duration::from_millis(200)).await;
            return Ok(());
        }
        let due = Instant::now() + keepalive;
        match wait(stream, &watch, &sub, due, &mut scratch).await {
            Wake::ClientGone => return Ok(()),
            Wake::Changed => {
                if !sub.has_news() && Instant::now() >= due {
                    buf.extend_from_slice(b": keep-alive\n\n");
                }
            }
        }
    }
}

/// The stream's first event: what the session is, and the id the next
/// event will have (so a client knows what `Last-Event-ID` can resume).
fn write_hello(buf: &mut Vec<u8>, ch: &Channel, sub: &Subscription) {
    let hello = serde_json::json!({
        "id": ch.id.to_string(),
        "transport": ch.transport,
        "alias": ch.alias,
        "core": ch.core,
        "state": ch.state().label(),
        "started_unix_ms": ch.started_unix_ms,
        "ring_events": ch.ring().capacity(),
        "next_event_id": sub.next_seq() + 1,
    });
    let _ = write!(buf, "event: session\ndata: {hello}\n\n");
}

/// Writes and flushes `buf` within `send_timeout`, then empties it.
/// `false` when the stream is over: the client is gone, or it took no data
/// in time (then it is closed, counted and logged), since a slow
/// subscriber must never hold events back for the others.
async fn send<S>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    send_timeout: Duration,
    sub: &Subscription,
    ch: &Channel,
) -> bool
where
    S: AsyncWrite + Unpin,
{
    let written = glommio::timer::timeout(send_timeout, async {
        Ok(async {
            stream.write_all(buf).await?;
            stream.flush().await
        }
        .await)
    })
    .await;
    match written {
        Ok(Ok(())) => {
            buf.clear();
            true
        }
        // Gone: nothing more to say.
        Ok(Err(_)) => false,
        Err(_) => {
            sub.note_slow();
            eprintln!(
                "<4>events: closed a subscriber of session {}: it took no data for {} ms (session.send_timeout_ms)",
                ch.id,
                send_timeout.as_millis()
            );
            false
        }
    }
}

/// Waits until the session has news (or the keep-alive is `due`), or the
/// client goes away, whichever comes first.
async fn wait<S>(
    stream: &mut S,
    watch: &Watch,
    sub: &Subscription,
    due: Instant,
    scratch: &mut [u8],
) -> Wake
where
    S: AsyncRead + Unpin,
{
    futures_lite::future::or(
        async {
            watch.changed(sub.next_seq(), due).await;
            Wake::Changed
        },
        async {
            // The client sends nothing on an event stream: a read ends
            // only when it goes away (or misbehaves, which ends it too).
            let _ = stream.read(scratch).await;
            Wake::ClientGone
        },
    )
    .await
}
