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
//!
//! This file holds the state and the intake ([`JitterBuffer::insert`]:
//! ordering, duplicates, lateness, room in the ring); `playout.rs` the
//! playout ([`JitterBuffer::pull`]: decoding, concealment, depth
//! adaptation); `tests.rs` the unit tests.

use super::conceal::Concealer;
use super::packet::RtpPacket;
use super::seq::{SeqTracker, SeqUpdate, TsTracker};
use crate::{CodecError, CodecKind, CodecSpec, MediaDecoder};
use serde::Serialize;

mod playout;

/// Target growth on an underrun, and the excess that triggers a drop, in ms.
const STEP_MS: u32 = 20;
/// Length of the offset ramp smoothing a discontinuity, in milliseconds.
const RAMP_MS: u32 = 2;
/// Bytes a slot holds at least (a full Ethernet payload).
const MIN_SLOT_BYTES: usize = 1500;
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
        self.latch_ssrc(pkt.ssrc);
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
        if let Err(outcome) = self.mark_received(ext) {
            return outcome;
        }
        if let Some(ns) = self.next_seq {
            if ext < ns {
                self.stats.late += 1;
                return InsertOutcome::Late;
            }
        }
        let (ext_ts, dur_rtp) = match kind {
            PacketKind::NoAudio => (0, 0),
            PacketKind::Audio => match self.audio_timing(pkt, arrival_secs) {
                Ok(timing) => timing,
                Err(outcome) => return outcome,
            },
        };
        self.make_room(ext, pkt, kind);
        self.store(ext, pkt, kind, ext_ts, dur_rtp);
        InsertOutcome::Stored
    }

    /// Latches `ssrc`: a different source than the one played is a new
    /// stream, so the buffer and the sequence tracker start over (counted).
    fn latch_ssrc(&mut self, ssrc: u32) {
        if self.ssrc != Some(ssrc) {
            if self.ssrc.is_some() {
                self.stats.ssrc_changes += 1;
                self.flush();
                self.seq.reset();
            }
            self.ssrc = Some(ssrc);
        }
    }

    /// Records `ext` in the 128-packet bitmap of what arrived. `Err` is the
    /// outcome of a packet not to store: one too old for the bitmap (late)
    /// or one already in it (duplicate); an older packet not yet seen is
    /// counted as reordered and stored.
    fn mark_received(&mut self, ext: u64) -> Result<(), InsertOutcome> {
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
                    return Err(InsertOutcome::Late);
                }
                let bit = 1u128 << back;
                if self.recv_window & bit != 0 {
                    self.stats.duplicate += 1;
                    return Err(InsertOutcome::Duplicate);
                }
                self.recv_window |= bit;
                self.stats.reordered += 1;
            }
        }
        Ok(())
    }

    /// An audio packet's extended timestamp and duration in RTP ticks,
    /// updating the interarrival jitter (RFC 3550 §6.4.1) and the longest
    /// packet seen. `Err` (counted) for a payload the codec cannot size or
    /// a slot cannot hold.
    fn audio_timing(
        &mut self,
        pkt: &RtpPacket<'_>,
        arrival_secs: f64,
    ) -> Result<(u64, u64), InsertOutcome> {
        let Some(dur) = self.spec.payload_duration_rtp(pkt.payload) else {
            self.stats.decode_errors += 1;
            return Err(InsertOutcome::Ignored);
        };
        if pkt.payload.len() > self.slot_bytes {
            self.stats.oversize += 1;
            return Err(InsertOutcome::Ignored);
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
        Ok((ext_ts, dur as u64))
    }

    /// Makes room for `ext`: the ring holds `slots` consecutive sequence
    /// numbers from the oldest one still needed. While playing, a packet
    /// beyond that means the buffer is far behind the sender and starts
    /// over from it; while buffering, the oldest packets are dropped.
    fn make_room(&mut self, ext: u64, pkt: &RtpPacket<'_>, kind: PacketKind) {
        let n = self.slots.len() as u64;
        let base = self
            .next_seq
            .or_else(|| self.oldest_present())
            .unwrap_or(ext);
        if ext < base + n {
            return;
        }
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

    /// Stores the packet in `ext`'s slot (its payload copied into the
    /// arena); a different packet still there is overwritten (counted).
    fn store(
        &mut self,
        ext: u64,
        pkt: &RtpPacket<'_>,
        kind: PacketKind,
        ext_ts: u64,
        dur_rtp: u64,
    ) {
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
    }

    /// The oldest packet buffered, if any.
    fn oldest_present(&self) -> Option<u64> {
        let max = self.window_max?;
        let n = self.slots.len() as u64;
        (max.saturating_sub(n - 1)..=max).find(|&s| self.present(s).is_some())
    }
}

#[cfg(test)]
mod tests;
