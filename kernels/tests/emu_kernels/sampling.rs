//! Temperature + top-k sampling with per-slot RNG draws and guidance, against
//! the CPU sampler and the kernel's own rules.

use super::*;

/// The kernel's semantics on the host: top-k by (logit desc, index asc),
/// walked in index order, one draw.
fn sample_ref(logits: &[f32], temp: f32, top_k: usize, u: f64) -> u32 {
    let n = logits.len();
    let k = if top_k == 0 || top_k >= n { n } else { top_k };
    let mut idx: Vec<usize> = (0..n).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let mut inset = vec![false; n];
    for &i in &idx[..k] {
        inset[i] = true;
    }
    let max = logits[idx[0]] as f64;
    let w: Vec<f64> = (0..n)
        .map(|i| {
            if inset[i] {
                ((logits[i] as f64 - max) / temp as f64).exp()
            } else {
                0.0
            }
        })
        .collect();
    let total: f64 = w.iter().sum();
    let u = u * total;
    let mut acc = 0.0;
    for (i, wi) in w.iter().enumerate() {
        if inset[i] {
            acc += wi;
            if u < acc {
                return i as u32;
            }
        }
    }
    unreachable!("u beyond the total")
}

pub(crate) struct Sampling {
    pub(crate) logits: DevPtr,
    pub(crate) steps: DevPtr,
    pub(crate) params: DevPtr,
    pub(crate) rng: DevPtr,
    pub(crate) out: DevPtr,
}

pub(crate) fn sample(
    dev: &mut dyn Device,
    s: &Sampling,
    vocab: usize,
    n: usize,
    audio: bool,
) -> Vec<u32> {
    dev.launch(
        k(dev, "sample_tokens"),
        (n as u32, 1, 1),
        SAMPLE_THREADS,
        &[
            Arg::Ptr(s.logits),
            Arg::I32(vocab as i32),
            Arg::I32(vocab as i32),
            Arg::Ptr(s.steps),
            Arg::Ptr(s.params),
            Arg::I32(audio as i32),
            Arg::Ptr(s.rng),
            Arg::Ptr(s.out),
            Arg::I32(1),
        ],
    )
    .unwrap();
    down::<u32>(dev, s.out, n)
}

#[test]
fn sampling_greedy_top1_and_rng_draws() {
    // Greedy, top-1 and the RNG's draw count.
    let mut dev = device();
    let vocab = 48_000;
    let mut logits = det(2 * vocab, 5.0);
    logits[1234] = 9.0;
    logits[vocab + 77] = 9.0;
    logits[vocab + 4000] = 9.0; // a tie: the first index wins
    let greedy = SlotParams {
        temp_text: 0.7,
        temp_audio: 0.8,
        top_k_text: 25,
        top_k_audio: 250,
        use_sampling: 0,
        cfg_coef: 1.0,
    };
    let top1 = SlotParams {
        use_sampling: 1,
        top_k_text: 1,
        ..greedy
    };
    let seeds = [rng::seed_state(7), rng::seed_state(8)];
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps_all(2)),
        params: up(&mut dev, &[greedy, greedy]),
        rng: up(&mut dev, &seeds.concat()),
        out: zeros::<u32>(&mut dev, 2),
    };
    for (params, draws) in [([greedy, greedy], 0), ([top1, top1], 1)] {
        write(&mut dev, s.params, &params);
        assert_eq!(sample(&mut dev, &s, vocab, 2, false), vec![1234, 77]);
        // Greedy leaves the generator alone; a sampled token draws once.
        let mut want = seeds;
        if draws == 1 {
            for st in &mut want {
                rng::next_u64(st);
            }
        }
        assert_eq!(down::<u64>(&mut dev, s.rng, 8), want.concat());
        write(&mut dev, s.rng, &seeds.concat());
    }
}

#[test]
fn sampling_draws_as_the_cpu_and_the_kernel_s_rules() {
    let mut dev = device();
    let vocab = 2048 + 17;
    let n = 4;
    let logits: Vec<f32> = det(n * vocab, 11.0).iter().map(|v| v * 4.0).collect();
    let seeds: Vec<[u64; 4]> = (0..n as u64).map(|i| rng::seed_state(100 + i)).collect();
    // Step 3 is masked: its output must stay untouched.
    let mut steps = steps_all(n);
    steps[3].active = 0;
    let params = SlotParams {
        temp_text: 0.8,
        temp_audio: 1.3,
        top_k_text: 0,
        top_k_audio: 50,
        use_sampling: 1,
        cfg_coef: 1.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps),
        params: up(&mut dev, &vec![params; n]),
        rng: up(&mut dev, &seeds.concat()),
        out: up(&mut dev, &vec![u32::MAX; n]),
    };
    let mut host = seeds.clone();
    let mut cpu_rngs: Vec<_> = (0..n as u64)
        .map(|i| moshid_model::lm::slot_rng(100 + i))
        .collect();
    for round in 0..5 {
        let audio = round % 2 == 1;
        let got = sample(&mut dev, &s, vocab, n, audio);
        for j in 0..3 {
            let l = &logits[j * vocab..(j + 1) * vocab];
            let x = rng::next_u64(&mut host[j]);
            let u = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let (temp, top_k) = if audio { (1.3, 50) } else { (0.8, 0) };
            assert_eq!(
                got[j],
                sample_ref(l, temp, top_k, u),
                "round {round} step {j}"
            );
            // All candidates in index order: the CPU sampler draws the same token.
            let mut sc = vec![(0.0, 0); vocab];
            let cpu = moshid_model::lm::sample_top_k(l, temp, top_k, &mut cpu_rngs[j], &mut sc);
            if top_k == 0 {
                assert_eq!(got[j], cpu, "round {round} step {j}: the CPU sampler");
            }
        }
        assert_eq!(got[3], u32::MAX, "a masked step writes nothing");
        let mut want = host.clone();
        want[3] = seeds[3];
        assert_eq!(
            down::<u64>(&mut dev, s.rng, 4 * n),
            want.concat(),
            "round {round}"
        );
    }
}

#[test]
fn sampling_with_guidance_mixes_the_rows() {
    let mut dev = device();
    let vocab = 1000;
    let mut logits = det(2 * vocab, 2.0);
    // cond favours 10, null 20; coef 3: null + (cond − null)·3 favours 10 more.
    logits[10] = 5.0;
    logits[vocab + 20] = 6.0;
    logits[20] = 5.5;
    let steps = [SlotStep {
        slot: 0,
        active: 1,
        row_cond: 0,
        row_null: 1,
    }];
    let p = SlotParams {
        temp_text: 0.0,
        temp_audio: 0.0,
        top_k_text: 0,
        top_k_audio: 0,
        use_sampling: 1,
        cfg_coef: 3.0,
    };
    let s = Sampling {
        logits: up(&mut dev, &logits),
        steps: up(&mut dev, &steps),
        params: up(&mut dev, &[p]),
        rng: up(&mut dev, &rng::seed_state(1)),
        out: zeros::<u32>(&mut dev, 1),
    };
    let mixed: Vec<f32> = (0..vocab)
        .map(|i| logits[vocab + i] + (logits[i] - logits[vocab + i]) * 3.0)
        .collect();
    assert_eq!(
        sample(&mut dev, &s, vocab, 1, false)[0],
        ops::argmax(&mixed) as u32
    );
    // Sampled with guidance, top 5.
    let p = SlotParams {
        temp_text: 0.9,
        top_k_text: 5,
        ..p
    };
    write(&mut dev, s.params, &[p]);
    let mut st = rng::seed_state(1);
    let x = rng::next_u64(&mut st);
    let u = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    assert_eq!(
        sample(&mut dev, &s, vocab, 1, false)[0],
        sample_ref(&mixed, 0.9, 5, u)
    );
}

/// Draws `rounds` tokens for each row of `logits` (`[rows][vocab]`, rows
/// `rows`) with temperature `temp` and top-k `top_k` and checks each against
/// the kernel's rules on the host with the same uniform.
fn draws_follow_the_rules(
    logits: &[f32],
    vocab: usize,
    temp: f32,
    top_k: usize,
    rounds: usize,
    what: &str,
) {
    let n = logits.len() / vocab;
    let mut dev = device();
    let seeds: Vec<[u64; 4]> = (0..n as u64).map(|i| rng::seed_state(500 + i)).collect();
    let params = SlotParams {
        temp_text: temp,
        temp_audio: temp,
        top_k_text: top_k as i32,
        top_k_audio: top_k as i32,
        use_sampling: 1,
        cfg_coef: 1.0,
    };
    let s = Sampling {
        logits: up(&mut *dev, logits),
        steps: up(&mut *dev, &steps_all(n)),
        params: up(&mut *dev, &vec![params; n]),
        rng: up(&mut *dev, &seeds.concat()),
        out: zeros::<u32>(&mut *dev, n),
    };
    let mut host = seeds.clone();
    for round in 0..rounds {
        let got = sample(&mut *dev, &s, vocab, n, round % 2 == 1);
        for j in 0..n {
            let x = rng::next_u64(&mut host[j]);
            let u = (x >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
            let l = &logits[j * vocab..(j + 1) * vocab];
            assert_eq!(
                got[j],
                sample_ref(l, temp, top_k, u),
                "{what}: round {round} row {j}"
            );
        }
    }
}

#[test]
fn sampling_top_k_cuts_through_ties_and_stops_early() {
    // Logits on a coarse grid: the k-th largest value is shared by many
    // entries, and the select must take the lowest indices among them.
    let vocab = 2048;
    let grid: Vec<f32> = det(3 * vocab, 21.0)
        .iter()
        .map(|v| (v * 6.0).round() * 0.5)
        .collect();
    for k in [1, 7, 250, vocab - 1] {
        draws_follow_the_rules(&grid, vocab, 0.9, k, 12, &format!("grid, top {k}"));
    }
    // Every logit equal: the first k indices, drawn uniformly.
    draws_follow_the_rules(&vec![0.25f32; vocab], vocab, 1.0, 10, 16, "all equal");
    // Distinct logits (a bin is usually taken whole after two or three
    // passes), negative ones, and -inf entries among the candidates.
    let mut wide: Vec<f32> = det(2 * vocab, 3.0).iter().map(|v| v * 12.0 - 3.0).collect();
    for i in (0..wide.len()).step_by(5) {
        wide[i] = f32::NEG_INFINITY;
    }
    for k in [3, 250, vocab - 2] {
        draws_follow_the_rules(&wide, vocab, 0.7, k, 8, &format!("wide, top {k}"));
    }
    // The text vocabulary, top 25.
    let text: Vec<f32> = det(48_000, 8.0).iter().map(|v| v * 5.0).collect();
    draws_follow_the_rules(&text, 48_000, 0.7, 25, 4, "text vocabulary");
}
