//! What the control API sees, from any core, of what SIP starts itself:
//! the calls moshid places (`GET /v1/sip/calls/{id}`) and its
//! registrations (`GET /v1/sip/registrations`). The core that runs a call
//! or a registration is the only writer; readers take a short lock (the
//! control plane only: nothing here is touched per media frame).
//!
//! Invariants: at most `sip.outbound.max_calls` calls are live (a call
//! that would pass it is refused before its INVITE is sent), and at most
//! `sip.outbound.keep_ended` ended ones are kept, the oldest forgotten
//! first; a call is live from its `POST` until its final state, and
//! reaches that state exactly once.

use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where a placed call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPhase {
    /// INVITE sent, no answer yet.
    Calling,
    /// The far end rings (a provisional answer came).
    Ringing,
    /// Answered: media flows.
    Answered,
    /// Answered, then hung up (by either side).
    Ended,
    /// Never answered (refused, cancelled, timed out).
    Failed,
}

#[derive(Debug, Clone, Serialize)]
struct Progress {
    state: CallPhase,
    /// The final SIP status of the INVITE, once one came.
    status_code: Option<u16>,
    /// Why the call failed or ended, in words.
    reason: Option<String>,
    /// The codec, once answered.
    codec: Option<&'static str>,
    answered_unix_ms: Option<u64>,
    ended_unix_ms: Option<u64>,
}

/// One call moshid placed.
pub struct OutboundCall {
    /// Its id: the session id of its RTP session.
    pub id: String,
    /// Whom it calls (`POST`'s `to`).
    pub to: String,
    /// Its Call-ID.
    pub call_id: String,
    /// The I/O core running it.
    pub core: usize,
    created_unix_ms: u64,
    hang_up: AtomicBool,
    progress: Mutex<Progress>,
}

impl OutboundCall {
    /// A call being placed now.
    pub fn new(id: String, to: String, call_id: String, core: usize) -> Arc<OutboundCall> {
        Arc::new(OutboundCall {
            id,
            to,
            call_id,
            core,
            created_unix_ms: unix_ms(),
            hang_up: AtomicBool::new(false),
            progress: Mutex::new(Progress {
                state: CallPhase::Calling,
                status_code: None,
                reason: None,
                codec: None,
                answered_unix_ms: None,
                ended_unix_ms: None,
            }),
        })
    }

    /// Asks the call's core to hang up (CANCEL before the answer, BYE after).
    pub fn request_hang_up(&self) {
        self.hang_up.store(true, Ordering::Release);
    }

    /// Whether a hang-up was asked for.
    pub fn hang_up_requested(&self) -> bool {
        self.hang_up.load(Ordering::Acquire)
    }

    /// Where the call stands.
    pub fn state(&self) -> CallPhase {
        lock(&self.progress).state
    }

    /// The far end rings.
    pub fn ringing(&self) {
        let mut p = lock(&self.progress);
        if p.state == CallPhase::Calling {
            p.state = CallPhase::Ringing;
        }
    }

    /// Answered with `codec`.
    pub fn answered(&self, codec: &'static str) {
        let mut p = lock(&self.progress);
        p.state = CallPhase::Answered;
        p.status_code = Some(200);
        p.codec = Some(codec);
        p.answered_unix_ms = Some(unix_ms());
    }

    /// The final state: `Ended` after an answer, `Failed` before one.
    pub fn finished(&self, status_code: Option<u16>, reason: &str) {
        let mut p = lock(&self.progress);
        if matches!(p.state, CallPhase::Ended | CallPhase::Failed) {
            return;
        }
        p.state = if p.state == CallPhase::Answered {
            CallPhase::Ended
        } else {
            CallPhase::Failed
        };
        if p.status_code.is_none() {
            p.status_code = status_code;
        }
        p.reason = Some(reason.to_string());
        p.ended_unix_ms = Some(unix_ms());
    }

    /// The call as `GET /v1/sip/calls/{id}` shows it.
    pub fn to_json(&self) -> serde_json::Value {
        let p = lock(&self.progress).clone();
        serde_json::json!({
            "id": self.id,
            "to": self.to,
            "call_id": self.call_id,
            "core": self.core,
            "created_unix_ms": self.created_unix_ms,
            "state": p.state,
            "status_code": p.status_code,
            "reason": p.reason,
            "codec": p.codec,
            "answered_unix_ms": p.answered_unix_ms,
            "ended_unix_ms": p.ended_unix_ms,
            "hang_up_requested": self.hang_up_requested(),
            "event_stream": format!("{}/{}/events", crate::events::SESSIONS_PATH, self.id),
        })
    }
}

#[derive(Default)]
struct Tables {
    live: HashMap<String, Arc<OutboundCall>>,
    ended: VecDeque<Arc<OutboundCall>>,
}

/// The placed calls, live and recently ended.
#[derive(Default)]
pub struct OutboundCalls {
    tables: Mutex<Tables>,
}

impl OutboundCalls {
    /// Adds a live call unless `max` are live; false when full.
    pub fn insert(&self, call: Arc<OutboundCall>, max: usize) -> bool {
        let mut t = lock(&self.tables);
        if t.live.len() >= max {
            return false;
        }
        t.live.insert(call.id.clone(), call);
        true
    }

    /// Live calls.
    pub fn live(&self) -> usize {
        lock(&self.tables).live.len()
    }

    /// Moves call `id` to the ended ones (keeping at most `keep`).
    pub fn retire(&self, id: &str, keep: usize) {
        let mut t = lock(&self.tables);
        if let Some(call) = t.live.remove(id) {
            if keep == 0 {
                return;
            }
            if t.ended.len() >= keep {
                t.ended.pop_front();
            }
            t.ended.push_back(call);
        }
    }

    /// Call `id`, live or kept.
    pub fn get(&self, id: &str) -> Option<Arc<OutboundCall>> {
        let t = lock(&self.tables);
        t.live
            .get(id)
            .or_else(|| t.ended.iter().find(|c| c.id == id))
            .cloned()
    }

    /// Every call known, live first, as JSON.
    pub fn list(&self) -> Vec<serde_json::Value> {
        let t = lock(&self.tables);
        let mut live: Vec<&Arc<OutboundCall>> = t.live.values().collect();
        live.sort_by_key(|c| c.id.parse::<u64>().unwrap_or(u64::MAX));
        live.into_iter()
            .chain(t.ended.iter().rev())
            .map(|c| serde_json::json!({"id": c.id, "to": c.to, "state": c.state()}))
            .collect()
    }
}

/// Where a registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrationPhase {
    /// The first REGISTER is on its way.
    Registering,
    /// The registrar holds the binding.
    Registered,
    /// The last REGISTER failed; another follows after `retry_s`.
    Failed,
}

#[derive(Debug, Clone, Serialize)]
struct RegistrationProgress {
    state: RegistrationPhase,
    /// Seconds the registrar granted.
    expires_s: Option<u32>,
    last_status_code: Option<u16>,
    last_reason: Option<String>,
    registered_unix_ms: Option<u64>,
    /// Successful REGISTERs (the first and each refresh).
    successes: u64,
    failures: u64,
}

/// One registration, as `GET /v1/sip/registrations` shows it.
pub struct RegistrationStatus {
    /// The registrar.
    pub registrar: String,
    /// The address of record.
    pub aor: String,
    progress: Mutex<RegistrationProgress>,
}

impl RegistrationStatus {
    /// A registration about to start.
    pub fn new(registrar: String, aor: String) -> Arc<RegistrationStatus> {
        Arc::new(RegistrationStatus {
            registrar,
            aor,
            progress: Mutex::new(RegistrationProgress {
                state: RegistrationPhase::Registering,
                expires_s: None,
                last_status_code: None,
                last_reason: None,
                registered_unix_ms: None,
                successes: 0,
                failures: 0,
            }),
        })
    }

    /// The registrar accepted the binding for `expires_s`.
    pub fn registered(&self, expires_s: u32) {
        let mut p = lock(&self.progress);
        p.state = RegistrationPhase::Registered;
        p.expires_s = Some(expires_s);
        p.last_status_code = Some(200);
        p.last_reason = None;
        p.registered_unix_ms = Some(unix_ms());
        p.successes += 1;
    }

    /// A REGISTER failed.
    pub fn failed(&self, status_code: Option<u16>, reason: &str) {
        let mut p = lock(&self.progress);
        p.state = RegistrationPhase::Failed;
        p.last_status_code = status_code;
        p.last_reason = Some(reason.to_string());
        p.failures += 1;
    }

    /// Where it stands.
    pub fn state(&self) -> RegistrationPhase {
        lock(&self.progress).state
    }

    /// As JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let p = lock(&self.progress).clone();
        serde_json::json!({
            "registrar": self.registrar,
            "aor": self.aor,
            "state": p.state,
            "expires_s": p.expires_s,
            "last_status_code": p.last_status_code,
            "last_reason": p.last_reason,
            "registered_unix_ms": p.registered_unix_ms,
            "successes": p.successes,
            "failures": p.failures,
        })
    }
}

/// Daemon-wide SIP state the control API reads.
pub struct SipShared {
    /// The calls moshid places.
    pub calls: OutboundCalls,
    /// One per `sip.registrations` entry, in order.
    pub registrations: Vec<Arc<RegistrationStatus>>,
}

impl SipShared {
    /// For `config`.
    pub fn new(config: &crate::config::sip::SipConfig) -> SipShared {
        SipShared {
            calls: OutboundCalls::default(),
            registrations: config
                .registrations
                .iter()
                .map(|r| RegistrationStatus::new(r.registrar.clone(), r.aor.clone()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_bounded_and_kept_after_their_end() {
        let calls = OutboundCalls::default();
        let c1 = OutboundCall::new("1".into(), "sip:a@h".into(), "x".into(), 0);
        assert!(calls.insert(c1.clone(), 1));
        assert!(!calls.insert(
            OutboundCall::new("2".into(), "sip:b@h".into(), "y".into(), 0),
            1
        ));
        c1.ringing();
        assert_eq!(c1.state(), CallPhase::Ringing);
        c1.finished(Some(486), "busy");
        c1.finished(Some(500), "later causes do not overwrite");
        let j = c1.to_json();
        assert_eq!(
            (j["state"].as_str(), j["status_code"].as_u64()),
            (Some("failed"), Some(486))
        );
        assert_eq!(j["reason"], "busy");
        calls.retire("1", 1);
        assert_eq!(calls.live(), 0);
        assert!(calls.get("1").is_some());
        let c3 = OutboundCall::new("3".into(), "sip:c@h".into(), "z".into(), 0);
        assert!(calls.insert(c3.clone(), 1));
        c3.answered("PCMU");
        c3.finished(None, "bye_from_peer");
        assert_eq!(c3.state(), CallPhase::Ended);
        calls.retire("3", 1);
        // Only one ended call is kept: the oldest went.
        assert!(calls.get("1").is_none() && calls.get("3").is_some());
        assert_eq!(calls.list().len(), 1);
    }
}
