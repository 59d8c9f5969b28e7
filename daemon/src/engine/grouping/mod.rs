//! Phase groups: which of the engine's ticks steps each stream.
//!
//! The engine ticks on a grid of `positions` ticks per 80 ms period
//! ([`MaxGroups::positions`]: 1 ms apart for `auto`). A plan uses `G`
//! groups, `G` a divisor of `positions` up to the configured maximum, evenly
//! spaced `80/G` ms apart; the engine picks the largest `G` whose groups stay
//! within budget: the sum of the step times per period within `80 − margin`
//! ms, and, steps running one after another, no group's tick pushed later
//! than [`lateness_allowed_ms`] (half the spacing, at least
//! [`MIN_LATENESS_MS`]) by the steps before it. Few streams get many small
//! steps, each close to its stream's phase; as load grows, groups merge.
//! Only occupied groups tick with work, so 80 groups of which three hold
//! streams cost three steps per period.
//!
//! * A stream with a measured phase ([`PhaseEstimator`]; until it stands,
//!   the phase of its latest frame) ticks with the group
//!   whose tick comes soonest after its frames complete (plus [`GUARD_NS`]:
//!   the tick drains the lanes as it starts). It keeps its group while that
//!   group's tick is within `80/G` ms + [`HYSTERESIS_NS`] after its phase, so
//!   jitter at a boundary does not move it back and forth.
//! * A stream without one (RTP, whose transport places its frame cut
//!   ahead of its group's tick; a WebSocket, AudioSocket or Media Streams
//!   stream before its first frame) keeps its
//!   group while that group exists; a new one joins the busiest of the
//!   [`ANCHOR_GROUPS`] evenly spaced groups that has room (batching is
//!   cheaper than another step, and those groups outlive load changes, see
//!   [`ANCHOR_GROUPS`]); one whose group
//!   merged away goes to the next group after it, so frames its transport
//!   already cut for the old tick are still complete before the new one.
//!
//! Invariants: a plan sets each stream's *target* group; its *current*
//! group (the one whose tick steps it) takes the target only at a frame
//! boundary, when the stream has no frame queued
//! ([`Grouping::frame_boundary`]). The slot never moves, and each tick steps
//! a slot at most once with the oldest frame of its queue, so a move loses,
//! repeats or reorders nothing and a stream's outputs do not depend on it.
//! Planning allocates nothing (scratch is sized at construction).

use super::phase::{PhaseEstimator, PERIOD_NS};

/// Grid positions per period when the number of groups is `auto` (1 ms
/// apart: a lone stream's frame waits at most a millisecond for its tick,
/// beyond [`GUARD_NS`]; planning at every tick costs a few microseconds).
pub const AUTO_POSITIONS: usize = 80;
/// Streams without a measured phase (RTP, whose jitter buffer releases its
/// frames locked to their group's tick) are placed on the positions of this many
/// evenly spaced groups, and `auto` only uses group counts whose grid keeps
/// those positions or merges them whole, so such a group stays where its
/// transports locked on while load changes (down to this many groups).
pub const ANCHOR_GROUPS: usize = 4;
/// The most positions a fixed maximum may ask for.
pub const MAX_FIXED_GROUPS: usize = 4;
/// A group's tick must come at least this long after a frame's completion
/// (the core pushes the frame into its lane within microseconds of its
/// completion stamp; the tick drains the lanes as it starts).
pub const GUARD_NS: u64 = 500_000;
/// How much farther than `80/G` ms a stream's group may tick after its phase
/// before the stream moves to an earlier group.
pub const HYSTERESIS_NS: u64 = 1_000_000;
/// How late a group's tick may start because the steps before it run on,
/// with `groups` groups: half their spacing, and at least
/// [`MIN_LATENESS_MS`], in milliseconds.
pub fn lateness_allowed_ms(groups: usize) -> f64 {
    (PERIOD_NS as f64 / 1e6 / groups.max(1) as f64 / 2.0).max(MIN_LATENESS_MS)
}

/// The least lateness allowed, in milliseconds: on a 1 ms grid, half the
/// spacing (0.5 ms) is less than one step of the smallest batch, so two
/// streams on neighbouring ticks could never both be stepped on time; and a
/// sleeping thread wakes up to a few hundred microseconds late.
pub const MIN_LATENESS_MS: f64 = 1.0;

/// How long after its group's tick a frame that missed it (a jitter spike
/// past the stream's phase) may still be stepped by another tick with room,
/// instead of waiting a whole period: on the 1 ms grid a late frame rarely
/// arrives before the very next tick.
pub const CATCH_UP_NS: u64 = 5_000_000;

/// No group assigned (scratch marker).
const NONE: u8 = u8::MAX;

/// How many phase groups the engine may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxGroups {
    /// As many as load allows, up to [`AUTO_POSITIONS`].
    Auto,
    /// At most this many (1..=[`MAX_FIXED_GROUPS`]).
    Fixed(usize),
}

impl MaxGroups {
    /// The most groups a plan may use.
    pub fn max(self) -> usize {
        match self {
            MaxGroups::Auto => AUTO_POSITIONS,
            MaxGroups::Fixed(n) => n.clamp(1, MAX_FIXED_GROUPS),
        }
    }

    /// Tick positions per period: [`AUTO_POSITIONS`] for `auto`, four per
    /// group otherwise (the ticks between groups' ticks step only streams
    /// that are behind, so a backlog drains even with one group).
    pub fn positions(self) -> usize {
        match self {
            MaxGroups::Auto => AUTO_POSITIONS,
            MaxGroups::Fixed(_) => 4 * self.max(),
        }
    }
}

impl serde::Serialize for MaxGroups {
    /// A number, or `"auto"`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            MaxGroups::Auto => s.serialize_str("auto"),
            MaxGroups::Fixed(n) => s.serialize_u64(*n as u64),
        }
    }
}

impl From<usize> for MaxGroups {
    /// A fixed maximum of `n` groups.
    fn from(n: usize) -> Self {
        MaxGroups::Fixed(n)
    }
}

impl std::str::FromStr for MaxGroups {
    type Err = String;

    /// `auto` or a number of groups (checked by the config's validation).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(MaxGroups::Auto);
        }
        s.parse()
            .map(MaxGroups::Fixed)
            .map_err(|_| format!("phase groups must be a number 1..=4 or \"auto\", not {s:?}"))
    }
}

impl std::fmt::Display for MaxGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxGroups::Auto => f.write_str("auto"),
            MaxGroups::Fixed(n) => write!(f, "{n}"),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct SlotGroup {
    open: bool,
    estimator: PhaseEstimator,
    /// The group whose tick steps the slot now.
    current: u8,
    /// The group the plan wants it in.
    target: u8,
    /// Its group ticked and left a frame queued, or found none: any tick with
    /// room may step it (see [`Grouping::after_tick`]).
    behind: bool,
    /// Ticks left in which a frame that missed its group's tick may still be
    /// caught up ([`CATCH_UP_NS`]).
    catch_up_ticks: u8,
}

/// The plan's outcome, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanSummary {
    /// Groups in use.
    pub groups: usize,
    /// Whether every group is within its budget (false only when even one
    /// group is over, which admission prevents).
    pub within_budget: bool,
    /// Whether it fits even while moves are under way (false: a group may
    /// run over until the moving streams reach their frame boundaries).
    pub while_moving: bool,
}

/// Every slot's group and phase.
pub struct Grouping {
    positions: usize,
    /// Group counts a plan may use (divisors of `positions`), largest first.
    candidates: Vec<usize>,
    slots: Vec<SlotGroup>,
    groups: usize,
    within_budget: bool,
    /// `1 − margin / period`: the share of a gap a step may use.
    budget_share: f64,
    assign: Vec<u8>,
    /// The group count `assign` was made for.
    assign_groups: usize,
    counts: Vec<usize>,
    union: Vec<usize>,
    /// Whether the next plan must be made afresh.
    dirty: bool,
    /// Plans made (so the engine publishes a plan once).
    plans: u64,
    /// The plan in effect.
    summary: PlanSummary,
}

/// How a plan was found to fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// With moves still under way.
    WhileMoving,
    /// Once moves are done (until then a group may run over).
    Settled,
    /// Not even as one group.
    Over,
}

/// Forward distance on the period's circle from `from_ns` to `to_ns`.
fn ahead_ns(from_ns: u64, to_ns: u64) -> u64 {
    (to_ns + PERIOD_NS - from_ns % PERIOD_NS) % PERIOD_NS
}

impl Grouping {
    /// Groups for `max_slots` slots over up to `max` groups; a step may use
    /// a gap less `margin_ms` per period.
    pub fn new(max_slots: usize, max: MaxGroups, margin_ms: f64) -> Self {
        let positions = max.positions();
        // Positions are `u8` in the slots and bits of a `u128` in `gap_after_ms`.
        assert!((1..=128).contains(&positions), "{positions} positions");
        let anchor_stride = positions / max.max().min(ANCHOR_GROUPS);
        let candidates = (1..=max.max())
            .rev()
            .filter(|g| positions.is_multiple_of(*g))
            .filter(|g| {
                // With a fixed maximum every group is an anchor already.
                let stride = positions / g;
                max != MaxGroups::Auto
                    || anchor_stride.is_multiple_of(stride)
                    || stride.is_multiple_of(anchor_stride)
            })
            .collect();
        Grouping {
            positions,
            candidates,
            slots: vec![SlotGroup::default(); max_slots],
            groups: max.max(),
            within_budget: true,
            budget_share: (1.0 - margin_ms / (PERIOD_NS as f64 / 1e6)).clamp(0.0, 1.0),
            assign: vec![NONE; max_slots],
            assign_groups: 0,
            counts: vec![0; positions],
            union: vec![0; positions],
            dirty: true,
            plans: 0,
            summary: PlanSummary {
                groups: max.max(),
                within_budget: true,
                while_moving: true,
            },
        }
    }

    /// How many plans were made afresh (see [`Grouping::plan`]).
    pub fn plans(&self) -> u64 {
        self.plans
    }

    /// Tick positions per period.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// Offset of `position`'s tick in the period, in nanoseconds.
    pub fn position_ns(&self, position: usize) -> u64 {
        position as u64 * PERIOD_NS / self.positions as u64
    }

    /// Groups in the plan in effect.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Whether the plan in effect keeps every group within its budget.
    pub fn within_budget(&self) -> bool {
        self.within_budget
    }

    /// A session starts in `slot`: no phase yet; the next plan places it.
    pub fn open(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            *s = SlotGroup {
                open: true,
                current: NONE,
                target: NONE,
                ..SlotGroup::default()
            };
            self.dirty = true;
        }
    }

    /// The session in `slot` ended.
    pub fn close(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.open = false;
            self.dirty = true;
        }
    }

    /// A frame of `slot` became complete at `at_ns` on the engine's clock.
    /// The next [`Grouping::plan`] is made afresh only if the slot's phase
    /// no longer keeps it in its target group.
    pub fn frame_completed(&mut self, slot: usize, at_ns: u64) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.estimator.observe(at_ns);
        let s = *s;
        if !self.keeps_target(&s) {
            self.dirty = true;
        }
    }

    /// The step-time model changed (or may have): the next
    /// [`Grouping::plan`] is made afresh.
    pub fn invalidate(&mut self) {
        self.dirty = true;
    }

    /// Whether the plan in effect would keep `slot` in its target group.
    fn keeps_target(&self, slot: &SlotGroup) -> bool {
        match slot.estimator.provisional_ns() {
            Some(phase) => self.keeps(slot, phase, self.groups.max(1)),
            None => slot.target != NONE,
        }
    }

    /// Whether a plan of `g` groups keeps a slot with phase `phase_ns` in its
    /// target group: the group exists in that plan and ticks within its
    /// spacing plus [`HYSTERESIS_NS`] after the slot's frames are ready.
    fn keeps(&self, slot: &SlotGroup, phase_ns: u64, g: usize) -> bool {
        slot.target != NONE
            && (slot.target as usize).is_multiple_of(self.positions / g)
            && ahead_ns(phase_ns + GUARD_NS, self.position_ns(slot.target as usize))
                <= PERIOD_NS / g as u64 + HYSTERESIS_NS
    }

    /// The position whose tick steps `slot` now (`None` before its first plan).
    pub fn group_of(&self, slot: usize) -> Option<usize> {
        let s = self.slots.get(slot)?;
        (s.open && s.current != NONE).then_some(s.current as usize)
    }

    /// The position the plan wants `slot` in.
    pub fn target_of(&self, slot: usize) -> Option<usize> {
        let s = self.slots.get(slot)?;
        (s.open && s.target != NONE).then_some(s.target as usize)
    }

    /// The slot's phase, if measured.
    pub fn phase_ns(&self, slot: usize) -> Option<u64> {
        let s = self.slots.get(slot)?;
        s.open.then(|| s.estimator.phase_ns()).flatten()
    }

    /// After the tick at `position` stepped its batch (`stepped[slot]`): a
    /// slot with nothing queued is at a frame boundary and takes its target
    /// group (returns how many moved). A slot of this group that is behind
    /// may be stepped by any tick with room until its queue is empty: one
    /// that still has a frame queued (a burst at connect, a stall), or one
    /// whose frame missed this tick (a jitter spike past its phase; for the
    /// ticks of the next [`CATCH_UP_NS`]), so that frame does not wait a
    /// whole period.
    pub fn after_tick(
        &mut self,
        position: usize,
        queued: &dyn Fn(usize) -> usize,
        stepped: &[bool],
    ) -> usize {
        let tick_ns = PERIOD_NS / self.positions as u64;
        let window = CATCH_UP_NS.div_ceil(tick_ns).clamp(1, u8::MAX as u64) as u8;
        let mut moved = 0;
        for (s, slot) in self.slots.iter_mut().enumerate() {
            if !slot.open {
                continue;
            }
            let own = slot.current as usize == position;
            if queued(s) == 0 {
                if own && !stepped[s] {
                    // Its frame missed the tick: catch it up for a while.
                    slot.behind = true;
                    slot.catch_up_ticks = window;
                } else if stepped[s] || slot.catch_up_ticks <= 1 {
                    slot.behind = false;
                    slot.catch_up_ticks = 0;
                } else {
                    slot.catch_up_ticks -= 1;
                }
                moved += (slot.current != slot.target) as usize;
                slot.current = slot.target;
            } else if own {
                // A backlog: behind until the queue is empty.
                slot.behind = true;
            }
        }
        // The moves done change what fits while moving: plan again.
        self.dirty |= moved > 0;
        moved
    }

    /// Which slots the tick at `position` steps (written to `exec`; returns
    /// how many): every slot of the group with a frame queued
    /// (`queued(slot)` frames), then, while the batch (started `late_ms`
    /// after its deadline) still ends within its share of the gap to the next
    /// tick that could step anything plus half that tick's allowed lateness,
    /// slots of other groups that are behind ([`Grouping::after_tick`]). A backlog (a burst at
    /// connect, a stall) thus drains instead of adding a period to every
    /// later frame.
    pub fn select(
        &self,
        position: usize,
        late_ms: f64,
        queued: &dyn Fn(usize) -> usize,
        step_ms: &dyn Fn(usize) -> f64,
        exec: &mut [bool],
    ) -> usize {
        let mut count = 0;
        for (s, slot) in self.slots.iter().enumerate() {
            let run = slot.open && slot.current as usize == position && queued(s) > 0;
            exec[s] = run;
            count += run as usize;
        }
        // A catch-up may spend half of the next tick's allowed lateness
        // (worked out only when a slot is behind: most ticks have none).
        let mut room_ms = None;
        for (s, slot) in self.slots.iter().enumerate() {
            if exec[s] || !slot.open || !slot.behind || queued(s) == 0 {
                continue;
            }
            let room_ms = *room_ms.get_or_insert_with(|| {
                self.gap_after_ms(position) * self.budget_share
                    + lateness_allowed_ms(self.groups) / 2.0
                    - late_ms
            });
            if step_ms(count + 1) <= room_ms {
                exec[s] = true;
                count += 1;
            }
        }
        count
    }

    /// How many ticks after `position` the next one with possible work comes,
    /// at most `max_ticks`: the next tick of any open slot's current or
    /// target group; the very next tick while a slot is behind (its frame
    /// may be caught up by any tick) or not yet placed. The engine sleeps
    /// through the ticks in between (on the 1 ms grid, waking a thread a
    /// thousand times a second costs a few percent of a core for nothing).
    pub fn ticks_to_next_work(&self, position: usize, max_ticks: usize) -> usize {
        let catching_up = self
            .slots
            .iter()
            .any(|s| s.open && (s.behind || s.current == NONE || s.target == NONE));
        if catching_up {
            return 1;
        }
        self.ticks_to_next_group(position, max_ticks.clamp(1, self.positions))
    }

    /// Ticks from `position` to the next position that is any open slot's
    /// current or target group, at most `max_ticks`.
    fn ticks_to_next_group(&self, position: usize, max_ticks: usize) -> usize {
        // One bit per position (at most 128: asserted at construction).
        let mut mask = 0u128;
        for s in self.slots.iter().filter(|s| s.open) {
            for g in [s.current, s.target] {
                if g != NONE {
                    mask |= 1 << g;
                }
            }
        }
        (1..=max_ticks)
            .find(|d| mask & (1 << ((position + d) % self.positions)) != 0)
            .unwrap_or(max_ticks)
    }

    /// Time from `position`'s tick to the next tick that could step a slot
    /// (any open slot's current or target group), in milliseconds.
    pub fn gap_after_ms(&self, position: usize) -> f64 {
        let gap = self.ticks_to_next_group(position, self.positions);
        gap as f64 * PERIOD_NS as f64 / 1e6 / self.positions as f64
    }

    /// The share of a gap a step may use.
    pub fn budget_share(&self) -> f64 {
        self.budget_share
    }

    /// Sessions whose target is each position (`out[p]`).
    pub fn sizes(&self, out: &mut [usize]) {
        out.iter_mut().for_each(|x| *x = 0);
        for s in self.slots.iter().filter(|s| s.open && s.target != NONE) {
            if let Some(x) = out.get_mut(s.target as usize) {
                *x += 1;
            }
        }
    }

    /// Chooses the groups and every open slot's target, given the predicted
    /// step time of a batch of `n` (`step_ms(n)`). Slots placed for the first
    /// time take their target at once (they have nothing queued).
    ///
    /// Unless something changed since the last plan (a session opened or
    /// closed, a phase left its group's window, a move completed,
    /// [`Grouping::invalidate`]), it returns the plan in effect without
    /// redoing it: with a tick every millisecond, most ticks change nothing.
    pub fn plan(&mut self, step_ms: &dyn Fn(usize) -> f64) -> PlanSummary {
        if !self.dirty {
            return self.summary;
        }
        self.dirty = false;
        self.plans += 1;
        // The most groups whose plan fits while the moves that wait for a
        // frame boundary are under way (those streams still tick with their
        // current groups); else the most whose plan fits once they are done;
        // else one group.
        let mut chosen = None;
        for pass in [Fit::WhileMoving, Fit::Settled] {
            for i in 0..self.candidates.len() {
                let g = self.candidates[i];
                self.assign_for(g, step_ms);
                if self.fits(pass, step_ms) {
                    chosen = Some((g, pass));
                    break;
                }
            }
            if chosen.is_some() {
                break;
            }
        }
        let (g, fit) = chosen.unwrap_or((1, Fit::Over));
        if self.assign_groups != g {
            self.assign_for(g, step_ms);
        }
        for s in 0..self.slots.len() {
            let a = self.assign[s];
            if !self.slots[s].open {
                continue;
            }
            let at_once = self.moves_at_once(s, a);
            let slot = &mut self.slots[s];
            slot.target = a;
            if at_once {
                slot.current = a;
            }
        }
        self.groups = g;
        self.within_budget = fit != Fit::Over;
        self.summary = PlanSummary {
            groups: g,
            within_budget: self.within_budget,
            while_moving: fit == Fit::WhileMoving,
        };
        self.summary
    }

    /// Fills `assign` and `counts` for `g` groups.
    fn assign_for(&mut self, g: usize, step_ms: &dyn Fn(usize) -> f64) {
        self.assign_groups = g;
        let stride = self.positions / g;
        self.counts.iter_mut().for_each(|c| *c = 0);
        // Measured phases, and unmeasured slots whose group still exists.
        for (s, slot) in self.slots.iter().enumerate() {
            self.assign[s] = NONE;
            if !slot.open {
                continue;
            }
            let in_plan = slot.target != NONE && (slot.target as usize).is_multiple_of(stride);
            let a = if let Some(phase) = slot.estimator.provisional_ns() {
                if self.keeps(slot, phase, g) {
                    slot.target
                } else {
                    self.soonest_at_or_after(phase + GUARD_NS, g)
                }
            } else if in_plan {
                slot.target
            } else if slot.target != NONE {
                // Its group merged away: the next group after it.
                self.soonest_at_or_after(self.position_ns(slot.target as usize), g)
            } else {
                continue;
            };
            self.assign[s] = a;
            self.counts[a as usize] += 1;
        }
        // New slots without a phase join an anchor group (those of the plan's
        // positions that are on the anchor grid; position 0 always is): the
        // busiest whose step still fits the anchors' spacing, else the least
        // loaded. The plan's fit then decides how many groups there are.
        let anchors = g.min(ANCHOR_GROUPS);
        let room_ms = PERIOD_NS as f64 / 1e6 / anchors as f64 * self.budget_share;
        let anchor_stride = self.positions / anchors;
        for s in 0..self.slots.len() {
            if !self.slots[s].open || self.assign[s] != NONE {
                continue;
            }
            let counts = &self.counts;
            // `stride` divides `anchor_stride` (see the candidates in `new`).
            let anchors = (0..self.positions).step_by(anchor_stride);
            let with_room = anchors
                .clone()
                .filter(|&p| step_ms(counts[p] + 1) <= room_ms)
                .max_by_key(|&p| (counts[p], std::cmp::Reverse(p)));
            let p = with_room.unwrap_or_else(|| {
                anchors
                    .min_by_key(|&p| (counts[p], p))
                    .expect("position 0 is an anchor")
            });
            self.assign[s] = p as u8;
            self.counts[p] += 1;
        }
    }

    /// Whether the assignment keeps every occupied group's step within its
    /// share of the gap to the next occupied group: once the streams are in
    /// the groups they move to (`Settled`), and also while the moves that
    /// wait for a frame boundary are under way (`WhileMoving`).
    ///
    /// While moving, each moving stream may be in either of its two groups,
    /// each independently of the others, so each is counted in both (an
    /// upper bound on every mix). With a single moving stream the only
    /// states are before and after its move, checked exactly: counted in
    /// both, a lone stream moving between neighbouring ticks would look like
    /// two steps 1 ms apart, though it is stepped once per period.
    fn fits(&mut self, fit: Fit, step_ms: &dyn Fn(usize) -> f64) -> bool {
        let settled = Self::fits_counts(
            &self.counts,
            self.positions,
            self.budget_share,
            self.assign_groups,
            step_ms,
        );
        if fit == Fit::Settled || !settled {
            return settled;
        }
        self.union.copy_from_slice(&self.counts);
        let mut movers = 0;
        let mut last_move = (0, 0);
        for (slot, &a) in self.slots.iter().zip(&self.assign) {
            if slot.open && slot.current != a && !self.moves_at_once_for(slot, a) {
                self.union[slot.current as usize] += 1;
                movers += 1;
                last_move = (a as usize, slot.current as usize);
            }
        }
        if movers == 1 {
            // Before the move: in its current group only.
            self.union[last_move.0] -= 1;
        }
        Self::fits_counts(
            &self.union,
            self.positions,
            self.budget_share,
            self.assign_groups,
            step_ms,
        )
    }

    /// Whether groups of `counts` sessions per position (`groups` groups in
    /// the plan) fit: the steps' sum within the period's share, and no tick
    /// pushed later than allowed by the steps before it.
    fn fits_counts(
        counts: &[usize],
        positions: usize,
        budget_share: f64,
        groups: usize,
        step_ms: &dyn Fn(usize) -> f64,
    ) -> bool {
        let occupied = |p: usize| counts[p] > 0;
        let period_ms = PERIOD_NS as f64 / 1e6;
        let tick_ms = period_ms / positions as f64;
        let total_ms: f64 = (0..positions)
            .filter(|&p| occupied(p))
            .map(|p| step_ms(counts[p]))
            .sum();
        if total_ms > period_ms * budget_share {
            return false;
        }
        // Steps run one after another: a group's tick starts when both its
        // time has come and the step before it is done. Two rounds reach the
        // steady state (the steps fit a period, so each round has idle time).
        let allowed_ms = lateness_allowed_ms(groups);
        let mut end_ms = f64::NEG_INFINITY;
        for round in 0..2 {
            for p in (0..positions).filter(|&p| occupied(p)) {
                let tick = (round * positions + p) as f64 * tick_ms;
                let start = end_ms.max(tick);
                if round == 1 && start - tick > allowed_ms {
                    return false;
                }
                end_ms = start + step_ms(counts[p]);
            }
        }
        true
    }

    /// Whether `slot` may take group `a` at once rather than at its next
    /// frame boundary: a new slot; one without a measured phase (it only
    /// moves when its group merged away, to the next group after it); one
    /// whose new group ticks no sooner after its phase than its current one
    /// (a frame it has queued is still complete before the new tick, and is
    /// stepped once, in order).
    fn moves_at_once(&self, slot: usize, a: u8) -> bool {
        self.moves_at_once_for(&self.slots[slot], a)
    }

    fn moves_at_once_for(&self, slot: &SlotGroup, a: u8) -> bool {
        if slot.current == NONE || slot.current == a {
            return true;
        }
        let Some(phase) = slot.estimator.provisional_ns() else {
            return true;
        };
        let ready_ns = phase + GUARD_NS;
        ahead_ns(ready_ns, self.position_ns(a as usize))
            >= ahead_ns(ready_ns, self.position_ns(slot.current as usize))
    }

    /// The first of `g` groups whose tick is at or after `at_ns` (mod period).
    fn soonest_at_or_after(&self, at_ns: u64, g: usize) -> u8 {
        let spacing_ns = PERIOD_NS / g as u64;
        let k = (at_ns % PERIOD_NS).div_ceil(spacing_ns) as usize % g;
        (k * (self.positions / g)) as u8
    }
}

#[cfg(test)]
mod tests;
