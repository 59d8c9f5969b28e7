//! Loss concealment for codecs without their own (G.711, L16): waveform
//! repetition with fade, in the spirit of ITU-T G.711 Appendix I.
//!
//! At the start of a concealment episode the pitch period of the last
//! 20 ms is estimated by normalised autocorrelation (2.5–15 ms lags; 10 ms
//! when nothing periodic is found) and the last period is repeated. The
//! gain holds for [`HOLD_MS`], then falls linearly to zero over
//! [`FADE_MS`]; after that the concealer outputs silence.
//!
//! Invariants: buffers are sized at construction from the sample rate;
//! `conceal` and `push_history` never allocate.

/// Concealment at full gain, in milliseconds.
pub const HOLD_MS: u32 = 10;
/// Fade to silence after the hold, in milliseconds.
pub const FADE_MS: u32 = 50;
const HISTORY_MS: u32 = 40;
const WINDOW_MS: u32 = 20;
const MIN_LAG_US: u32 = 2_500;
const MAX_LAG_MS: u32 = 15;
const DEFAULT_PERIOD_MS: u32 = 10;

/// Waveform-repeat concealer for one stream.
pub struct Concealer {
    rate_hz: u32,
    history: Vec<f32>,
    write: usize,
    filled: usize,
    template: Vec<f32>,
    period: usize,
    cursor: usize,
    episode_samples: usize,
    active: bool,
    linear: Vec<f32>,
}

impl Concealer {
    /// A concealer for audio at `rate_hz`.
    pub fn new(rate_hz: u32) -> Self {
        let ms = |m: u32| (rate_hz as u64 * m as u64 / 1000) as usize;
        let h = ms(HISTORY_MS);
        Concealer {
            rate_hz,
            history: vec![0.0; h],
            write: 0,
            filled: 0,
            template: vec![0.0; ms(MAX_LAG_MS) + 1],
            period: ms(DEFAULT_PERIOD_MS),
            cursor: 0,
            episode_samples: 0,
            active: false,
            linear: vec![0.0; h],
        }
    }

    /// Records audio that was really received (in playout order).
    pub fn push_history(&mut self, pcm: &[f32]) {
        let h = self.history.len();
        let pcm = if pcm.len() > h {
            &pcm[pcm.len() - h..]
        } else {
            pcm
        };
        for &x in pcm {
            self.history[self.write] = x;
            self.write = (self.write + 1) % h;
        }
        self.filled = (self.filled + pcm.len()).min(h);
    }

    /// Whether an episode is running.
    pub fn is_active(&self) -> bool {
        self.active
    }

    /// Whether the current episode has faded to silence.
    pub fn is_silent(&self) -> bool {
        self.active && self.episode_samples >= self.ms(HOLD_MS + FADE_MS)
    }

    /// Ends the episode (real audio resumed).
    pub fn end_episode(&mut self) {
        self.active = false;
    }

    fn ms(&self, m: u32) -> usize {
        (self.rate_hz as u64 * m as u64 / 1000) as usize
    }

    fn start_episode(&mut self) {
        self.active = true;
        self.episode_samples = 0;
        self.cursor = 0;
        let h = self.history.len();
        // Oldest first.
        for i in 0..h {
            self.linear[i] = self.history[(self.write + i) % h];
        }
        let min_lag = (self.rate_hz as u64 * MIN_LAG_US as u64 / 1_000_000) as usize;
        let max_lag = self.ms(MAX_LAG_MS).min(self.template.len() - 1);
        let window = self.ms(WINDOW_MS);
        self.period = self.ms(DEFAULT_PERIOD_MS).clamp(1, max_lag);
        if self.filled >= window + max_lag && min_lag < max_lag {
            let x = &self.linear[h - window..];
            let energy: f32 = x.iter().map(|v| v * v).sum();
            if energy > 1e-8 {
                let mut best = 0.0f32;
                for lag in min_lag..=max_lag {
                    let y = &self.linear[h - window - lag..h - lag];
                    let (mut xy, mut yy) = (0.0f32, 0.0f32);
                    for (a, b) in x.iter().zip(y) {
                        xy += a * b;
                        yy += b * b;
                    }
                    if yy > 1e-8 {
                        let c = xy / (energy * yy).sqrt();
                        if c > best {
                            best = c;
                            self.period = lag;
                        }
                    }
                }
                if best < 0.3 {
                    self.period = self.ms(DEFAULT_PERIOD_MS).clamp(1, max_lag);
                }
            }
        }
        let p = self.period;
        self.template[..p].copy_from_slice(&self.linear[h - p..]);
    }

    /// Writes `out.len()` samples of concealment, starting an episode when
    /// none runs.
    pub fn conceal(&mut self, out: &mut [f32]) {
        if !self.active {
            self.start_episode();
        }
        let hold = self.ms(HOLD_MS);
        let fade = self.ms(FADE_MS).max(1);
        for o in out.iter_mut() {
            let n = self.episode_samples;
            let gain = if n < hold {
                1.0
            } else if n < hold + fade {
                1.0 - (n - hold) as f32 / fade as f32
            } else {
                0.0
            };
            *o = if gain > 0.0 {
                self.template[self.cursor] * gain
            } else {
                0.0
            };
            self.cursor = (self.cursor + 1) % self.period;
            self.episode_samples += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_the_pitch_period_then_fades() {
        let rate = 8_000;
        let mut c = Concealer::new(rate);
        // A 200 Hz tone: 40-sample period.
        let tone: Vec<f32> = (0..400)
            .map(|i| (2.0 * std::f32::consts::PI * i as f32 / 40.0).sin() * 0.5)
            .collect();
        c.push_history(&tone);
        let mut out = vec![0f32; 80];
        c.conceal(&mut out);
        // The continuation of the tone, at full gain during the hold.
        for (i, o) in out.iter().enumerate() {
            let expect = (2.0 * std::f32::consts::PI * (400 + i) as f32 / 40.0).sin() * 0.5;
            assert!((o - expect).abs() < 1e-3, "sample {i}: {o} vs {expect}");
        }
        let mut rest = vec![0f32; 8 * 60];
        c.conceal(&mut rest);
        assert!(c.is_silent());
        assert!(rest[rest.len() - 60..].iter().all(|x| *x == 0.0));
        c.end_episode();
        assert!(!c.is_active());
    }

    #[test]
    fn silence_history_conceals_silence() {
        let mut c = Concealer::new(16_000);
        let mut out = vec![1f32; 320];
        c.conceal(&mut out);
        assert!(out.iter().all(|x| *x == 0.0));
    }
}
