//! HTTP plumbing for the daemon's single listener: one TCP port serves the
//! WebSocket endpoints (`/api/chat`, later `/v1/media-stream`) and the small
//! JSON control endpoints (`/health`, `/ready`, `/capacity`, `/metrics`,
//! `POST /admin/metrics`, `POST`/`DELETE /v1/rtp/sessions`).
//!
//! Per connection: [`read_head`] (bounded by [`HeadLimits`] and a caller
//! deadline, see [`deadline`]), route on `method`/`path`, then either
//! [`read_body`] + [`write_json`] / [`write_error`] and [`close_gracefully`],
//! or [`accept_websocket`] with the bytes `read_head` read past the head.
//!
//! Invariants:
//! - One request per connection; every response says `Connection: close`.
//! - Every read is bounded: head bytes, header count, body bytes, query
//!   parameters, WebSocket message and frame sizes; time is bounded by the
//!   caller's [`deadline`].
//! - No byte read from the socket is dropped before the handoff: what follows
//!   the head is the body start or the first WebSocket frames.
//! - Malformed input yields a typed [`HttpError`] carrying its status code,
//!   never a panic; [`respond_error`] turns it into a JSON answer.
//! - Allocation is per connection (owned header strings), never per frame.
//!
//! ```no_run
//! use std::time::Duration;
//! use moshid::http::{self, HeadLimits, HttpError};
//!
//! async fn serve(listener: glommio::net::TcpListener) {
//!     let limits = HeadLimits::default();
//!     let mut buf = Vec::with_capacity(limits.max_head_bytes);
//!     loop {
//!         let Ok(mut stream) = listener.accept().await else { continue };
//!         // (Real code spawns a task per connection with its own buffer.)
//!         let head = match http::deadline(
//!             Duration::from_secs(10),
//!             http::read_head(&mut stream, &mut buf, &limits),
//!         )
//!         .await
//!         {
//!             Ok(head) => head,
//!             Err(e) => {
//!                 let _ = http::respond_error(&mut stream, &e).await;
//!                 http::close_gracefully(stream, Duration::from_secs(1)).await;
//!                 continue;
//!             }
//!         };
//!         match (head.method.as_str(), head.path.as_str()) {
//!             ("GET", "/api/chat") => {
//!                 let config = http::ws_config(1 << 20, 1 << 20);
//!                 let leftover = std::mem::take(&mut buf);
//!                 if let Ok(ws) = http::accept_websocket(stream, &head, leftover, config).await {
//!                     // hand `ws` (a futures Stream + Sink of Messages) to the session
//!                     drop(ws);
//!                 }
//!             }
//!             ("GET", "/health") => {
//!                 let _ = http::write_json(&mut stream, 200, &serde_json::json!({"ok": true})).await;
//!                 http::close_gracefully(stream, Duration::from_secs(1)).await;
//!             }
//!             _ => {
//!                 let _ = http::write_error(&mut stream, 404, "no such endpoint").await;
//!                 http::close_gracefully(stream, Duration::from_secs(1)).await;
//!             }
//!         }
//!     }
//! }
//! ```

mod error;
mod head;
mod query;
mod response;
mod upgrade;
pub mod url;

pub use async_tungstenite::tungstenite::protocol::WebSocketConfig;
pub use async_tungstenite::WebSocketStream;
pub use error::HttpError;
pub use head::{deadline, read_body, read_head, read_json, HeadLimits, RequestHead};
pub use query::{parse_query, parse_query_limited, percent_decode, MAX_QUERY_PARAMS};
pub use response::{
    close_gracefully, reason_phrase, respond_error, write_error, write_json, write_response,
};
pub use upgrade::{accept_websocket, accept_websocket_with, websocket_accept_key, ws_config};
