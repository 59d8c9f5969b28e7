//! Starting an RTP session: the one piece of code behind both ways a
//! session is made — the control API (`POST /v1/rtp/sessions`) and a SIP
//! call's INVITE — so that both get the same audio path, admission, event
//! stream, registry entry and task.
//!
//! Order (invariant): every buffer and the socket are made before the slot
//! is taken; once admitted, nothing can fail without the slot being given
//! back; the event stream is registered before the session's id is handed
//! out, so `/v1/sessions/{id}/events` works from the first answer.

use super::session::{self, MediaPath, NewSession, SessionSpec};
use super::state::{SessionHandle, SessionInfo};
use crate::events::webhook::WebhookUrl;
use crate::io::app::CoreApp;
use crate::session::record::SessionRecord;
use moshid_model::streaming::SessionParams;
use std::net::IpAddr;
use std::sync::Arc;

/// What to start.
pub struct StartRequest {
    /// Codec, payload types, ptime, remote.
    pub spec: SessionSpec,
    /// The checked session parameters.
    pub params: SessionParams,
    /// Where the final record goes.
    pub webhook: Option<WebhookUrl>,
    /// The transport named in the record and the session list (`rtp`, `sip`).
    pub transport: &'static str,
    /// A name the session is also listed under (a SIP Call-ID).
    pub alias: Option<String>,
    /// The local address the request came in on (used when the RTP socket
    /// is bound to every interface).
    pub reached_at: Option<IpAddr>,
}

/// Why no session was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartError {
    /// No capacity now (session limit or admission refusal): try later.
    NoCapacity(String),
    /// A local failure (socket, codec set-up).
    Internal(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::NoCapacity(s) | StartError::Internal(s) => f.write_str(s),
        }
    }
}

/// A started session.
pub struct Started {
    /// Its handle (also in the registry until the session ends).
    pub handle: Arc<SessionHandle>,
    /// The address the far end sends RTP to.
    pub address: IpAddr,
    /// Its port.
    pub port: u16,
}

/// Starts a session on this core: socket, audio path, slot, events,
/// registry, task.
pub fn start(app: &CoreApp, req: StartRequest) -> Result<Started, StartError> {
    let shared = &app.shared;
    let cfg = &shared.config;
    let limit = || {
        StartError::NoCapacity(format!(
            "RTP session limit reached (rtp.max_sessions = {})",
            cfg.rtp.max_sessions
        ))
    };
    if shared.rtp.len() >= cfg.rtp.max_sessions {
        return Err(limit());
    }
    let spec = req.spec;
    let media = MediaPath::new(&spec, cfg.rtp.jitter_min_ms, cfg.rtp.jitter_max_ms)
        .map_err(|e| StartError::Internal(format!("cannot set up the audio path: {e}")))?;
    let bind_ip = cfg.rtp.bind_address.unwrap_or(cfg.listen.address.ip());
    let socket = session::bind(bind_ip)
        .map_err(|e| StartError::Internal(format!("cannot bind a UDP socket on {bind_ip}: {e}")))?;
    let local = socket
        .local_addr()
        .map_err(|e| StartError::Internal(format!("UDP socket: {e}")))?;
    // A socket bound to every interface is reached at the address the
    // request came in on.
    let address = if local.ip().is_unspecified() {
        req.reached_at.unwrap_or(local.ip())
    } else {
        local.ip()
    };
    let mut rec = SessionRecord::start(shared.session_id(), req.transport);
    let (ticket, mailbox) = app
        .ctx
        .admit(req.params, cfg.session.max_frames_in_flight + 1)
        .map_err(|refusal| StartError::NoCapacity(refusal.to_string()))?;
    rec.slot = Some(ticket.slot);
    let id = rec.id.to_string();
    let info = SessionInfo {
        codec: spec.codec.name(),
        payload_type: spec.payload_type,
        sample_rate: spec.codec.sample_rate_hz,
        ptime_ms: spec.ptime_ms,
        dtmf_payload_type: spec.dtmf_payload_type,
        address: address.to_string(),
        port: local.port(),
        remote: spec.remote.map(|r| r.to_string()),
        core: app.ctx.core,
        resample_in_ms: media.res_in.delay_ms(),
        resample_out_ms: media.res_out.delay_ms(),
    };
    let handle = Arc::new(SessionHandle::new(id.clone(), info));
    handle.attach_events(shared.events.open(
        &rec,
        req.alias,
        app.ctx.core,
        crate::events::SessionState::Waiting,
        req.webhook,
    ));
    if !shared.rtp.insert(handle.clone(), cfg.rtp.max_sessions) {
        app.ctx.end_session(ticket);
        return Err(limit());
    }
    eprintln!(
        "<6>rtp session start id={id} transport={} codec={} pt={} ptime_ms={} port={} remote={} core={}",
        req.transport,
        spec.codec.name(),
        spec.payload_type,
        spec.ptime_ms,
        local.port(),
        spec.remote.map_or("-".to_string(), |r| r.to_string()),
        app.ctx.core
    );
    let new = NewSession {
        handle: handle.clone(),
        socket,
        spec,
        media,
        ticket,
        mailbox,
        rec,
    };
    glommio::spawn_local(session::run(new, app.clone())).detach();
    Ok(Started {
        handle,
        address,
        port: local.port(),
    })
}
