//! Admission: which slot a new session gets, or why it is refused, and the
//! capacity that is published for load balancers.
//!
//! Which group's tick steps a stream is the engine's choice
//! ([`super::grouping`]): it follows the stream's phase, measured once its
//! frames flow, and merges groups as load grows. A new stream is priced by
//! the group it could have to join and by the steps of a whole period: the
//! engine can always fall back to one group, so it is admitted while one
//! group of every stream, it included, steps within the period's budget
//! (`80 ms − engine.budget_margin_ms`).
//!
//! Invariants: a slot is in exactly one of two states, free (in `free`) or
//! held (by a session, from `admit` until the engine has processed the
//! session's close and called `release`). A slot is handed out again only
//! after `release`, so no record of an old session can reach a new one (the
//! generation check is the second line of defence). The table is touched
//! once per session start and end, never per frame; a mutex guards it.

use super::step_times::StepTimes;
use super::GroupBoard;
use moshid_model::streaming::SessionParams;
use serde::Serialize;
use std::sync::atomic::Ordering;

/// A granted admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The slot.
    pub slot: u32,
    /// Its new generation.
    pub generation: u32,
}

/// Why a session was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The daemon is shutting down or not ready.
    NotAccepting,
    /// Every slot is held.
    NoFreeSlot,
    /// The steps of a period would not stay within budget.
    OverBudget {
        /// The predicted step time of every stream, this one included, as
        /// one group.
        predicted_ms: f64,
        /// The budget of a period's steps.
        budget_ms: f64,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NotAccepting => f.write_str("server not accepting sessions (starting or draining)"),
            Refusal::NoFreeSlot => f.write_str("server full: every stream slot is in use"),
            Refusal::OverBudget {
                predicted_ms,
                budget_ms,
            } => write!(
                f,
                "server full: one more stream would need {predicted_ms:.1} ms of steps per frame, over the {budget_ms:.1} ms budget"
            ),
        }
    }
}

/// One phase group's load, as published on `/capacity`.
#[derive(Debug, Clone, Serialize)]
pub struct GroupCapacity {
    /// Group index (0..groups in use).
    pub group: usize,
    /// Its tick's offset in the 80 ms period, in milliseconds.
    pub phase_ms: f64,
    /// Sessions ticking with it.
    pub sessions: usize,
    /// Measured wait of its frames from completion to the step (moving
    /// average; 0 before any frame with a completion time).
    pub wait_ms: f64,
    /// Predicted step time now, in milliseconds.
    pub predicted_step_ms: f64,
    /// Predicted step time with one more session, in milliseconds.
    pub predicted_step_ms_next: f64,
    /// Whether one more session fits (in this group, or merged).
    pub admits_one_more: bool,
}

/// The capacity snapshot served on `/capacity`.
#[derive(Debug, Clone, Serialize)]
pub struct Capacity {
    /// Slots the model was built for.
    pub max_slots: usize,
    /// Slots not held.
    pub free_slots: usize,
    /// Sessions admitted and not yet released.
    pub active_sessions: usize,
    /// Step-time budget of a period (all groups), in milliseconds.
    pub budget_ms: f64,
    /// The most groups (`"auto"` or a number).
    pub max_groups: String,
    /// Groups in use now.
    pub groups_in_use: usize,
    /// Predicted step time of all groups per period, in milliseconds.
    pub predicted_period_ms: f64,
    /// Streams moved from one group to another since start.
    pub group_moves: u64,
    /// Whether new sessions are admitted at all.
    pub accepting: bool,
    /// How many more sessions would be admitted now (by slots and budget).
    pub admissible_sessions: usize,
    /// Per group.
    pub groups: Vec<GroupCapacity>,
    /// Sessions admitted since start.
    pub admitted_total: u64,
    /// Sessions refused since start.
    pub refused_total: u64,
}

/// The slot table.
pub struct AdmissionTable {
    free: Vec<u32>,
    generation: Vec<u32>,
    held: Vec<bool>,
    held_count: usize,
    params: Vec<Option<SessionParams>>,
    accepting: bool,
    admitted_total: u64,
    refused_total: u64,
}

impl AdmissionTable {
    /// A table of `max_slots` free slots, not yet accepting.
    pub fn new(max_slots: usize) -> Self {
        AdmissionTable {
            // Lowest slots first, so a quiet daemon keeps using the same ones.
            free: (0..max_slots as u32).rev().collect(),
            generation: vec![0; max_slots],
            held: vec![false; max_slots],
            held_count: 0,
            params: vec![None; max_slots],
            accepting: false,
            admitted_total: 0,
            refused_total: 0,
        }
    }

    /// Opens or closes admission (ready after warm-up; closed when draining).
    pub fn set_accepting(&mut self, accepting: bool) {
        self.accepting = accepting;
    }

    /// Whether admission is open.
    pub fn accepting(&self) -> bool {
        self.accepting
    }

    /// Admits a session if a slot is free and a group stays within budget.
    pub fn admit(
        &mut self,
        params: SessionParams,
        times: &StepTimes,
        budget_ms: f64,
    ) -> Result<Ticket, Refusal> {
        let r = self.try_admit(params, times, budget_ms);
        match r {
            Ok(_) => self.admitted_total += 1,
            Err(_) => self.refused_total += 1,
        }
        r
    }

    fn try_admit(
        &mut self,
        params: SessionParams,
        times: &StepTimes,
        budget_ms: f64,
    ) -> Result<Ticket, Refusal> {
        if !self.accepting {
            return Err(Refusal::NotAccepting);
        }
        if self.free.is_empty() {
            return Err(Refusal::NoFreeSlot);
        }
        // One group of every stream, this one included, must fit a period:
        // the engine can always merge down to it.
        let predicted = times.predict_ms(self.held_count + 1);
        if predicted > budget_ms {
            return Err(Refusal::OverBudget {
                predicted_ms: predicted,
                budget_ms,
            });
        }
        let slot = self.free.pop().expect("checked non-empty");
        let s = slot as usize;
        self.generation[s] = self.generation[s].wrapping_add(1);
        self.held[s] = true;
        self.held_count += 1;
        self.params[s] = Some(params);
        Ok(Ticket {
            slot,
            generation: self.generation[s],
        })
    }

    /// The parameters of a newly admitted session (taken by the engine when
    /// it opens the slot).
    pub fn take_params(&mut self, slot: u32) -> Option<SessionParams> {
        self.params.get_mut(slot as usize)?.take()
    }

    /// Returns a slot after the engine has processed its session's close.
    /// Ignores a stale or repeated release.
    pub fn release(&mut self, slot: u32, generation: u32) -> bool {
        let s = slot as usize;
        if s >= self.held.len() || !self.held[s] || self.generation[s] != generation {
            return false;
        }
        self.held[s] = false;
        self.held_count -= 1;
        self.params[s] = None;
        self.free.push(slot);
        true
    }

    /// Sessions held.
    pub fn active(&self) -> usize {
        self.held_count
    }

    /// Parameters still waiting for the engine (test and leak checks).
    pub fn pending_params(&self) -> usize {
        self.params.iter().filter(|p| p.is_some()).count()
    }

    /// The snapshot served on `/capacity`: the groups as the engine last
    /// planned them (`board`).
    pub fn capacity(&self, times: &StepTimes, budget_ms: f64, board: &GroupBoard) -> Capacity {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let in_use = (load(&board.in_use) as usize).clamp(1, board.positions);
        let stride = board.positions / in_use;
        // One more session fits while every stream as one group does.
        let admits_one_more =
            self.held_count < self.held.len() && times.predict_ms(self.held_count + 1) <= budget_ms;
        let groups: Vec<GroupCapacity> = (0..in_use)
            .map(|g| {
                let p = g * stride;
                let sessions = load(&board.sessions[p]) as usize;
                GroupCapacity {
                    group: g,
                    phase_ms: crate::FRAME_MS * p as f64 / board.positions as f64,
                    sessions,
                    wait_ms: load(&board.wait_us[p]) as f64 / 1000.0,
                    predicted_step_ms: times.predict_ms(sessions),
                    predicted_step_ms_next: times.predict_ms(sessions + 1),
                    admits_one_more,
                }
            })
            .collect();
        let predicted_period_ms = groups.iter().map(|g| g.predicted_step_ms).sum();
        // Sessions that could still join within budget, capped by free slots.
        let mut by_budget = 0;
        while self.held_count + by_budget < times.max_slots()
            && times.predict_ms(self.held_count + by_budget + 1) <= budget_ms
        {
            by_budget += 1;
        }
        Capacity {
            max_slots: self.held.len(),
            free_slots: self.free.len(),
            active_sessions: self.active(),
            budget_ms,
            max_groups: board.max.to_string(),
            groups_in_use: in_use,
            predicted_period_ms,
            group_moves: load(&board.moves),
            accepting: self.accepting,
            admissible_sessions: if self.accepting {
                by_budget.min(self.free.len())
            } else {
                0
            },
            groups,
            admitted_total: self.admitted_total,
            refused_total: self.refused_total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(per_stream_us: u32, max: usize) -> StepTimes {
        let t = StepTimes::new(max);
        for b in 1..=max {
            t.set(b, per_stream_us * b as u32);
        }
        t
    }

    fn board() -> GroupBoard {
        GroupBoard::new(super::super::grouping::MaxGroups::Fixed(2))
    }

    #[test]
    fn admits_until_slots_run_out() {
        let t = times(1000, 4);
        let mut a = AdmissionTable::new(4);
        assert_eq!(
            a.admit(SessionParams::default(), &t, 30.0),
            Err(Refusal::NotAccepting)
        );
        a.set_accepting(true);
        let slots: Vec<u32> = (0..4)
            .map(|_| a.admit(SessionParams::default(), &t, 30.0).unwrap().slot)
            .collect();
        assert_eq!(slots, vec![0, 1, 2, 3]);
        assert_eq!(
            a.admit(SessionParams::default(), &t, 30.0),
            Err(Refusal::NoFreeSlot)
        );
        let c = a.capacity(&t, 30.0, &board());
        assert_eq!(
            (c.free_slots, c.active_sessions, c.refused_total),
            (0, 4, 2)
        );
        assert_eq!((c.max_groups.as_str(), c.groups.len()), ("2", 2));
    }

    #[test]
    fn refuses_when_one_group_of_every_stream_is_over_the_period_budget() {
        let t = times(10_000, 8);
        let mut a = AdmissionTable::new(8);
        a.set_accepting(true);
        for _ in 0..3 {
            a.admit(SessionParams::default(), &t, 35.0).unwrap();
        }
        let r = a.admit(SessionParams::default(), &t, 35.0).unwrap_err();
        assert!(matches!(r, Refusal::OverBudget { .. }), "{r:?}");
        assert!(r.to_string().contains("40.0 ms"));
        let c = a.capacity(&t, 35.0, &board());
        assert_eq!(c.admissible_sessions, 0);
        assert!(!c.groups[0].admits_one_more);
    }

    #[test]
    fn release_returns_the_slot_once_with_a_new_generation() {
        let t = times(1, 1);
        let mut a = AdmissionTable::new(1);
        a.set_accepting(true);
        let first = a.admit(SessionParams::default(), &t, 70.0).unwrap();
        assert!(a.take_params(first.slot).is_some());
        assert!(!a.release(first.slot, first.generation + 1));
        assert!(a.release(first.slot, first.generation));
        assert!(!a.release(first.slot, first.generation));
        let second = a.admit(SessionParams::default(), &t, 70.0).unwrap();
        assert_eq!(second.slot, first.slot);
        assert_ne!(second.generation, first.generation);
    }
}
