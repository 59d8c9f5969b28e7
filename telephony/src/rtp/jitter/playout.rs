//! The jitter buffer's playout side: [`JitterBuffer::pull`] and what it
//! needs: starting and re-buffering, decoding in sequence order,
//! concealment episodes, drops that bring the depth back to its target, and
//! the depth adaptation run once per pull. The intake side
//! ([`JitterBuffer::insert`]) and the state both share are in the parent
//! module, whose doc gives the policy.
//!
//! Invariants (the parent's): every `pull` fills its whole output, so the
//! session releases exactly one frame per tick; nothing here allocates
//! (`residue` and `discard` were sized by [`JitterBuffer::new`]).

use super::{JitterBuffer, SlotState};
use crate::CodecKind;

/// Pulls per adaptation window (2 s of 80 ms frames).
const WINDOW_PULLS: u32 = 25;
/// Opus concealment beyond which silence is written instead of calling
/// libopus' PLC (which has faded out by then), in milliseconds.
const OPUS_PLC_MS: u32 = 200;

impl JitterBuffer {
    /// The first audio packet at or after `from`: (ext seq, ext ts).
    fn first_audio_from(&self, from: u64) -> Option<(u64, u64)> {
        let max = self.window_max?;
        (from..=max).find_map(|s| {
            self.present(s)
                .filter(|p| p.state == SlotState::Audio)
                .map(|p| (s, p.ext_ts))
        })
    }

    /// End of the newest buffered audio, in RTP ticks (0 if none).
    fn buffered_end(&self) -> u64 {
        let Some(max) = self.window_max else { return 0 };
        let n = self.slots.len() as u64;
        let from = self.next_seq.unwrap_or(max.saturating_sub(n - 1));
        (from..=max)
            .filter_map(|s| self.present(s).filter(|p| p.state == SlotState::Audio))
            .map(|p| p.ext_ts + p.dur_rtp)
            .max()
            .unwrap_or(0)
    }

    pub(super) fn level_rtp(&self) -> u64 {
        let residue = (self.res_len - self.res_pos) as u64 * self.k;
        if !self.playing {
            return residue;
        }
        self.buffered_end().saturating_sub(self.play_ts) + residue
    }

    fn pkt_floor_rtp(&self) -> u64 {
        self.pkt_max_rtp.max(self.pkt_max_prev_rtp)
    }

    fn floor_rtp(&self) -> u64 {
        let jitter = (3.0 * self.jitter_rtp) as u64;
        self.min_rtp
            .max(jitter)
            .max(self.pkt_floor_rtp())
            .min(self.max_rtp)
    }

    /// Fills `out` (exactly [`JitterBuffer::frame_samples`] media samples)
    /// with the next frame of audio: played, concealed or silent.
    pub fn pull(&mut self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), self.frame_media);
        self.stats.frames_out += 1;
        if !self.playing && !self.try_start() {
            self.stats.buffering_frames += 1;
            self.fill_idle(out);
            self.adapt(None);
            return;
        }
        if self.skip_pending > 0 {
            let n = self.skip_pending.min(self.discard.len());
            self.skip_pending = 0;
            let mut scratch = std::mem::take(&mut self.discard);
            let dry = self.fill(&mut scratch[..n], false);
            self.discard = scratch;
            self.stats.dropped_samples += n as u64;
            self.ramp_pending = true;
            if dry {
                self.underrun(out, 0);
                return;
            }
        }
        if self.fill(out, true) {
            self.adapt(None);
            return;
        }
        let level = self.level_rtp();
        self.adapt(Some(level));
    }

    /// Starts playing when enough audio is buffered.
    fn try_start(&mut self) -> bool {
        let from = self.next_seq.or_else(|| self.oldest_present());
        let Some(from) = from else { return false };
        let Some((first, first_ts)) = self.first_audio_from(from) else {
            return false;
        };
        let end = self.buffered_end();
        if end < first_ts + self.frame_rtp + self.target_rtp {
            return false;
        }
        // Sequence numbers skipped over were lost while we were buffering.
        if self.next_seq.is_some() {
            self.stats.lost += (from..first).filter(|&s| self.present(s).is_none()).count() as u64;
        }
        for s in from..first {
            if self.present(s).is_some() {
                let i = self.idx(s);
                self.slots[i].state = SlotState::Empty;
            }
        }
        self.next_seq = Some(first);
        self.play_ts = first_ts;
        self.playing = true;
        self.ramp_pending = true;
        true
    }

    /// Output while buffering: the running concealment fades out, then silence.
    fn fill_idle(&mut self, out: &mut [f32]) {
        if self.in_episode && !self.episode_faded() {
            self.conceal_expand(out);
        } else {
            out.fill(0.0);
        }
        self.res_pos = self.res_len;
        self.last_out = out[out.len() - 1];
    }

    /// Concealment that does not consume the timeline (underrun, buffering).
    fn conceal_expand(&mut self, out: &mut [f32]) {
        let mut i = 0;
        while i < out.len() {
            let chunk = self.conceal_chunk_len(out.len() - i);
            if chunk == 0 {
                out[i..].fill(0.0);
                break;
            }
            let take = chunk.min(out.len() - i);
            let head = &mut out[i..i + take];
            if head.len() == chunk {
                self.conceal_into(head, None);
            } else {
                let mut tmp = std::mem::take(&mut self.residue);
                self.conceal_into(&mut tmp[..chunk], None);
                head.copy_from_slice(&tmp[..head.len()]);
                self.residue = tmp;
            }
            i += chunk;
        }
    }

    /// How much to conceal at once (Opus needs whole 2.5 ms units).
    fn conceal_chunk_len(&self, want: usize) -> usize {
        let want = want.min(self.last_pkt_media.max(1));
        match self.spec.kind {
            CodecKind::Opus => {
                let unit = self.spec.media_samples(5) / 2;
                want.div_ceil(unit) * unit
            }
            _ => want,
        }
    }

    /// Whether the running concealment has faded to silence.
    fn episode_faded(&self) -> bool {
        match &self.concealer {
            Some(c) => c.is_silent(),
            None => self.opus_episode > self.spec.media_samples(OPUS_PLC_MS),
        }
    }

    fn conceal_into(&mut self, out: &mut [f32], next: Option<u64>) {
        if !self.in_episode {
            self.in_episode = true;
            self.opus_episode = 0;
            self.stats.concealed += 1;
        }
        if !self.episode_faded() {
            self.stats.concealed_samples += out.len() as u64;
        }
        match self.concealer.as_mut() {
            Some(c) => c.conceal(out),
            None => {
                // Past libopus' fade, silence costs nothing.
                if self.episode_faded() {
                    out.fill(0.0);
                } else {
                    let fec = next
                        .and_then(|s| self.present(s))
                        .filter(|p| p.state == SlotState::Audio)
                        .map(|p| {
                            let i = self.idx(p.ext_seq);
                            (i * self.slot_bytes, p.len)
                        });
                    let payload = fec.map(|(at, len)| &self.arena[at..at + len]);
                    if self.decoder.conceal(out, payload).is_err() {
                        out.fill(0.0);
                    }
                }
                self.opus_episode += out.len();
            }
        }
    }

    fn end_episode(&mut self) {
        if self.in_episode {
            self.in_episode = false;
            if let Some(c) = self.concealer.as_mut() {
                c.end_episode();
            }
            self.ramp_pending = true;
        }
    }

    /// Concealment for the rest of a frame when nothing is buffered.
    fn underrun(&mut self, out: &mut [f32], from: usize) {
        self.stats.underruns += 1;
        self.window_underrun = true;
        self.target_rtp = (self.target_rtp + self.step_rtp).min(self.max_rtp);
        self.playing = false;
        self.conceal_expand(&mut out[from..]);
        self.res_pos = self.res_len;
        self.last_out = out[out.len() - 1];
    }

    /// Copies audio into `out` until it is full; returns true when the
    /// buffer ran dry (the rest was concealed).
    fn fill(&mut self, out: &mut [f32], for_output: bool) -> bool {
        let mut i = 0;
        while i < out.len() {
            if self.res_pos < self.res_len {
                let n = (out.len() - i).min(self.res_len - self.res_pos);
                let src = &self.residue[self.res_pos..self.res_pos + n];
                let dst = &mut out[i..i + n];
                dst.copy_from_slice(src);
                if self.ramp_pending {
                    self.ramp_pending = false;
                    self.ramp_offset = self.last_out - dst[0];
                    self.ramp_left = self.ramp_len;
                }
                for x in dst.iter_mut() {
                    if self.ramp_left == 0 {
                        break;
                    }
                    *x += self.ramp_offset * self.ramp_left as f32 / self.ramp_len as f32;
                    self.ramp_left -= 1;
                }
                self.last_out = dst[n - 1];
                self.res_pos += n;
                i += n;
                continue;
            }
            if !self.next_piece() {
                if for_output {
                    self.underrun(out, i);
                }
                return true;
            }
        }
        false
    }

    /// Puts the next piece of audio in the residue; false when nothing is
    /// buffered.
    fn next_piece(&mut self) -> bool {
        loop {
            let Some(ns) = self.next_seq else {
                return false;
            };
            if let Some(slot) = self.present(ns) {
                let i = self.idx(ns);
                if slot.state == SlotState::NoAudio {
                    self.slots[i].state = SlotState::Empty;
                    self.next_seq = Some(ns + 1);
                    continue;
                }
                if slot.ext_ts > self.play_ts {
                    let gap = slot.ext_ts - self.play_ts;
                    if gap > self.max_rtp + self.frame_rtp {
                        self.stats.resyncs += 1;
                        self.play_ts = slot.ext_ts;
                        self.ramp_pending = true;
                        continue;
                    }
                    let n = ((gap / self.k) as usize).min(self.residue.len()).max(1);
                    self.residue[..n].fill(0.0);
                    self.res_pos = 0;
                    self.res_len = n;
                    self.play_ts += n as u64 * self.k;
                    self.stats.silence_samples += n as u64;
                    self.ramp_pending = true;
                    return true;
                }
                self.slots[i].state = SlotState::Empty;
                self.next_seq = Some(ns + 1);
                if slot.ext_ts + slot.dur_rtp <= self.play_ts {
                    // Its time was already concealed.
                    self.stats.late += 1;
                    continue;
                }
                let skip = ((self.play_ts - slot.ext_ts) / self.k) as usize;
                let at = i * self.slot_bytes;
                let payload = &self.arena[at..at + slot.len];
                match self.decoder.decode(payload, &mut self.residue) {
                    Ok(n) if n > skip => {
                        if let Some(c) = self.concealer.as_mut() {
                            c.push_history(&self.residue[..n]);
                        }
                        self.last_pkt_media = n;
                        self.end_episode();
                        self.res_pos = skip;
                        self.res_len = n;
                        self.play_ts = slot.ext_ts + n as u64 * self.k;
                        return true;
                    }
                    Ok(_) => continue,
                    Err(_) => {
                        self.stats.decode_errors += 1;
                        let n = ((slot.dur_rtp / self.k) as usize).saturating_sub(skip);
                        let n = self.conceal_chunk_len(n.max(1)).min(self.residue.len());
                        let mut tmp = std::mem::take(&mut self.residue);
                        self.conceal_into(&mut tmp[..n], None);
                        self.residue = tmp;
                        self.res_pos = 0;
                        self.res_len = n;
                        self.play_ts = slot.ext_ts + slot.dur_rtp;
                        return true;
                    }
                }
            }
            // Missing: lost if anything later is here, else the buffer is dry.
            let Some((s2, ts2)) = self.first_audio_from(ns + 1) else {
                return false;
            };
            if ts2 <= self.play_ts {
                self.skip_to(ns, s2);
                continue;
            }
            let gap_media = ((ts2 - self.play_ts) / self.k) as usize;
            let n = self.conceal_chunk_len(gap_media).min(self.residue.len());
            // FEC can rebuild exactly the packet before `s2`.
            let fec = (s2 == ns + 1 && n == gap_media).then_some(s2);
            let mut tmp = std::mem::take(&mut self.residue);
            self.conceal_into(&mut tmp[..n], fec);
            self.residue = tmp;
            self.res_pos = 0;
            self.res_len = n;
            self.play_ts += n as u64 * self.k;
            if self.play_ts >= ts2 {
                self.skip_to(ns, s2);
            }
            return true;
        }
    }

    /// Moves playout from `ns` to `s2`, counting the missing packets as lost.
    fn skip_to(&mut self, ns: u64, s2: u64) {
        for s in ns..s2 {
            if self.present(s).is_some() {
                let i = self.idx(s);
                self.slots[i].state = SlotState::Empty;
            } else {
                self.stats.lost += 1;
            }
        }
        self.next_seq = Some(s2);
    }

    /// Adapts the target depth (`level` after a pull that played, `None`
    /// after an underrun or while buffering).
    fn adapt(&mut self, level: Option<u64>) {
        if let Some(l) = level {
            self.window_min_level = self.window_min_level.min(l);
        }
        self.window_pulls += 1;
        if self.window_pulls < WINDOW_PULLS {
            return;
        }
        let floor = self.floor_rtp();
        if self.target_rtp < floor {
            self.target_rtp = floor;
        } else if !self.window_underrun {
            self.target_rtp = floor.max(self.target_rtp.saturating_sub(self.step_rtp / 2));
        }
        if self.playing
            && !self.window_underrun
            && self.window_min_level != u64::MAX
            && self.window_min_level > self.target_rtp + self.step_rtp
        {
            let excess = (self.window_min_level - self.target_rtp) / self.k;
            self.skip_pending = (excess as usize).min(self.frame_media / 2);
        }
        self.pkt_max_prev_rtp = self.pkt_max_rtp;
        self.pkt_max_rtp = 0;
        self.window_pulls = 0;
        self.window_min_level = u64::MAX;
        self.window_underrun = false;
    }
}
