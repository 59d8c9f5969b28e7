//! The grouping's unit tests: phases, plans, moves at frame boundaries and
//! lateness, driven by hand-fed frame completions and a linear step-time
//! model. (The long-run simulation is `engine/grouping_sim.rs`.)

use super::*;

const MS: u64 = 1_000_000;

fn linear(n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        1.0 + 2.0 * n as f64
    }
}

fn feed(g: &mut Grouping, slot: usize, phase_ns: u64, frames: u64) {
    for k in 0..frames {
        g.frame_completed(slot, k * PERIOD_NS + phase_ns);
    }
}

#[test]
fn a_stream_ticks_with_the_soonest_group_after_its_phase() {
    let mut g = Grouping::new(4, MaxGroups::Auto, 10.0);
    g.open(0);
    feed(&mut g, 0, 12 * MS, 8);
    let p = g.plan(&linear);
    assert_eq!(p.groups, AUTO_POSITIONS);
    // 12 ms + 0.5 ms guard: the 13 ms tick (position 13 of 80).
    assert_eq!(g.group_of(0), Some(13));
}

#[test]
fn load_merges_groups_and_every_group_fits() {
    let mut g = Grouping::new(32, MaxGroups::Auto, 10.0);
    for s in 0..32 {
        g.open(s);
        feed(&mut g, s, (s as u64 * 2_500_000 + 300_000) % PERIOD_NS, 8);
    }
    let p = g.plan(&linear);
    assert!(p.within_budget);
    assert!(p.groups < AUTO_POSITIONS, "{p:?}");
    let mut sizes = vec![0; g.positions()];
    g.sizes(&mut sizes);
    assert_eq!(sizes.iter().sum::<usize>(), 32);
    let total: f64 = sizes.iter().map(|&n| linear(n)).sum();
    assert!(total <= 70.0, "{sizes:?}");
}

#[test]
fn unmeasured_streams_batch_together_and_stay_put() {
    let mut g = Grouping::new(4, MaxGroups::Fixed(4), 10.0);
    g.open(0);
    g.plan(&linear);
    g.open(1);
    g.plan(&linear);
    assert_eq!(g.group_of(0), g.group_of(1));
    let before = g.group_of(0);
    for _ in 0..10 {
        g.plan(&linear);
    }
    assert_eq!(g.group_of(0), before);
}

#[test]
fn a_move_waits_for_the_frame_boundary() {
    let mut g = Grouping::new(1, MaxGroups::Fixed(4), 10.0);
    g.open(0);
    feed(&mut g, 0, 5 * MS, 20);
    g.plan(&linear);
    assert_eq!(g.group_of(0), Some(4)); // the 20 ms tick (4 of 16)
                                        // The phase drifts past 19.5 ms: the 40 ms tick is now the soonest.
    for k in 20..40 {
        g.frame_completed(0, k * PERIOD_NS + 19_800_000);
    }
    g.plan(&linear);
    assert_eq!((g.group_of(0), g.target_of(0)), (Some(4), Some(8)));
    assert_eq!(g.after_tick(4, &|_| 1, &[true]), 0);
    assert_eq!(g.group_of(0), Some(4));
    assert_eq!(g.after_tick(4, &|_| 0, &[true]), 1);
    assert_eq!(g.group_of(0), Some(8));
}

#[test]
fn auto_uses_group_counts_that_keep_the_anchor_groups() {
    let g = Grouping::new(4, MaxGroups::Auto, 10.0);
    // 10 and 5 groups (8 and 16 positions apart) would move the anchors
    // at 20 and 60 ms; every other divisor of 80 keeps or merges them.
    assert_eq!(g.candidates, vec![80, 40, 20, 16, 8, 4, 2, 1]);
    let fixed = Grouping::new(4, MaxGroups::Fixed(3), 10.0);
    assert_eq!(fixed.candidates, vec![3, 2, 1]);
}

#[test]
fn unmeasured_streams_join_an_anchor_group_and_keep_it_as_load_grows() {
    let mut g = Grouping::new(40, MaxGroups::Auto, 10.0);
    // A WebSocket stream measured at 33 ms ticks at 34 ms (position 34).
    g.open(0);
    feed(&mut g, 0, 33 * MS, 8);
    g.plan(&linear);
    assert_eq!(g.group_of(0), Some(34));
    // RTP streams (no completion stamps) batch on an anchor.
    for s in 1..4 {
        g.open(s);
        g.plan(&linear);
    }
    let anchor = g.group_of(1).expect("placed");
    assert_eq!(anchor % (AUTO_POSITIONS / ANCHOR_GROUPS), 0);
    assert!((1..4).all(|s| g.group_of(s) == Some(anchor)));
    // Measured streams spread over the period until groups must merge.
    for s in 4..28 {
        g.open(s);
        feed(&mut g, s, (s as u64 * 3_100_000) % PERIOD_NS, 8);
    }
    let p = g.plan(&linear);
    assert!(
        p.groups >= ANCHOR_GROUPS && p.groups < AUTO_POSITIONS,
        "{p:?}"
    );
    assert!((1..4).all(|s| g.target_of(s) == Some(anchor)));
}

#[test]
fn the_gap_to_the_next_tick_counts_positions_past_64() {
    let mut g = Grouping::new(2, MaxGroups::Auto, 10.0);
    g.open(0);
    feed(&mut g, 0, 69 * MS + 600_000, 8);
    g.plan(&linear);
    assert_eq!(g.group_of(0), Some(71));
    assert!((g.gap_after_ms(10) - 61.0).abs() < 1e-9);
    assert!((g.gap_after_ms(71) - 80.0).abs() < 1e-9);
}

#[test]
fn a_plan_is_made_again_only_when_something_changed() {
    let mut g = Grouping::new(2, MaxGroups::Auto, 10.0);
    g.open(0);
    feed(&mut g, 0, 20 * MS, 8);
    g.plan(&linear);
    let made = g.plans();
    // Frames at the same phase, ticks without moves: nothing to redo.
    for k in 8..20 {
        g.frame_completed(0, k * PERIOD_NS + 20 * MS + 100_000);
        g.plan(&linear);
        g.after_tick(21, &|_| 0, &[true, false]);
    }
    assert_eq!(g.plans(), made);
    assert_eq!(g.group_of(0), Some(21));
    // The phase leaves its group's window: planned again, and moved.
    for k in 20..40 {
        g.frame_completed(0, k * PERIOD_NS + 30 * MS);
    }
    g.plan(&linear);
    assert_eq!(g.plans(), made + 1);
    assert_eq!(g.target_of(0), Some(31));
    // A session opening, and a new step-time model, plan again too.
    g.open(1);
    g.plan(&linear);
    g.invalidate();
    g.plan(&linear);
    assert_eq!(g.plans(), made + 3);
}

#[test]
fn the_engine_sleeps_to_the_next_tick_with_work() {
    let mut g = Grouping::new(2, MaxGroups::Auto, 10.0);
    // Nothing open: wake every `max_ticks` to drain the lanes.
    assert_eq!(g.ticks_to_next_work(0, 5), 5);
    g.open(0);
    // Opened, not placed yet: the next tick places it.
    assert_eq!(g.ticks_to_next_work(0, 5), 1);
    feed(&mut g, 0, 20 * MS, 8);
    g.plan(&linear);
    assert_eq!(g.group_of(0), Some(21));
    assert_eq!(g.ticks_to_next_work(18, 5), 3);
    assert_eq!(g.ticks_to_next_work(21, 5), 5);
    // Its frame missed the tick: every tick may catch it up.
    g.after_tick(21, &|_| 0, &[false, false]);
    assert_eq!(g.ticks_to_next_work(21, 5), 1);
}
