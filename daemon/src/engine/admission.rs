//! Admission: which slot and phase group a new session gets, or why it is
//! refused, and the capacity that is published for load balancers.
//!
//! Invariants: a slot is in exactly one of two states, free (in `free`) or
//! held (by a session, from `admit` until the engine has processed the
//! session's close and called `release`). A slot is handed out again only
//! after `release`, so no record of an old session can reach a new one (the
//! generation check is the second line of defence). The table is touched
//! once per session start and end, never per frame; a mutex guards it.

use super::step_times::StepTimes;
use moshid_model::streaming::SessionParams;
use serde::Serialize;

/// A granted admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The slot.
    pub slot: u32,
    /// Its new generation.
    pub generation: u32,
    /// The phase group it ticks with.
    pub group: u8,
}

/// Why a session was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The daemon is shutting down or not ready.
    NotAccepting,
    /// Every slot is held.
    NoFreeSlot,
    /// No phase group would stay within its step-time budget.
    OverBudget {
        /// The best predicted step time with this stream added.
        predicted_ms: f64,
        /// The budget per group.
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
                "server full: one more stream would need a {predicted_ms:.1} ms step, over the {budget_ms:.1} ms budget"
            ),
        }
    }
}

/// One phase group's load, as published on `/capacity`.
#[derive(Debug, Clone, Serialize)]
pub struct GroupCapacity {
    /// Group index.
    pub group: usize,
    /// Sessions ticking with it.
    pub sessions: usize,
    /// Predicted step time now, in milliseconds.
    pub predicted_step_ms: f64,
    /// Predicted step time with one more session, in milliseconds.
    pub predicted_step_ms_next: f64,
    /// Whether one more session fits.
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
    /// Step-time budget per group, in milliseconds.
    pub budget_ms: f64,
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
    group_of: Vec<u8>,
    held: Vec<bool>,
    group_load: Vec<usize>,
    params: Vec<Option<SessionParams>>,
    accepting: bool,
    admitted_total: u64,
    refused_total: u64,
}

impl AdmissionTable {
    /// A table of `max_slots` free slots over `phase_groups` groups, not yet accepting.
    pub fn new(max_slots: usize, phase_groups: usize) -> Self {
        AdmissionTable {
            // Lowest slots first, so a quiet daemon keeps using the same ones.
            free: (0..max_slots as u32).rev().collect(),
            generation: vec![0; max_slots],
            group_of: vec![0; max_slots],
            held: vec![false; max_slots],
            group_load: vec![0; phase_groups],
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
        // The least loaded group that stays within budget with one more stream.
        let mut best: Option<(usize, usize)> = None;
        let mut best_predicted = f64::INFINITY;
        for (g, load) in self.group_load.iter().enumerate() {
            let predicted = times.predict_ms(load + 1);
            best_predicted = best_predicted.min(predicted);
            if predicted <= budget_ms && best.is_none_or(|(_, l)| *load < l) {
                best = Some((g, *load));
            }
        }
        let Some((group, _)) = best else {
            return Err(Refusal::OverBudget {
                predicted_ms: best_predicted,
                budget_ms,
            });
        };
        let slot = self.free.pop().expect("checked non-empty");
        let s = slot as usize;
        self.generation[s] = self.generation[s].wrapping_add(1);
        self.group_of[s] = group as u8;
        self.held[s] = true;
        self.group_load[group] += 1;
        self.params[s] = Some(params);
        Ok(Ticket {
            slot,
            generation: self.generation[s],
            group: group as u8,
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
        self.params[s] = None;
        self.group_load[self.group_of[s] as usize] -= 1;
        self.free.push(slot);
        true
    }

    /// The group a held slot ticks with.
    pub fn group_of(&self, slot: u32) -> u8 {
        self.group_of[slot as usize]
    }

    /// Sessions held.
    pub fn active(&self) -> usize {
        self.held.iter().filter(|h| **h).count()
    }

    /// Parameters still waiting for the engine (test and leak checks).
    pub fn pending_params(&self) -> usize {
        self.params.iter().filter(|p| p.is_some()).count()
    }

    /// The snapshot served on `/capacity`.
    pub fn capacity(&self, times: &StepTimes, budget_ms: f64) -> Capacity {
        let groups: Vec<GroupCapacity> = self
            .group_load
            .iter()
            .enumerate()
            .map(|(g, load)| {
                let next = times.predict_ms(load + 1);
                GroupCapacity {
                    group: g,
                    sessions: *load,
                    predicted_step_ms: times.predict_ms(*load),
                    predicted_step_ms_next: next,
                    admits_one_more: next <= budget_ms,
                }
            })
            .collect();
        // Sessions each group could still take within budget, capped by free slots.
        let by_budget: usize = self
            .group_load
            .iter()
            .map(|load| {
                let mut n = 0;
                while load + n < times.max_slots() && times.predict_ms(load + n + 1) <= budget_ms {
                    n += 1;
                }
                n
            })
            .sum();
        Capacity {
            max_slots: self.held.len(),
            free_slots: self.free.len(),
            active_sessions: self.active(),
            budget_ms,
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

    #[test]
    fn admits_until_slots_run_out_and_spreads_groups() {
        let t = times(1000, 4);
        let mut a = AdmissionTable::new(4, 2);
        assert_eq!(
            a.admit(SessionParams::default(), &t, 30.0),
            Err(Refusal::NotAccepting)
        );
        a.set_accepting(true);
        let groups: Vec<u8> = (0..4)
            .map(|_| a.admit(SessionParams::default(), &t, 30.0).unwrap().group)
            .collect();
        assert_eq!(groups, vec![0, 1, 0, 1]);
        assert_eq!(
            a.admit(SessionParams::default(), &t, 30.0),
            Err(Refusal::NoFreeSlot)
        );
        let c = a.capacity(&t, 30.0);
        assert_eq!(
            (c.free_slots, c.active_sessions, c.refused_total),
            (0, 4, 2)
        );
    }

    #[test]
    fn refuses_over_budget() {
        let t = times(10_000, 8);
        let mut a = AdmissionTable::new(8, 1);
        a.set_accepting(true);
        for _ in 0..3 {
            a.admit(SessionParams::default(), &t, 35.0).unwrap();
        }
        let r = a.admit(SessionParams::default(), &t, 35.0).unwrap_err();
        assert!(matches!(r, Refusal::OverBudget { .. }), "{r:?}");
        assert!(r.to_string().contains("40.0 ms"));
        assert_eq!(a.capacity(&t, 35.0).admissible_sessions, 0);
    }

    #[test]
    fn release_returns_the_slot_once_with_a_new_generation() {
        let t = times(1, 1);
        let mut a = AdmissionTable::new(1, 1);
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
