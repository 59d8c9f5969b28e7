//! What every session on an I/O core can reach: the core's context and its
//! budget of connections not yet started, the configuration, the text
//! pieces, what conditioning the model accepts, session ids and the event
//! hub. What only one transport or the HTTP API needs (the RTP sessions,
//! the SIP calls and registrations, the model's description, TLS) is not
//! here: it is handed to those who use it ([`crate::api::ApiShared`]).
//!
//! Invariants: one `CoreApp` per executor, made once at start; everything in
//! it is read-only after start except the core context's own cells.

use crate::config::Config;
use crate::io::core::CoreContext;
use crate::io::pending::{PendingBudget, PendingLimits};
use crate::metrics::connections::PendingCounters;
use crate::session::params::ModelInfo;
use moshid_model::spm::PieceTable;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Daemon-wide values every core shares (thread-safe).
pub struct Shared {
    /// The validated configuration.
    pub config: Config,
    /// Token id → text.
    pub pieces: PieceTable,
    /// Bytes of the longest token text (sizes the sessions' send buffers).
    pub max_text_bytes: usize,
    /// Conditioning the model accepts.
    pub model_info: ModelInfo,
    /// Session ids.
    next_session_id: AtomicU64,
    /// Every live session's events, and the webhooks.
    pub events: crate::events::EventHub,
}

impl Shared {
    /// Daemon-wide values.
    pub fn new(config: Config, pieces: PieceTable, model_info: ModelInfo) -> Self {
        let max_text_bytes = (0..pieces.len() as u32)
            .filter_map(|id| pieces.text_for_token(id))
            .map(str::len)
            .max()
            .unwrap_or(0);
        Shared {
            events: crate::events::EventHub::new(&config.events),
            config,
            max_text_bytes,
            pieces,
            model_info,
            next_session_id: AtomicU64::new(1),
        }
    }

    /// A fresh session id.
    pub fn session_id(&self) -> u64 {
        self.next_session_id.fetch_add(1, Ordering::Relaxed)
    }

    /// How many session ids have been handed out (ids are 1 to this).
    pub fn issued_session_ids(&self) -> u64 {
        self.next_session_id.load(Ordering::Relaxed) - 1
    }
}

/// One core's view.
#[derive(Clone)]
pub struct CoreApp {
    /// The core context.
    pub ctx: Rc<CoreContext>,
    /// Daemon-wide values.
    pub shared: Arc<Shared>,
    /// The core's budget of connections that have not started, shared by
    /// every listener of the core (see [`PendingBudget`]).
    pub pending: Rc<PendingBudget>,
}

impl CoreApp {
    /// One core's view, with its pending-connection budget (published in
    /// the metrics registry).
    pub fn new(ctx: Rc<CoreContext>, shared: Arc<Shared>) -> Self {
        let l = &shared.config.listen;
        let limits = PendingLimits {
            max_per_core: l.pending_per_core(),
            max_per_ip: l.pending_per_ip(),
        };
        let counters = ctx.engine.metrics.register_pending(PendingCounters::new(
            ctx.core,
            limits.max_per_core,
            limits.max_per_ip,
        ));
        let pending = PendingBudget::new(ctx.core, limits, counters);
        CoreApp {
            ctx,
            shared,
            pending,
        }
    }
}
