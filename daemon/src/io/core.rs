//! One I/O core's shared context: its lanes to the engine, the table that
//! routes the engine's records to the sessions living on this core, and
//! session admission.
//!
//! Invariants: everything here is owned by one glommio executor (`Rc`,
//! `RefCell`; nothing crosses threads but the lanes and the engine's shared
//! state). The route table is a vector indexed by slot — no map, no
//! allocation per frame. A session's route is removed when the session ends,
//! and its close record is always delivered to the engine (retried while the
//! lane is full), so a slot is never leaked.
//!
//! Stage metrics: the core's [`StageRecorder`] is written only by this
//! executor's tasks (the counters are published to the engine's metrics
//! registry when the context is made). Sessions read the switch once per
//! message batch and pass a push stamp (`Some` only while on) with each
//! frame; with metrics off nothing here reads a clock or records anything.

use super::mailbox::Mailbox;
use crate::engine::admission::{Refusal, Ticket};
use crate::engine::records::{FromEngine, ToEngine, ToEngineKind};
use crate::engine::{CorePort, EngineShared};
use crate::metrics::{Owner, StageRecorder};
use crate::FRAME_SAMPLES;
use moshid_model::streaming::SessionParams;
use moshid_ringbuf::PushError;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// Per-core counters of session traffic (always on: correctness, not metrics).
#[derive(Debug, Default)]
pub struct CoreCounters {
    /// Sessions started on this core.
    pub sessions_started: Cell<u64>,
    /// Sessions ended on this core.
    pub sessions_ended: Cell<u64>,
    /// Frames refused because the lane to the engine was full.
    pub lane_full_frames: Cell<u64>,
}

/// A session's place in the route table.
pub struct Route {
    /// The slot's generation the session owns.
    pub generation: u32,
    /// Where the engine's records for it go.
    pub mailbox: Rc<Mailbox>,
}

/// State shared by every task of one I/O core.
pub struct CoreContext {
    /// This core's index.
    pub core: usize,
    port: RefCell<CorePort>,
    routes: RefCell<Vec<Option<Route>>>,
    /// Close records waiting for room in the lane.
    pending_closes: RefCell<Vec<(u32, u32)>>,
    /// The engine's shared state.
    pub engine: Arc<EngineShared>,
    /// Scratch record for pushes.
    scratch: RefCell<Box<ToEngine>>,
    /// Session counters.
    pub counters: CoreCounters,
    /// Sessions currently routed here.
    pub live_sessions: Cell<usize>,
    /// This core's stage metrics (written by this executor only).
    pub stages: StageRecorder,
}

impl CoreContext {
    /// A context over this core's lanes.
    pub fn new(core: usize, port: CorePort, engine: Arc<EngineShared>) -> Rc<Self> {
        let max_slots = engine.max_slots;
        let stages = engine
            .metrics
            .register(Owner::Core(core), engine.groups.positions, max_slots);
        Rc::new(CoreContext {
            core,
            port: RefCell::new(port),
            routes: RefCell::new((0..max_slots).map(|_| None).collect()),
            pending_closes: RefCell::new(Vec::with_capacity(max_slots)),
            engine,
            scratch: RefCell::new(Box::default()),
            counters: CoreCounters::default(),
            live_sessions: Cell::new(0),
            stages,
        })
    }

    /// Whether stage metrics are on (read once per message batch).
    #[inline]
    pub fn metrics_on(&self) -> bool {
        self.engine.metrics.enabled()
    }

    /// Admits a session: reserves a slot, routes it here and asks the engine
    /// to open it. `mailbox_frames` bounds the records the mailbox holds.
    pub fn admit(
        &self,
        params: SessionParams,
        mailbox_frames: usize,
    ) -> Result<(Ticket, Rc<Mailbox>), Refusal> {
        let admitted =
            self.engine
                .admission()
                .admit(params, &self.engine.step_times, self.engine.budget_ms);
        let ticket = match admitted {
            Ok(t) => t,
            Err(refusal) => {
                if self.metrics_on() {
                    self.stages.refused_session();
                }
                return Err(refusal);
            }
        };
        if self
            .push(
                ToEngineKind::Open,
                ticket.slot,
                ticket.generation,
                None,
                None,
                None,
            )
            .is_err()
        {
            // The engine never saw this admission: hand the slot straight back.
            self.engine
                .admission()
                .release(ticket.slot, ticket.generation);
            if self.metrics_on() {
                self.stages.refused_session();
            }
            return Err(Refusal::NotAccepting);
        }
        let mailbox = Rc::new(Mailbox::new(mailbox_frames));
        self.routes.borrow_mut()[ticket.slot as usize] = Some(Route {
            generation: ticket.generation,
            mailbox: mailbox.clone(),
        });
        self.live_sessions.set(self.live_sessions.get() + 1);
        self.publish();
        self.counters
            .sessions_started
            .set(self.counters.sessions_started.get() + 1);
        Ok((ticket, mailbox))
    }

    /// Sends one input frame of a session to the engine (reads the metrics
    /// switch itself; a session that has read it for its message batch
    /// calls [`CoreContext::send_frame_at`]).
    pub fn send_frame(&self, ticket: Ticket, pcm: &[f32; FRAME_SAMPLES]) -> Result<(), PushError> {
        self.send_frame_at(ticket, pcm, self.engine.metrics.stamp())
    }

    /// Tells the engine the session's input is over (its next step feeds the
    /// model's end-of-stream input).
    pub fn send_end_of_input(&self, ticket: Ticket) -> Result<(), PushError> {
        self.push(
            ToEngineKind::EndOfInput,
            ticket.slot,
            ticket.generation,
            None,
            None,
            None,
        )
    }

    /// Sends one input frame with its push stamp: `Some(now)` while stage
    /// metrics are on (the engine turns it into a `frame_wait` sample and
    /// the frame is counted here), `None` when off (nothing recorded).
    pub fn send_frame_at(
        &self,
        ticket: Ticket,
        pcm: &[f32; FRAME_SAMPLES],
        pushed_at: Option<Instant>,
    ) -> Result<(), PushError> {
        self.send_completed_frame(ticket, pcm, pushed_at, None)
    }

    /// [`CoreContext::send_frame_at`] for a frame whose client decided when
    /// it was complete: `completed_at` is when its last sample arrived here
    /// (the engine tracks the stream's phase from it).
    pub fn send_completed_frame(
        &self,
        ticket: Ticket,
        pcm: &[f32; FRAME_SAMPLES],
        pushed_at: Option<Instant>,
        completed_at: Option<Instant>,
    ) -> Result<(), PushError> {
        let r = self.push(
            ToEngineKind::Frame,
            ticket.slot,
            ticket.generation,
            Some(pcm),
            pushed_at,
            completed_at,
        );
        if r.is_err() {
            self.counters
                .lane_full_frames
                .set(self.counters.lane_full_frames.get() + 1);
        }
        if pushed_at.is_some() {
            match r {
                Ok(()) => self.stages.frames(1),
                Err(_) => self.stages.dropped_frame(),
            }
        }
        r
    }

    /// Ends a session: unroutes it and tells the engine to free its slot.
    pub fn end_session(&self, ticket: Ticket) {
        {
            let mut routes = self.routes.borrow_mut();
            let r = &mut routes[ticket.slot as usize];
            if r.as_ref()
                .is_some_and(|r| r.generation == ticket.generation)
            {
                *r = None;
                self.live_sessions.set(self.live_sessions.get() - 1);
                self.counters
                    .sessions_ended
                    .set(self.counters.sessions_ended.get() + 1);
            }
        }
        if self
            .push(
                ToEngineKind::Close,
                ticket.slot,
                ticket.generation,
                None,
                None,
                None,
            )
            .is_err()
        {
            self.pending_closes
                .borrow_mut()
                .push((ticket.slot, ticket.generation));
        }
        self.publish();
    }

    /// Publishes this core's table sizes (session start and end only).
    fn publish(&self) {
        use std::sync::atomic::Ordering;
        self.engine.routed_per_core[self.core]
            .store(self.live_sessions.get() as u64, Ordering::Relaxed);
        self.engine.pending_closes_per_core[self.core]
            .store(self.pending_closes.borrow().len() as u64, Ordering::Relaxed);
    }

    /// Retries close records that found the lane full.
    pub fn flush_pending_closes(&self) {
        if self.pending_closes.borrow().is_empty() {
            return;
        }
        {
            let mut pending = self.pending_closes.borrow_mut();
            while let Some(&(slot, generation)) = pending.last() {
                if self
                    .push(ToEngineKind::Close, slot, generation, None, None, None)
                    .is_err()
                {
                    break;
                }
                pending.pop();
            }
        }
        self.publish();
    }

    /// Close records still waiting (leak checks).
    pub fn pending_closes(&self) -> usize {
        self.pending_closes.borrow().len()
    }

    fn push(
        &self,
        kind: ToEngineKind,
        slot: u32,
        generation: u32,
        pcm: Option<&[f32; FRAME_SAMPLES]>,
        pushed_at: Option<Instant>,
        completed_at: Option<Instant>,
    ) -> Result<(), PushError> {
        let mut rec = self.scratch.borrow_mut();
        rec.kind = kind;
        rec.slot = slot;
        rec.generation = generation;
        rec.pushed_at = pushed_at;
        rec.completed_at = completed_at;
        if let Some(pcm) = pcm {
            rec.pcm.copy_from_slice(pcm);
        }
        self.port.borrow_mut().to_engine.try_push(&rec)
    }

    /// Routes every record the engine has sent to its session's mailbox.
    /// Returns how many records were read.
    pub fn dispatch(&self) -> usize {
        let routes = self.routes.borrow();
        let mut port = self.port.borrow_mut();
        port.from_engine.drain(|rec: &FromEngine| {
            if let Some(Some(route)) = routes.get(rec.slot as usize) {
                if route.generation == rec.generation {
                    route.mailbox.deliver(rec);
                }
            }
        })
    }

    /// The doorbell the engine rings for this core.
    pub fn doorbell(&self) -> Arc<moshid_ringbuf::Doorbell> {
        self.port.borrow().doorbell.clone()
    }

    /// Asks every session on this core to end (server shutdown).
    pub fn notify_shutdown_all(&self) {
        for route in self.routes.borrow().iter().flatten() {
            route.mailbox.notify_shutdown();
        }
    }

    /// Routes currently held (leak checks).
    pub fn routed(&self) -> usize {
        self.routes.borrow().iter().filter(|r| r.is_some()).count()
    }
}

/// The task that moves the engine's records into session mailboxes; ends
/// when the engine closes the doorbell.
pub async fn dispatch_loop(ctx: Rc<CoreContext>) {
    let bell = ctx.doorbell();
    loop {
        let rung = bell.wait().await;
        ctx.dispatch();
        ctx.flush_pending_closes();
        if rung.is_err() {
            break;
        }
    }
}
