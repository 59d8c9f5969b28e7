//! `FrameCutter`: PCM runs of any length in, whole model frames out.
//!
//! Invariants: fixed capacity chosen at construction (at least one frame);
//! samples come out in the order they went in, without gaps or repeats; only
//! complete [`FRAME_SAMPLES`] frames are handed out; `push` accepts what fits
//! and says how much, so the caller pops frames and pushes the rest. Nothing
//! allocates after `new`.
//!
//! ```ignore
//! let mut rest = pcm;
//! while !rest.is_empty() {
//!     rest = &rest[cutter.push(rest)..];
//!     while cutter.pop_frame(&mut frame) { /* hand the frame on */ }
//! }
//! ```

use super::error::CodecError;
use super::{FRAME_SAMPLES, MAX_PACKET_SAMPLES};

/// Capacity that takes one decoded packet whenever the cutter was drained.
pub const DEFAULT_CUTTER_CAPACITY_SAMPLES: usize = FRAME_SAMPLES + MAX_PACKET_SAMPLES;

/// Collects samples and cuts them into frames of [`FRAME_SAMPLES`].
pub struct FrameCutter {
    buf: Box<[f32]>,
    start: usize,
    end: usize,
}

impl FrameCutter {
    pub fn new(capacity_samples: usize) -> Result<Self, CodecError> {
        if capacity_samples < FRAME_SAMPLES {
            return Err(CodecError::InvalidConfig(
                "FrameCutter capacity is smaller than one frame",
            ));
        }
        Ok(Self {
            buf: vec![0f32; capacity_samples].into_boxed_slice(),
            start: 0,
            end: 0,
        })
    }

    pub fn capacity_samples(&self) -> usize {
        self.buf.len()
    }

    /// Samples held, always less than a frame after `pop_frame` returned false.
    pub fn buffered_samples(&self) -> usize {
        self.end - self.start
    }

    /// Drops everything held.
    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    /// Copies in as many leading samples of `pcm` as fit; returns that count.
    pub fn push(&mut self, pcm: &[f32]) -> usize {
        if pcm.len() > self.buf.len() - self.end && self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let accepted = pcm.len().min(self.buf.len() - self.end);
        self.buf[self.end..self.end + accepted].copy_from_slice(&pcm[..accepted]);
        self.end += accepted;
        accepted
    }

    /// Moves the oldest complete frame into `frame`; false if none is complete.
    pub fn pop_frame(&mut self, frame: &mut [f32; FRAME_SAMPLES]) -> bool {
        if self.end - self.start < FRAME_SAMPLES {
            return false;
        }
        frame.copy_from_slice(&self.buf[self.start..self.start + FRAME_SAMPLES]);
        self.start += FRAME_SAMPLES;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes a ramp 0, 1, 2, ... in chunks of the given sizes (cycled) and
    /// checks that frames come out as consecutive ramp segments.
    fn run(chunk_sizes: &[usize], total_samples: usize, capacity: usize) {
        let ramp: Vec<f32> = (0..total_samples).map(|i| i as f32).collect();
        let mut cutter = FrameCutter::new(capacity).unwrap();
        let mut frame = [0f32; FRAME_SAMPLES];
        let mut frames_out = 0usize;
        let mut pos = 0;
        let mut sizes = chunk_sizes.iter().cycle();
        while pos < total_samples {
            let n = (*sizes.next().unwrap()).min(total_samples - pos);
            let mut rest = &ramp[pos..pos + n];
            while !rest.is_empty() {
                rest = &rest[cutter.push(rest)..];
                while cutter.pop_frame(&mut frame) {
                    let first = (frames_out * FRAME_SAMPLES) as f32;
                    assert!(frame
                        .iter()
                        .enumerate()
                        .all(|(i, &s)| s == first + i as f32));
                    frames_out += 1;
                }
                assert!(cutter.buffered_samples() < FRAME_SAMPLES);
            }
            pos += n;
        }
        assert_eq!(frames_out, total_samples / FRAME_SAMPLES);
        assert_eq!(cutter.buffered_samples(), total_samples % FRAME_SAMPLES);
    }

    #[test]
    fn frames_across_chunk_sizes() {
        let total = 20 * FRAME_SAMPLES + 123;
        for sizes in [
            &[1usize][..],
            &[7],
            &[960],
            &[1919],
            &[1920],
            &[1921],
            &[2880],
            &[5000],
            &[total],
            &[3, 1000, 1, 4000, 17],
        ] {
            run(sizes, total, DEFAULT_CUTTER_CAPACITY_SAMPLES);
            run(sizes, total, FRAME_SAMPLES);
        }
    }

    #[test]
    fn push_accepts_only_what_fits() {
        let mut cutter = FrameCutter::new(FRAME_SAMPLES).unwrap();
        assert_eq!(cutter.push(&[0.5; 3000]), FRAME_SAMPLES);
        assert_eq!(cutter.push(&[0.5; 10]), 0);
        let mut frame = [0f32; FRAME_SAMPLES];
        assert!(cutter.pop_frame(&mut frame));
        assert!(!cutter.pop_frame(&mut frame));
        assert!(FrameCutter::new(FRAME_SAMPLES - 1).is_err());
    }
}
