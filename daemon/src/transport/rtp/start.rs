//! Starting an RTP session: the one piece of code behind both ways a
//! session is made — the control API (`POST /v1/rtp/sessions`) and a SIP
//! call's INVITE — so that both get the same audio path, admission, event
//! stream, registry entry and task.
//!
//! Two halves: [`reserve`] (socket, slot, event stream) and [`launch`]
//! (audio path, handle, registry entry, task). [`start`] runs both at once;
//! an outbound SIP call reserves when it places the call and launches when
//! the answer names the codec.
//!
//! Order (invariant): the socket is made before the slot is taken, and in
//! [`start`] the audio path too; once admitted, nothing can fail without
//! the slot being given back ([`Reservation::abandon`], or the session
//! task's end); the event stream is registered before the session's id is
//! handed out, so `/v1/sessions/{id}/events` works from the first answer.

use super::media::MediaPath;
use super::session::{self, NewSession};
use super::state::{Registry, SessionHandle, SessionInfo};
use crate::app::CoreApp;
use crate::engine::admission::Ticket;
use crate::events::webhook::WebhookUrl;
use crate::events::EventSink;
use crate::events::SessionState;
use crate::io::mailbox::Mailbox;
use crate::log_record::{LogLine, Record};
use crate::session::record::{EndReason, SessionRecord};
use crate::transport::session::{admit, Admitted};
use glommio::net::UdpSocket;
use moshid_model::streaming::SessionParams;
use moshid_telephony::rtp::SessionSpec;
use std::net::IpAddr;
use std::rc::Rc;
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

/// A session's socket, slot and event stream, taken before its codec is
/// known (an outbound SIP call learns it from the answer): the first half
/// of [`start`], [`launch`] is the second. While reserved, the slot is
/// held (no frames reach the engine), the session id is given out, and
/// `/v1/sessions/{id}/events` answers; [`Reservation::abandon`] gives it
/// all back with a final record.
pub struct Reservation {
    socket: UdpSocket,
    ticket: Ticket,
    mailbox: Rc<Mailbox>,
    rec: SessionRecord,
    events: EventSink,
    transport: &'static str,
    /// The address the far end sends RTP to.
    pub address: IpAddr,
    /// Its port.
    pub port: u16,
}

impl Reservation {
    /// The session id.
    pub fn id(&self) -> u64 {
        self.rec.id
    }

    /// Whether the daemon is shutting down (the session would end at once).
    pub fn shutdown_requested(&self) -> bool {
        self.mailbox.shutdown_requested()
    }

    /// Gives the slot back and ends the event stream with a final record
    /// ending for `reason` (the call was never answered).
    pub fn abandon(mut self, app: &CoreApp, reason: EndReason) {
        self.rec.end(reason);
        self.events.finish(&self.rec);
        app.ctx.end_session(self.ticket);
        self.rec.log();
    }
}

/// Starts a session on this core: socket, audio path, slot, events,
/// registry, task.
pub fn start(
    app: &CoreApp,
    registry: &Arc<Registry>,
    req: StartRequest,
) -> Result<Started, StartError> {
    let cfg = &app.shared.config;
    // Every buffer is made before the slot is taken.
    let media = MediaPath::configured(&req.spec, &cfg.rtp)
        .map_err(|e| StartError::Internal(format!("cannot set up the audio path: {e}")))?;
    let reservation = reserve(
        app,
        registry,
        req.params,
        req.webhook,
        req.transport,
        req.alias,
        req.reached_at,
    )?;
    launch(app, registry, reservation, req.spec, media)
}

/// Takes a socket, a slot and an event stream for a session whose codec is
/// not known yet (see [`Reservation`]).
pub fn reserve(
    app: &CoreApp,
    registry: &Registry,
    params: SessionParams,
    webhook: Option<WebhookUrl>,
    transport: &'static str,
    alias: Option<String>,
    reached_at: Option<IpAddr>,
) -> Result<Reservation, StartError> {
    let shared = &app.shared;
    let cfg = &shared.config;
    if registry.len() >= cfg.rtp.max_sessions {
        return Err(limit(cfg.rtp.max_sessions));
    }
    let bind_ip = cfg.rtp.bind_address.unwrap_or(cfg.listen.address.ip());
    let socket = session::bind(bind_ip)
        .map_err(|e| StartError::Internal(format!("cannot bind a UDP socket on {bind_ip}: {e}")))?;
    let local = socket
        .local_addr()
        .map_err(|e| StartError::Internal(format!("UDP socket: {e}")))?;
    // A socket bound to every interface is reached at the address the
    // request came in on.
    let address = if local.ip().is_unspecified() {
        reached_at.unwrap_or(local.ip())
    } else {
        local.ip()
    };
    let mut rec = SessionRecord::start(shared.session_id(), transport);
    let Admitted {
        ticket,
        mailbox,
        events,
    } = admit(app, &mut rec, params, alias, SessionState::Waiting, webhook)
        .map_err(|refusal| StartError::NoCapacity(refusal.to_string()))?;
    Ok(Reservation {
        socket,
        ticket,
        mailbox,
        rec,
        events,
        transport,
        address,
        port: local.port(),
    })
}

fn limit(max: usize) -> StartError {
    StartError::NoCapacity(format!(
        "RTP session limit reached (rtp.max_sessions = {max})"
    ))
}

/// Runs a reserved session with codec `spec` over `media` (made from the
/// same spec): its handle, registry entry and task. The registry's bound
/// (`rtp.max_sessions`) is checked again here, as other cores may have
/// filled it since [`reserve`]: then the reservation is given back.
pub fn launch(
    app: &CoreApp,
    registry: &Arc<Registry>,
    r: Reservation,
    spec: SessionSpec,
    media: MediaPath,
) -> Result<Started, StartError> {
    let max = app.shared.config.rtp.max_sessions;
    if registry.len() >= max {
        r.abandon(app, EndReason::Refused(limit(max).to_string()));
        return Err(limit(max));
    }
    let Reservation {
        socket,
        ticket,
        mailbox,
        mut rec,
        events,
        transport,
        address,
        port,
    } = r;
    // The session's length counts from its media (an outbound call may
    // have rung for a while).
    rec.restart_clock();
    let id = rec.id.to_string();
    let info = SessionInfo {
        codec: spec.codec.name(),
        payload_type: spec.payload_type,
        sample_rate: spec.codec.sample_rate_hz,
        ptime_ms: spec.ptime_ms,
        dtmf_payload_type: spec.dtmf_payload_type,
        address: address.to_string(),
        port,
        remote: spec.remote.map(|r| r.to_string()),
        core: app.ctx.core,
        resample_in_ms: media.res_in.delay_ms(),
        resample_out_ms: media.res_out.delay_ms(),
    };
    let handle = Arc::new(SessionHandle::new(id.clone(), info));
    handle.attach_events(events);
    if !registry.insert(handle.clone(), max) {
        // Another core filled the registry between the check and here.
        rec.end(EndReason::Refused(limit(max).to_string()));
        if let Some(events) = handle.take_events() {
            events.finish(&rec);
        }
        app.ctx.end_session(ticket);
        rec.log();
        return Err(limit(max));
    }
    LogLine::new(Record::RtpSessionStart)
        .field("id", &id)
        .field("transport", transport)
        .field("codec", spec.codec.name())
        .field("pt", spec.payload_type)
        .field("ptime_ms", spec.ptime_ms)
        .field("port", port)
        .opt("remote", spec.remote)
        .field("core", app.ctx.core)
        .emit();
    let new = NewSession {
        handle: handle.clone(),
        socket,
        spec,
        media,
        ticket,
        mailbox,
        rec,
        registry: registry.clone(),
    };
    glommio::spawn_local(session::run(new, app.clone())).detach();
    Ok(Started {
        handle,
        address,
        port,
    })
}
