//! The engine's tick loop: drain every lane, plan the phase groups, step the
//! tick's group as one batch, push each stream's output back to its core and
//! ring the doorbells.
//!
//! Invariants:
//! * Ticks come from absolute deadlines (`start + n · period`, `positions`
//!   ticks per 80 ms frame, see [`super::grouping`]), never from the end of
//!   the previous step, so they do not drift. Ticks without possible work
//!   are slept through ([`Grouping::ticks_to_next_work`]), but never more
//!   than [`MAX_SLEEP_NS`] of them in a row. A tick that steps its group
//!   later than the plan allows (half the group spacing, plus a quarter of
//!   the tick period) is counted as late and flagged on the outputs it
//!   produces (each session counts its late frames); a schedule over a whole
//!   frame behind skips ahead by whole frames rather than burst to catch up.
//! * Which tick steps a slot is [`Grouping`]'s: a WebSocket frame's
//!   completion stamp (set by its core as its last sample arrived) feeds the
//!   slot's phase; the plan is checked at every tick, before the step, and
//!   made afresh when something changed (and once per period, with the
//!   step-time table); moves happen at frame boundaries. A slot steps at most once per tick, only
//!   with a frame queued, oldest first; a slot without one is masked out and
//!   does not advance.
//! * Each frame taken from a session produces exactly one record back
//!   (`Output`, `NoOutputYet`, `Dropped` or `Fault`), so sessions can count
//!   their frames in flight.
//! * Nothing here allocates after [`Engine::new`].
//! * Stage metrics: the switch is read once per tick; when it is off no
//!   clock is read for them and nothing is recorded. A frame's push stamp
//!   (set by its core only while metrics are on) travels with it into the
//!   slot queue and becomes its `frame_wait` sample when it is taken into a
//!   batch.

use super::grouping::{lateness_allowed_ms, Grouping};
use super::records::{FromEngine, FromEngineKind, ToEngine, ToEngineKind};
use super::{CoreLink, EngineShared};
use crate::metrics::{Owner, Stage, StageRecorder};
use crate::FRAME_SAMPLES;
use moshid_model::streaming::{Batch, Prompt, PromptProgress, SessionParams, StreamingModel};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The engine's view of one slot.
#[derive(Debug, Clone, Copy, Default)]
struct EngineSlot {
    open: bool,
    generation: u32,
    core: usize,
    /// Index of the oldest queued frame in this slot's part of `queue`.
    queue_head: usize,
    /// Frames queued.
    queue_len: usize,
}

/// A tick that steps its group more than the plan's allowed lateness plus
/// `period / LATE_TICK_FRACTION` after its deadline is late: counted by the
/// engine, and flagged on every output it produces so each session counts
/// its own late frames.
const LATE_TICK_FRACTION: f64 = 4.0;

/// The engine drains its lanes (opens, closes, frames) at least this often,
/// even when no tick in between has work ([`Grouping::ticks_to_next_work`]).
pub const MAX_SLEEP_NS: u64 = 5_000_000;

/// Called once per tick with the tick's start (the systemd watchdog hangs here).
pub type TickHook = Box<dyn FnMut(Instant) + Send>;

/// The engine thread's state.
pub struct Engine {
    model: Box<dyn StreamingModel>,
    batch: Batch,
    links: Vec<CoreLink>,
    shared: Arc<EngineShared>,
    slots: Vec<EngineSlot>,
    /// Queued input frames: `max_slots × queue_depth × FRAME_SAMPLES`.
    queue: Vec<f32>,
    /// Which queued entries are end-of-input markers, `max_slots × queue_depth`.
    queue_end_of_input: Vec<bool>,
    queue_depth: usize,
    /// Push stamp of each queued frame (`max_slots × queue_depth`; `None`
    /// when metrics were off at push).
    queue_stamps: Vec<Option<Instant>>,
    /// Completion stamp of each queued frame (`max_slots × queue_depth`;
    /// `None` for transports that place their frame cut).
    queue_completed: Vec<Option<Instant>>,
    /// Which tick steps each slot.
    grouping: Grouping,
    /// The engine's clock: phases are measured from here, ticks start here.
    epoch: Instant,
    /// Predicted step time per batch size, in milliseconds (refreshed once
    /// per frame period from the shared step-time model).
    step_table_ms: Vec<f64>,
    /// Sessions per position (scratch for publishing the plan).
    group_sizes: Vec<usize>,
    /// This thread's stage metrics (single writer).
    stages: StageRecorder,
    /// Scratch record for outputs.
    out: FromEngine,
    /// Which cores got records this tick.
    touched: Vec<bool>,
    warmup_steps: usize,
    on_tick: Option<TickHook>,
    /// The plan last published on the group board ([`Grouping::plans`]).
    published_plans: u64,
    /// A new frame period began: refresh the step-time table.
    refresh_due: bool,
    /// Prompt prefills and their cache (models with prompts).
    prompts: super::prompts::Prompts,
}

impl Engine {
    /// An engine over `model`, fed by `links`, publishing through `shared`.
    pub fn new(
        model: Box<dyn StreamingModel>,
        links: Vec<CoreLink>,
        shared: Arc<EngineShared>,
        queue_depth: usize,
        warmup_steps: usize,
    ) -> Self {
        let max_slots = model.max_slots();
        let batch = model.new_batch();
        let cores = links.len();
        let grouping = Grouping::new(max_slots, shared.phase_groups, shared.budget_margin_ms);
        let positions = grouping.positions();
        let stages = shared.metrics.register(Owner::Engine, positions, max_slots);
        Engine {
            model,
            batch,
            links,
            shared,
            slots: vec![EngineSlot::default(); max_slots],
            queue: vec![0.0; max_slots * queue_depth * FRAME_SAMPLES],
            queue_end_of_input: vec![false; max_slots * queue_depth],
            queue_depth,
            queue_stamps: vec![None; max_slots * queue_depth],
            queue_completed: vec![None; max_slots * queue_depth],
            grouping,
            epoch: Instant::now(),
            step_table_ms: vec![0.0; max_slots + 1],
            group_sizes: vec![0; positions],
            stages,
            out: FromEngine::default(),
            touched: vec![false; cores],
            prompts: super::prompts::Prompts::new(
                max_slots,
                super::prompts::CacheBounds {
                    entries: 16,
                    bytes: 2048 << 20,
                },
                8,
            ),
            warmup_steps,
            on_tick: None,
            published_plans: 0,
            refresh_due: true,
        }
    }

    /// Installs a hook called at every tick.
    pub fn set_tick_hook(&mut self, hook: TickHook) {
        self.on_tick = Some(hook);
    }

    /// Measures step time per batch size, then opens admission.
    pub fn warm_up(&mut self) {
        let sizes = self.shared.step_times.warmup_sizes();
        let params = SessionParams::default();
        let mut full_context = false;
        for &size in &sizes {
            for s in 0..self.batch.max_slots() {
                self.batch.exec[s] = s < size;
                if s < size {
                    // Warm-up slots are reset again when a session opens them.
                    let _ = self.model.reset_slot(s, &params);
                    if self.model.takes_prompts() {
                        self.warm_up_prompt(s);
                    }
                    // Priced at the worst case: a step never outgrows its
                    // measurement as conversations grow older.
                    full_context |= self.model.fill_context_for_timing(s);
                }
            }
            for (i, x) in self.batch.input_pcm.iter_mut().enumerate() {
                *x = 0.1 * ((i % 97) as f32 / 97.0 - 0.5);
            }
            let mut best = u32::MAX;
            for _ in 0..self.warmup_steps {
                let t = Instant::now();
                let _ = self.model.step(&mut self.batch);
                best = best.min(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
            }
            self.shared.step_times.set(size, best);
        }
        self.batch.exec.iter_mut().for_each(|e| *e = false);
        if full_context {
            eprintln!(
                "<6>engine: warm-up steps timed at full context (every stream attending over the \
                 whole window), the worst case admission prices"
            );
        }
        self.shared.ready.store(true, Ordering::Release);
        self.shared.admission().set_accepting(true);
    }

    /// Gives warm-up slot `slot` of a model with prompts (PersonaPlex) the
    /// empty prompt (the silence frames only): such a model steps a slot
    /// only once its prompt is done, so without it every timed step would
    /// be a refused one, measured at nearly nothing, and admission and the
    /// phase groups would price the model's steps at nothing.
    fn warm_up_prompt(&mut self, slot: usize) {
        /// Frames of prompt work per call; the empty prompt is a dozen.
        const CHUNK_FRAMES: usize = 64;
        /// Calls before giving up: far more than the empty prompt needs.
        const MAX_CHUNKS: usize = 64;
        if let Err(e) = self.model.begin_prompt(slot, &Prompt::default()) {
            eprintln!("<4>engine: warm-up prompt of slot {slot} refused: {e}");
            return;
        }
        for _ in 0..MAX_CHUNKS {
            match self.model.prompt_chunk(slot, CHUNK_FRAMES) {
                Ok(PromptProgress::Done) => return,
                Ok(PromptProgress::Pending { .. }) => {}
                Err(e) => {
                    eprintln!("<4>engine: warm-up prompt of slot {slot} failed: {e}");
                    return;
                }
            }
        }
        eprintln!("<4>engine: warm-up prompt of slot {slot} not done after {MAX_CHUNKS} chunks");
    }

    /// Runs ticks until `shared.stop` is set. Closes the doorbells on return.
    pub fn run(mut self) {
        let positions = self.grouping.positions() as u64;
        let period = Duration::from_secs_f64(crate::FRAME_MS / 1000.0 / positions as f64);
        let frame = period * positions as u32;
        let max_skip = (MAX_SLEEP_NS as f64 / period.as_nanos() as f64)
            .ceil()
            .max(1.0) as usize;
        let mut refreshed_frame = u64::MAX;
        let start = Instant::now();
        self.epoch = start;
        let mut tick: u64 = 0;
        while !self.shared.stop.load(Ordering::Acquire) {
            let deadline = start + period.mul_f64(tick as f64);
            let now = Instant::now();
            if now < deadline {
                std::thread::sleep(deadline - now);
            }
            let behind = now.saturating_duration_since(deadline);
            if behind > frame {
                let due = ((now - start).as_secs_f64() / period.as_secs_f64()) as u64;
                // Keep the rotation: jump by whole frames.
                tick += (due - tick) / positions * positions;
            }
            // Read once per tick, after the sleep: frames stamped since the
            // switch went on are stepped by a tick that records.
            let metrics_on = self.shared.metrics.enabled();
            if let Some(hook) = self.on_tick.as_mut() {
                hook(Instant::now());
            }
            let late_ms = Instant::now()
                .saturating_duration_since(deadline)
                .as_secs_f64()
                * 1e3;
            // The step-time table is refreshed once per frame period, at its
            // first tick (position 0 may be slept through).
            if tick / positions != refreshed_frame {
                refreshed_frame = tick / positions;
                self.refresh_due = true;
            }
            let position = (tick % positions) as usize;
            self.tick_with(position, late_ms, metrics_on);
            tick += self.grouping.ticks_to_next_work(position, max_skip) as u64;
        }
        self.drain_lanes(false);
        for link in &self.links {
            link.doorbell.close();
        }
    }

    /// One on-time tick at `position` (of [`Engine::positions`]): drain
    /// every lane, step the streams the plan gives this tick, send their
    /// outputs. [`Engine::run`] calls it on schedule; benches and tests call
    /// it directly (streams without a measured phase all tick at position 0
    /// while they fit its budget).
    pub fn tick(&mut self, position: u8) {
        let metrics_on = self.shared.metrics.enabled();
        self.tick_with(position as usize, 0.0, metrics_on);
    }

    /// Bounds of the prompt work per tick and of the prompt cache.
    pub fn set_prompt_bounds(
        &mut self,
        cache: super::prompts::CacheBounds,
        frames_per_tick: usize,
    ) {
        self.prompts = super::prompts::Prompts::new(self.slots.len(), cache, frames_per_tick);
    }

    /// Tick positions per frame period.
    pub fn positions(&self) -> usize {
        self.grouping.positions()
    }

    /// One tick, `late_ms` after its deadline, with the metrics switch as
    /// read at its start.
    fn tick_with(&mut self, position: usize, late_ms: f64, metrics_on: bool) {
        self.drain_lanes(metrics_on);
        self.advance_prompts();
        self.step_group(position, late_ms, metrics_on);
    }

    /// This tick's bounded prompt work; sessions whose prompt finished (or
    /// failed) are told.
    fn advance_prompts(&mut self) {
        self.prompts.advance(&mut *self.model);
        let n = self.prompts.finished().len();
        for i in 0..n {
            let (s, ok) = self.prompts.finished()[i];
            let st = self.slots[s];
            if !st.open {
                continue;
            }
            let kind = if ok {
                FromEngineKind::PromptReady
            } else {
                self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
                FromEngineKind::Fault
            };
            self.send(st.core, kind, s as u32, st.generation, 0, None);
        }
        if n > 0 {
            self.ring_touched();
        }
    }

    /// Moves every record out of the lanes: opens, frames into slot queues
    /// (with their push stamps), closes.
    fn drain_lanes(&mut self, metrics_on: bool) {
        for core in 0..self.links.len() {
            loop {
                // One record at a time: the handlers below need `&mut self`.
                let mut rec_kind = None;
                let queue_depth = self.queue_depth;
                let Engine {
                    links,
                    slots,
                    queue,
                    queue_stamps,
                    queue_completed,
                    queue_end_of_input,
                    grouping,
                    epoch,
                    ..
                } = self;
                let popped = links[core].from_core.pop_with(|rec: &ToEngine| {
                    rec_kind = Some((rec.kind, rec.slot, rec.generation));
                    if matches!(rec.kind, ToEngineKind::Frame | ToEngineKind::EndOfInput) {
                        let s = rec.slot as usize;
                        if let Some(slot) = slots.get_mut(s) {
                            if slot.open
                                && slot.generation == rec.generation
                                && slot.queue_len < queue_depth
                            {
                                let idx = (slot.queue_head + slot.queue_len) % queue_depth;
                                let at = (s * queue_depth + idx) * FRAME_SAMPLES;
                                queue[at..at + FRAME_SAMPLES].copy_from_slice(&rec.pcm);
                                queue_stamps[s * queue_depth + idx] = rec.pushed_at;
                                queue_completed[s * queue_depth + idx] = rec.completed_at;
                                if let Some(done) = rec.completed_at {
                                    let at_ns = done.saturating_duration_since(*epoch).as_nanos();
                                    grouping.frame_completed(s, at_ns as u64);
                                }
                                queue_end_of_input[s * queue_depth + idx] =
                                    rec.kind == ToEngineKind::EndOfInput;
                                slot.queue_len += 1;
                                return true;
                            }
                        }
                    }
                    false
                });
                let Some(queued) = popped else { break };
                let Some((kind, slot, generation)) = rec_kind else {
                    break;
                };
                match kind {
                    ToEngineKind::Open => self.open_slot(core, slot, generation),
                    ToEngineKind::Close => self.close_slot(slot, generation),
                    ToEngineKind::Frame | ToEngineKind::EndOfInput if !queued => {
                        self.reject_frame(core, slot, generation, metrics_on)
                    }
                    ToEngineKind::Frame | ToEngineKind::EndOfInput => {}
                }
            }
        }
        self.ring_touched();
    }

    fn open_slot(&mut self, core: usize, slot: u32, generation: u32) {
        let s = slot as usize;
        if s >= self.slots.len() {
            return;
        }
        let params = self.shared.admission().take_params(slot);
        let params = params.unwrap_or_default();
        let was_open = self.slots[s].open;
        self.slots[s] = EngineSlot {
            open: true,
            generation,
            core,
            queue_head: 0,
            queue_len: 0,
        };
        // Placed by the next plan (this tick's), phase measured from its frames.
        self.grouping.open(s);
        if !was_open {
            self.shared.open_slots.fetch_add(1, Ordering::Relaxed);
        }
        let opened = self
            .model
            .reset_slot(s, &params)
            .and_then(|()| self.prompts.open(&mut *self.model, s, &params.prompt));
        match opened {
            Err(_) => {
                self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
                self.send(core, FromEngineKind::Fault, slot, generation, 0, None);
            }
            Ok(super::prompts::Opened::FromCache) => {
                self.send(core, FromEngineKind::PromptReady, slot, generation, 0, None);
            }
            Ok(_) => {}
        }
    }

    fn close_slot(&mut self, slot: u32, generation: u32) {
        let s = slot as usize;
        let Some(st) = self.slots.get_mut(s) else {
            return;
        };
        if !st.open || st.generation != generation {
            return;
        }
        st.open = false;
        st.queue_len = 0;
        self.prompts.close(s);
        self.grouping.close(s);
        self.shared.open_slots.fetch_sub(1, Ordering::Relaxed);
        self.shared.admission().release(slot, generation);
    }

    /// A frame for a slot that is full (or stale): tell the session it was dropped.
    fn reject_frame(&mut self, core: usize, slot: u32, generation: u32, metrics_on: bool) {
        let s = slot as usize;
        if self
            .slots
            .get(s)
            .is_some_and(|st| st.open && st.generation == generation)
        {
            self.shared
                .stats
                .dropped_frames
                .fetch_add(1, Ordering::Relaxed);
            if metrics_on {
                self.stages.dropped_frame();
            }
            self.send(core, FromEngineKind::Dropped, slot, generation, 0, None);
        }
    }

    /// Plans the groups, then steps the slots the plan gives the tick at
    /// `position` (each with its oldest queued frame).
    fn step_group(&mut self, position: usize, late_ms: f64, metrics_on: bool) {
        self.refresh_step_table(position);
        let table = &self.step_table_ms;
        let step_ms = |n: usize| table[n.min(table.len() - 1)];
        let plan = self.grouping.plan(&step_ms);
        let slots = &self.slots;
        let queued = |s: usize| if slots[s].open { slots[s].queue_len } else { 0 };
        let mut count =
            self.grouping
                .select(position, late_ms, &queued, &step_ms, &mut self.batch.exec)
                as u64;
        // A slot still running its prompt keeps its frames queued.
        for (s, e) in self.batch.exec.iter_mut().enumerate() {
            if *e && self.prompts.running(s) {
                *e = false;
                count -= 1;
            }
        }
        let late = count > 0
            && late_ms
                > lateness_allowed_ms(plan.groups)
                    + crate::FRAME_MS / self.grouping.positions() as f64 / LATE_TICK_FRACTION;
        if late {
            self.shared.stats.late_ticks.fetch_add(1, Ordering::Relaxed);
            if metrics_on {
                self.stages.late_tick();
            }
        }
        // Metrics on: the moment the frames are taken into the batch.
        let taken = Instant::now();
        let fill_start = metrics_on.then_some(taken);
        self.fill_batch(position, taken, fill_start);
        if count == 0 {
            self.finish_tick(position);
            return;
        }
        self.out.late = late;
        let t = Instant::now();
        if let Some(fill_start) = fill_start {
            self.stages
                .record(Stage::BatchFill, t.saturating_duration_since(fill_start));
        }
        let whole_batch_failed = self.model.step(&mut self.batch).is_err();
        let step_time = t.elapsed();
        self.record_step(position, count, step_time, metrics_on);
        self.answer_step(whole_batch_failed);
        self.out.late = false;
        self.ring_touched();
        self.finish_tick(position);
    }

    /// Re-reads the predicted step times into `step_table_ms` when they
    /// are due (once per period, at position 0; after a refresh request;
    /// while the table has no prediction yet), and makes the grouping
    /// re-plan with them.
    #[inline]
    fn refresh_step_table(&mut self, position: usize) {
        if self.refresh_due || position == 0 || self.step_table_ms[1] == 0.0 {
            self.refresh_due = false;
            for (n, t) in self.step_table_ms.iter_mut().enumerate() {
                *t = self.shared.step_times.predict_ms(n);
            }
            self.grouping.invalidate();
        }
    }

    /// Moves each selected slot's oldest queued frame into the batch (and
    /// its end-of-input flag), recording how long it waited: in the queue
    /// (`FrameWait`, metrics on: `fill_start` is `Some`) and since the
    /// session completed it (the group board). `taken` is the moment the
    /// frames are taken. Copies only: the batch and queues are preallocated.
    #[inline]
    fn fill_batch(&mut self, position: usize, taken: Instant, fill_start: Option<Instant>) {
        for (s, st) in self.slots.iter_mut().enumerate() {
            if !self.batch.exec[s] {
                continue;
            }
            let entry = s * self.queue_depth + st.queue_head;
            let at = entry * FRAME_SAMPLES;
            self.batch.input_pcm[s * FRAME_SAMPLES..(s + 1) * FRAME_SAMPLES]
                .copy_from_slice(&self.queue[at..at + FRAME_SAMPLES]);
            self.batch.end_of_input[s] = self.queue_end_of_input[entry];
            if let Some(taken) = fill_start {
                if let Some(pushed) = self.queue_stamps[entry] {
                    self.stages
                        .record(Stage::FrameWait, taken.saturating_duration_since(pushed));
                }
            }
            if let Some(done) = self.queue_completed[entry] {
                let wait = taken.saturating_duration_since(done).as_micros() as u64;
                self.shared.groups.observe_wait(position, wait);
            }
            st.queue_head = (st.queue_head + 1) % self.queue_depth;
            st.queue_len -= 1;
        }
    }

    /// Counts a model step of `count` frames: the stage metrics (when on),
    /// the step-time predictor's sample and the engine's counters.
    #[inline]
    fn record_step(&mut self, position: usize, count: u64, step_time: Duration, metrics_on: bool) {
        if metrics_on {
            self.stages.model_step(position, count as usize, step_time);
            self.stages.frames(count);
        }
        let micros = step_time.as_micros().min(u32::MAX as u128) as u32;
        self.shared.step_times.observe(count as usize, micros);
        let stats = &self.shared.stats;
        stats.steps.fetch_add(1, Ordering::Relaxed);
        stats.frames_stepped.fetch_add(count, Ordering::Relaxed);
        stats.max_batch.fetch_max(count, Ordering::Relaxed);
        if count > 1 {
            stats.multi_stream_steps.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tells each stepped slot's session what its step gave: a fault (the
    /// whole batch's or its own, counted), output, or no output yet.
    #[inline]
    fn answer_step(&mut self, whole_batch_failed: bool) {
        for s in 0..self.slots.len() {
            if !self.batch.exec[s] {
                continue;
            }
            let st = self.slots[s];
            let fault = whole_batch_failed || self.batch.fault[s].is_some();
            let kind = if fault {
                self.shared.stats.faults.fetch_add(1, Ordering::Relaxed);
                FromEngineKind::Fault
            } else if self.batch.has_output[s] {
                FromEngineKind::Output
            } else {
                FromEngineKind::NoOutputYet
            };
            let token = self.batch.text_token[s];
            self.send(st.core, kind, s as u32, st.generation, token, Some(s));
        }
    }

    /// Frame boundaries (slots with nothing queued take their target
    /// group), then publishes the plan.
    fn finish_tick(&mut self, position: usize) {
        let slots = &self.slots;
        let queued = |s: usize| if slots[s].open { slots[s].queue_len } else { 0 };
        let moved = self
            .grouping
            .after_tick(position, &queued, &self.batch.exec);
        let board = &self.shared.groups;
        if moved > 0 {
            board.moves.fetch_add(moved as u64, Ordering::Relaxed);
        }
        // Published when it changed: most ticks on the 1 ms grid change nothing.
        if moved == 0 && self.grouping.plans() == self.published_plans {
            return;
        }
        self.published_plans = self.grouping.plans();
        board
            .in_use
            .store(self.grouping.groups() as u64, Ordering::Relaxed);
        self.grouping.sizes(&mut self.group_sizes);
        for (a, &n) in board.sessions.iter().zip(&self.group_sizes) {
            a.store(n as u64, Ordering::Relaxed);
        }
    }

    /// Pushes one record to a core; the PCM comes from the batch output of `pcm_slot`.
    fn send(
        &mut self,
        core: usize,
        kind: FromEngineKind,
        slot: u32,
        generation: u32,
        token: u32,
        pcm_slot: Option<usize>,
    ) {
        self.out.kind = kind;
        self.out.slot = slot;
        self.out.generation = generation;
        self.out.text_token = token;
        if let (Some(s), FromEngineKind::Output) = (pcm_slot, kind) {
            self.out.pcm.copy_from_slice(self.batch.output(s));
        }
        if self.links[core].to_core.try_push(&self.out).is_err() {
            self.shared
                .stats
                .lost_outputs
                .fetch_add(1, Ordering::Relaxed);
        }
        self.touched[core] = true;
    }

    fn ring_touched(&mut self) {
        for (core, t) in self.touched.iter_mut().enumerate() {
            if *t {
                self.links[core].doorbell.ring();
                *t = false;
            }
        }
    }
}
