//! The per-session jitter buffer: packets in, exactly one frame of audio out
//! per engine tick, whatever the network did.
//!
//! * **Order.** Packets are stored by extended sequence number in a ring of
//!   slots (payload bytes copied into a per-session arena) and decoded at
//!   playout, in order, so that a stateful decoder (Opus) sees its stream in
//!   order and can use forward error correction.
//! * **Duplicates** are found with a 128-packet bitmap of what arrived;
//!   **reordered** packets (older than the newest) are counted and placed;
//!   packets whose playout time has passed are **late** and dropped.
//! * **Loss.** A missing packet is declared lost only when its audio is
//!   needed and a later packet is present; its duration comes from the
//!   timestamps. Opus conceals with FEC from the next packet when it is
//!   there, else with its PLC; G.711 and L16 with waveform repetition and
//!   fade ([`super::conceal`]).
//! * **Underrun** (nothing buffered when audio is needed): the rest of the
//!   frame is concealed without consuming the timeline, the buffer re-fills
//!   to its target before playing again, and the target grows by 20 ms —
//!   the delay the network has shown it needs.
//! * **Depth.** The target (between `min_ms` and `max_ms`) follows the
//!   measured interarrival jitter (RFC 3550 §6.4.1) and the longest packet
//!   seen; every 2 s, when the least audio held after a pull stayed above
//!   the target by over 20 ms, the excess is dropped (at most 40 ms at a
//!   time), and the target decays towards its floor when no underrun
//!   happened. Discontinuities (concealment edges, drops) are smoothed with
//!   a 2 ms offset ramp.
//! * **Timeline.** A timestamp gap without a sequence gap (silence
//!   suppression) plays silence; a gap longer than `max_ms` plus a frame is
//!   a resync (the sender paused): playout jumps to the new timestamp.
//! * **New stream.** A new SSRC, or a sequence jump confirmed by the next
//!   packet, flushes the buffer and starts over (counted).
//!
//! Invariants: [`JitterBuffer::pull`] always fills its whole output, so the
//! session releases exactly one frame per tick; nothing allocates after
//! [`JitterBuffer::new`]; every counter only grows.

use super::conceal::Concealer;
use super::packet::RtpPacket;
use super::seq::{SeqTracker, SeqUpdate, TsTracker};
use crate::{CodecError, CodecKind, CodecSpec, MediaDecoder};
use serde::Serialize;

/// Target growth on an underrun, and the excess that triggers a drop, in ms.
const STEP_MS: u32 = 20;
/// Pulls per adaptation window (2 s of 80 ms frames).
const WINDOW_PULLS: u32 = 25;
/// Length of the offset ramp smoothing a discontinuity, in milliseconds.
const RAMP_MS: u32 = 2;
/// Bytes a slot holds at least (a full Ethernet payload).
const MIN_SLOT_BYTES: usize = 1500;
/// Opus concealment beyond which silence is written instead of calling
/// libopus' PLC (which has faded out by then), in milliseconds.
const OPUS_PLC_MS: u32 = 200;
/// Longest packet stored, in milliseconds (longer: counted as oversize).
const MAX_SLOT_MS: u32 = 60;

/// Jitter buffer settings.
#[derive(Debug, Clone, Copy)]
pub struct JitterConfig {
    /// The codec.
    pub spec: CodecSpec,
    /// Smallest target depth, in milliseconds.
    pub min_ms: u32,
    /// Largest target depth, in milliseconds.
    pub max_ms: u32,
    /// Audio per pull, in milliseconds (the model frame, 80).
    pub frame_ms: u32,
}

/// What a packet was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// Audio of the session's codec.
    Audio,
    /// Occupies a sequence number but carries no audio (RFC 4733 events).
    NoAudio,
}

/// What became of an inserted packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// Stored for playout.
    Stored,
    /// Already received.
    Duplicate,
    /// Its playout time has passed.
    Late,
    /// Not used (sequence jump awaiting confirmation, bad payload, too big).
    Ignored,
}

/// Counters of one jitter buffer (only ever grow).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct JitterStats {
    /// Packets of the stream received (including duplicates and late ones).
    pub received: u64,
    /// Packets received twice.
    pub duplicate: u64,
    /// Packets that arrived after a newer one.
    pub reordered: u64,
    /// Packets that arrived after their playout time (dropped).
    pub late: u64,
    /// Packets never received by their playout time.
    pub lost: u64,
    /// Concealment episodes (a run of lost or missing audio).
    pub concealed: u64,
    /// Media samples synthesised by concealment.
    pub concealed_samples: u64,
    /// Times the buffer ran dry while playing.
    pub underruns: u64,
    /// Packets dropped because the buffer could not hold them.
    pub overflow: u64,
    /// Timeline resyncs (confirmed sequence jumps, long timestamp gaps).
    pub resyncs: u64,
    /// SSRC changes (each a new stream).
    pub ssrc_changes: u64,
    /// Unconfirmed sequence jumps ignored.
    pub seq_jumps: u64,
    /// Packets too long to store.
    pub oversize: u64,
    /// Payloads the decoder refused (concealed instead).
    pub decode_errors: u64,
    /// Media samples dropped to bring the depth back to its target.
    pub dropped_samples: u64,
    /// Media samples of silence played for timestamp gaps.
    pub silence_samples: u64,
    /// Frames pulled.
    pub frames_out: u64,
    /// Frames pulled while (re)buffering (silence or fading concealment).
    pub buffering_frames: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum SlotState {
    #[default]
    Empty,
    Audio,
    NoAudio,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    state: SlotState,
    ext_seq: u64,
    ext_ts: u64,
    dur_rtp: u64,
    len: usize,
}

/// The jitter buffer of one RTP session.
pub struct JitterBuffer {
    spec: CodecSpec,
    k: u64,
    frame_media: usize,
    frame_rtp: u64,
    min_rtp: u64,
    max_rtp: u64,
    step_rtp: u64,
    target_rtp: u64,
    slots: Vec<Slot>,
    arena: Vec<u8>,
    slot_bytes: usize,
    seq: SeqTracker,
    ts: TsTracker,
    ssrc: Option<u32>,
    window_max: Option<u64>,
    recv_window: u128,
    playing: bool,
    next_seq: Option<u64>,
    play_ts: u64,
    decoder: MediaDecoder,
    concealer: Option<Concealer>,
    /// Opus: samples concealed in the current episode (PLC fades by itself;
    /// past the fade the buffer writes zeros instead of calling it).
    opus_episode: usize,
    in_episode: bool,
    residue: Vec<f32>,
    res_pos: usize,
    res_len: usize,
    last_out: f32,
    ramp_pending: bool,
    ramp_offset: f32,
    ramp_left: usize,
    ramp_len: usize,
    jitter_rtp: f64,
    last_transit: Option<f64>,
    pkt_max_rtp: u64,
    pkt_max_prev_rtp: u64,
    last_pkt_media: usize,
    window_pulls: u32,
    window_min_level: u64,
    window_underrun: bool,
    skip_pending: usize,
    discard: Vec<f32>,
    stats: JitterStats,
}

impl JitterBuffer {
    /// A buffer for `cfg` (`min_ms ≤ max_ms` checked by the caller's config).
    pub fn new(cfg: JitterConfig) -> Result<Self, CodecError> {
        let spec = cfg.spec;
        let k = spec.rtp_per_media() as u64;
        let ms_rtp = |ms: u32| spec.rtp_clock_hz() as u64 * ms as u64 / 1000;
        let frame_media = spec.media_samples(cfg.frame_ms);
        let slot_bytes = MIN_SLOT_BYTES.max(match spec.kind {
            CodecKind::L16 => 2 * spec.media_samples(MAX_SLOT_MS),
            _ => spec.media_samples(MAX_SLOT_MS),
        });
        // Enough slots for the deepest buffer of 10 ms packets plus a frame.
        let slots = (((cfg.max_ms + cfg.frame_ms) / 10 + 8) as usize)
            .max(32)
            .next_power_of_two();
        let residue = spec
            .max_packet_media_samples()
            .max(slot_bytes)
            .max(frame_media);
        let concealer = match spec.kind {
            CodecKind::Opus => None,
            _ => Some(Concealer::new(spec.media_rate_hz())),
        };
        let ramp_len = spec.media_samples(RAMP_MS).max(1);
        Ok(JitterBuffer {
            spec,
            k,
            frame_media,
            frame_rtp: frame_media as u64 * k,
            min_rtp: ms_rtp(cfg.min_ms),
            max_rtp: ms_rtp(cfg.max_ms),
            step_rtp: ms_rtp(STEP_MS),
            target_rtp: ms_rtp(cfg.min_ms),
            slots: vec![Slot::default(); slots],
            arena: vec![0; slots * slot_bytes],
            slot_bytes,
            seq: SeqTracker::default(),
            ts: TsTracker::default(),
            ssrc: None,
            window_max: None,
            recv_window: 0,
            playing: false,
            next_seq: None,
            play_ts: 0,
            decoder: MediaDecoder::new(spec)?,
            concealer,
            opus_episode: 0,
            in_episode: false,
            residue: vec![0.0; residue],
            res_pos: 0,
            res_len: 0,
            last_out: 0.0,
            ramp_pending: false,
            ramp_offset: 0.0,
            ramp_left: 0,
            ramp_len,
            jitter_rtp: 0.0,
            last_transit: None,
            pkt_max_rtp: 0,
            pkt_max_prev_rtp: 0,
            last_pkt_media: spec.media_samples(20),
            window_pulls: 0,
            window_min_level: u64::MAX,
            window_underrun: false,
            skip_pending: 0,
            discard: vec![0.0; frame_media],
            stats: JitterStats::default(),
        })
    }

    /// The counters.
    pub fn stats(&self) -> &JitterStats {
        &self.stats
    }

    /// Media samples per pull.
    pub fn frame_samples(&self) -> usize {
        self.frame_media
    }

    /// Interarrival jitter (RFC 3550), in milliseconds.
    pub fn jitter_ms(&self) -> f64 {
        self.jitter_rtp * 1000.0 / self.spec.rtp_clock_hz() as f64
    }

    /// The current target depth, in milliseconds.
    pub fn target_ms(&self) -> f64 {
        self.target_rtp as f64 * 1000.0 / self.spec.rtp_clock_hz() as f64
    }

    /// Audio buffered beyond the playout point, in milliseconds.
    pub fn level_ms(&self) -> f64 {
        self.level_rtp() as f64 * 1000.0 / self.spec.rtp_clock_hz() as f64
    }

    /// Whether audio is being played (not buffering).
    pub fn is_playing(&self) -> bool {
        self.playing
    }

    /// The synchronisation source being played.
    pub fn ssrc(&self) -> Option<u32> {
        self.ssrc
    }

    fn idx(&self, ext: u64) -> usize {
        (ext as usize) & (self.slots.len() - 1)
    }

    fn present(&self, ext: u64) -> Option<Slot> {
        let s = self.slots[self.idx(ext)];
        (s.state != SlotState::Empty && s.ext_seq == ext).then_some(s)
    }

    /// Drops everything buffered and the stream's timeline (not its
    /// sequence tracker).
    fn flush(&mut self) {
        for s in self.slots.iter_mut() {
            s.state = SlotState::Empty;
        }
        self.ts.reset();
        self.window_max = None;
        self.recv_window = 0;
        self.playing = false;
        self.next_seq = None;
        self.res_pos = 0;
        self.res_len = 0;
        self.last_transit = None;
        self.skip_pending = 0;
        self.decoder.reset();
    }

    /// Takes one packet of the latched source. `arrival_secs` is its
    /// arrival time on any monotonic clock (for the jitter estimate).
    pub fn insert(
        &mut self,
        pkt: &RtpPacket<'_>,
        kind: PacketKind,
        arrival_secs: f64,
    ) -> InsertOutcome {
        if self.ssrc != Some(pkt.ssrc) {
            if self.ssrc.is_some() {
                self.stats.ssrc_changes += 1;
                self.flush();
                self.seq.reset();
            }
            self.ssrc = Some(pkt.ssrc);
        }
        let ext = match self.seq.update(pkt.sequence) {
            SeqUpdate::Ext(e) => e,
            SeqUpdate::Restart(e) => {
                self.stats.resyncs += 1;
                self.flush();
                e
            }
            SeqUpdate::Jump => {
                self.stats.received += 1;
                self.stats.seq_jumps += 1;
                return InsertOutcome::Ignored;
            }
        };
        self.stats.received += 1;
        match self.window_max {
            None => {
                self.window_max = Some(ext);
                self.recv_window = 1;
            }
            Some(max) if ext > max => {
                let shift = ext - max;
                self.recv_window = if shift >= 128 {
                    0
                } else {
                    self.recv_window << shift
                };
                self.recv_window |= 1;
                self.window_max = Some(ext);
            }
            Some(max) => {
                let back = max - ext;
                if back >= 128 {
                    self.stats.late += 1;
                    return InsertOutcome::Late;
                }
                let bit = 1u128 << back;
                if self.recv_window & bit != 0 {
                    self.stats.duplicate += 1;
                    return InsertOutcome::Duplicate;
                }
                self.recv_window |= bit;
                self.stats.reordered += 1;
            }
        }
        if let Some(ns) = self.next_seq {
            if ext < ns {
                self.stats.late += 1;
                return InsertOutcome::Late;
            }
        }
        let (ext_ts, dur_rtp) = match kind {
            PacketKind::NoAudio => (0, 0),
            PacketKind::Audio => {
                let Some(dur) = self.spec.payload_duration_rtp(pkt.payload) else {
                    self.stats.decode_errors += 1;
                    return InsertOutcome::Ignored;
                };
                if pkt.payload.len() > self.slot_bytes {
                    self.stats.oversize += 1;
                    return InsertOutcome::Ignored;
                }
                let ext_ts = self.ts.update(pkt.timestamp);
                let transit = arrival_secs * self.spec.rtp_clock_hz() as f64 - ext_ts as f64;
                if let Some(prev) = self.last_transit {
                    let d = (transit - prev).abs();
                    self.jitter_rtp += (d - self.jitter_rtp) / 16.0;
                }
                self.last_transit = Some(transit);
                self.pkt_max_rtp = self.pkt_max_rtp.max(dur as u64);
                // A buffer shallower than one packet underruns between
                // packets: long packets raise the target at once.
                self.target_rtp = self.target_rtp.max((dur as u64).min(self.max_rtp));
                (ext_ts, dur as u64)
            }
        };
        // Room: the ring holds `slots` consecutive sequence numbers from the
        // oldest one still needed.
        let n = self.slots.len() as u64;
        let base = self
            .next_seq
            .or_else(|| self.oldest_present())
            .unwrap_or(ext);
        if ext >= base + n {
            if self.playing {
                // Far behind the sender: start over from here.
                self.stats.overflow += 1;
                self.stats.resyncs += 1;
                self.flush();
                self.window_max = Some(ext);
                self.recv_window = 1;
                if kind == PacketKind::Audio {
                    self.ts.update(pkt.timestamp);
                }
            } else {
                for s in base..=ext - n {
                    if self.present(s).is_some() {
                        let i = self.idx(s);
                        self.slots[i].state = SlotState::Empty;
                        self.stats.overflow += 1;
                    }
                }
                if let Some(ns) = self.next_seq {
                    self.next_seq = Some(ns.max(ext + 1 - n));
                }
            }
        }
        let i = self.idx(ext);
        if self.slots[i].state != SlotState::Empty && self.slots[i].ext_seq != ext {
            self.stats.overflow += 1;
        }
        let len = pkt.payload.len();
        if kind == PacketKind::Audio {
            self.arena[i * self.slot_bytes..i * self.slot_bytes + len].copy_from_slice(pkt.payload);
        }
        self.slots[i] = Slot {
            state: if kind == PacketKind::Audio {
                SlotState::Audio
            } else {
                SlotState::NoAudio
            },
            ext_seq: ext,
            ext_ts,
            dur_rtp,
            len,
        };
        InsertOutcome::Stored
    }

    fn oldest_present(&self) -> Option<u64> {
        let max = self.window_max?;
        let n = self.slots.len() as u64;
        (max.saturating_sub(n - 1)..=max).find(|&s| self.present(s).is_some())
    }

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

    fn level_rtp(&self) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::super::packet::{parse, write_header};
    use super::*;
    use crate::g711::{linear_to_ulaw, Law};

    /// PCMU packets of 20 ms carrying a ramp of known values so that the
    /// output can be traced back to sequence numbers.
    struct Sender {
        seq: u16,
        ts: u32,
        ssrc: u32,
        buf: Vec<u8>,
    }

    impl Sender {
        fn new(seq: u16, ts: u32, ssrc: u32) -> Self {
            Sender {
                seq,
                ts,
                ssrc,
                buf: vec![0; 12 + 160],
            }
        }
        /// The next packet; its samples all encode `value`.
        fn next(&mut self, value: i16) -> Vec<u8> {
            write_header(&mut self.buf, false, 0, self.seq, self.ts, self.ssrc);
            self.buf[12..].fill(linear_to_ulaw(value));
            self.seq = self.seq.wrapping_add(1);
            self.ts = self.ts.wrapping_add(160);
            self.buf.clone()
        }
    }

    fn buffer() -> JitterBuffer {
        JitterBuffer::new(JitterConfig {
            spec: CodecSpec::PCMU,
            min_ms: 40,
            max_ms: 120,
            frame_ms: 80,
        })
        .unwrap()
    }

    fn insert(jb: &mut JitterBuffer, bytes: &[u8], t: f64) -> InsertOutcome {
        jb.insert(&parse(bytes).unwrap(), PacketKind::Audio, t)
    }

    /// Value carried by packet `i`: distinct per packet, exact in μ-law.
    fn value(i: usize) -> i16 {
        let mut tmp = [0f32];
        Law::Mu.decode(&[(i % 100) as u8 + 0x80], &mut tmp);
        (tmp[0] * 32768.0) as i16
    }

    fn packet_of(sample: f32) -> Option<usize> {
        (0..100).find(|&i| (value(i) as f32 / 32768.0 - sample).abs() < 1e-6)
    }

    #[test]
    fn reorders_and_drops_duplicates() {
        let mut jb = buffer();
        let mut tx = Sender::new(1000, 0, 7);
        let pkts: Vec<Vec<u8>> = (0..12).map(|i| tx.next(value(i))).collect();
        // Order: 0 2 1 3 3 5 4 6..11
        let order = [0, 2, 1, 3, 3, 5, 4, 6, 7, 8, 9, 10, 11];
        let mut outcomes = Vec::new();
        for (t, &i) in order.iter().enumerate() {
            outcomes.push(insert(&mut jb, &pkts[i], t as f64 * 0.02));
        }
        assert_eq!(outcomes[4], InsertOutcome::Duplicate);
        let s = jb.stats();
        assert_eq!((s.received, s.duplicate, s.reordered), (13, 1, 2));
        let mut out = vec![0f32; 640];
        let mut played = Vec::new();
        for _ in 0..3 {
            jb.pull(&mut out);
            for chunk in out.chunks(160) {
                played.push(packet_of(chunk[80]));
            }
        }
        let expect: Vec<Option<usize>> = (0..12).map(Some).collect();
        assert_eq!(played, expect, "in order, each once");
        assert_eq!(jb.stats().lost, 0);
    }

    #[test]
    fn conceals_a_lost_packet_and_counts_it() {
        let mut jb = buffer();
        let mut tx = Sender::new(65_530, 4_000_000_000, 9);
        let mut out = vec![0f32; 640];
        let mut t = 0.0;
        // Lose packet 6 (which also sits across the sequence wrap).
        for i in 0..40 {
            let p = tx.next(value(i));
            if i != 6 {
                insert(&mut jb, &p, t);
            }
            t += 0.02;
            if i % 4 == 3 && i >= 7 {
                jb.pull(&mut out);
            }
        }
        let s = *jb.stats();
        assert_eq!(s.lost, 1, "{s:?}");
        assert_eq!(s.concealed, 1);
        assert_eq!(s.concealed_samples, 160);
        assert_eq!(s.resyncs, 0, "the wrap is not a resync");
        assert_eq!(s.underruns, 0, "{s:?}");
    }

    #[test]
    fn underrun_conceals_and_rebuffers_then_new_ssrc_resyncs() {
        let mut jb = buffer();
        let mut tx = Sender::new(1, 0, 1);
        let mut out = vec![0f32; 640];
        for i in 0..8 {
            insert(&mut jb, &tx.next(value(i)), i as f64 * 0.02);
        }
        jb.pull(&mut out);
        jb.pull(&mut out);
        assert!(jb.is_playing());
        // Nothing more: the third pull underruns but still fills the frame.
        out.fill(9.0);
        jb.pull(&mut out);
        assert!(out.iter().all(|x| x.abs() <= 1.0));
        assert_eq!(jb.stats().underruns, 1);
        assert!(!jb.is_playing());
        assert!(jb.target_ms() > 40.0);
        // A new stream.
        let mut tx2 = Sender::new(50_000, 123, 2);
        for i in 0..10 {
            insert(&mut jb, &tx2.next(value(50 + i)), 1.0 + i as f64 * 0.02);
        }
        assert_eq!(jb.stats().ssrc_changes, 1);
        jb.pull(&mut out);
        assert!(jb.is_playing());
        assert_eq!(packet_of(out[80]), Some(50));
        assert_eq!(jb.stats().late, 0);
    }

    #[test]
    fn late_packets_are_dropped() {
        let mut jb = buffer();
        let mut tx = Sender::new(10, 0, 3);
        let pkts: Vec<Vec<u8>> = (0..20).map(|i| tx.next(value(i))).collect();
        for (i, p) in pkts.iter().enumerate() {
            if i != 2 {
                insert(&mut jb, p, i as f64 * 0.02);
            }
        }
        let mut out = vec![0f32; 640];
        jb.pull(&mut out);
        assert_eq!(jb.stats().lost, 1);
        assert_eq!(insert(&mut jb, &pkts[2], 0.5), InsertOutcome::Late);
        assert_eq!(jb.stats().late, 1);
    }

    #[test]
    fn every_pull_fills_the_frame_even_when_empty() {
        let mut jb = buffer();
        let mut out = vec![1f32; 640];
        for _ in 0..100 {
            jb.pull(&mut out);
            assert!(out.iter().all(|x| *x == 0.0));
        }
        assert_eq!(jb.stats().frames_out, 100);
    }

    #[test]
    fn opus_loss_uses_plc_or_fec() {
        use crate::MediaEncoder;
        let spec = CodecSpec::OPUS;
        let mut jb = JitterBuffer::new(JitterConfig {
            spec,
            min_ms: 40,
            max_ms: 120,
            frame_ms: 80,
        })
        .unwrap();
        let mut enc = MediaEncoder::new(spec).unwrap();
        let mut payload = [0u8; 1275];
        let mut buf = vec![0u8; 12 + 1275];
        let pcm: Vec<f32> = (0..480).map(|i| (i as f32 * 0.07).sin() * 0.2).collect();
        let mut out = vec![0f32; 1920];
        for i in 0..40u16 {
            let n = enc.encode(&pcm, &mut payload).unwrap();
            write_header(&mut buf, false, 111, i, i as u32 * 960, 5);
            buf[12..12 + n].copy_from_slice(&payload[..n]);
            if i != 9 && i != 20 && i != 21 {
                jb.insert(
                    &parse(&buf[..12 + n]).unwrap(),
                    PacketKind::Audio,
                    i as f64 * 0.02,
                );
            }
            if i % 4 == 3 && i >= 11 {
                jb.pull(&mut out);
            }
        }
        let s = jb.stats();
        assert_eq!(s.lost, 3, "{s:?}");
        assert_eq!(s.concealed, 2);
        assert_eq!(s.concealed_samples, 3 * 480);
        assert_eq!(s.decode_errors, 0);
    }
}
