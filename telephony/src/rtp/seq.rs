//! Extended RTP sequence numbers and timestamps: 16- and 32-bit counters
//! that wrap, unfolded into monotonic 64-bit values (RFC 3550 Appendix A.1).
//!
//! Invariants: a packet within `MAX_MISORDER` behind or `MAX_DROPOUT` ahead
//! of the highest sequence number seen is placed exactly, across any number
//! of wraps. A larger jump is refused once; the packet that follows it in
//! sequence confirms a restart (the sender reset its numbering). Extended
//! values start high (`EXT_BASE`) so that packets older than the first
//! one stay representable.

/// Largest forward jump accepted as loss, in packets (RFC 3550 A.1).
pub const MAX_DROPOUT: u16 = 3000;
/// Largest backward distance accepted as reordering, in packets.
pub const MAX_MISORDER: u16 = 100;
/// Where extended sequence numbers start.
pub const EXT_BASE: u64 = 1 << 32;

/// What a sequence number is relative to the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqUpdate {
    /// Placed; the extended number.
    Ext(u64),
    /// A jump confirmed by its successor: the stream restarted at this
    /// extended number (everything before it is stale).
    Restart(u64),
    /// A jump not (yet) confirmed: the packet is not used.
    Jump,
}

/// Unfolds one stream's sequence numbers.
#[derive(Debug, Clone, Default)]
pub struct SeqTracker {
    max_ext: Option<u64>,
    bad_seq: Option<u16>,
}

impl SeqTracker {
    /// Forgets the stream.
    pub fn reset(&mut self) {
        *self = SeqTracker::default();
    }

    /// The highest extended number seen.
    pub fn max_ext(&self) -> Option<u64> {
        self.max_ext
    }

    /// Places `seq`.
    pub fn update(&mut self, seq: u16) -> SeqUpdate {
        let Some(max) = self.max_ext else {
            let ext = EXT_BASE + seq as u64;
            self.max_ext = Some(ext);
            return SeqUpdate::Ext(ext);
        };
        let delta = seq.wrapping_sub(max as u16);
        if delta < MAX_DROPOUT {
            let ext = max + delta as u64;
            self.max_ext = Some(ext);
            self.bad_seq = None;
            SeqUpdate::Ext(ext)
        } else if delta > u16::MAX - MAX_MISORDER {
            let back = (u16::MAX - delta) as u64 + 1;
            SeqUpdate::Ext(max - back)
        } else if self.bad_seq == Some(seq) {
            // Two in a row after a jump: the sender restarted. Keep extended
            // numbers increasing across the restart.
            let ext = (max + 65_536) & !0xFFFF | seq as u64;
            let ext = if ext <= max { ext + 65_536 } else { ext };
            self.max_ext = Some(ext);
            self.bad_seq = None;
            SeqUpdate::Restart(ext)
        } else {
            self.bad_seq = Some(seq.wrapping_add(1));
            SeqUpdate::Jump
        }
    }
}

/// Unfolds one stream's 32-bit timestamps (signed distance to the last one).
#[derive(Debug, Clone, Default)]
pub struct TsTracker {
    last_ext: Option<u64>,
}

/// Where extended timestamps start.
pub const TS_EXT_BASE: u64 = 1 << 40;

impl TsTracker {
    /// Forgets the stream.
    pub fn reset(&mut self) {
        self.last_ext = None;
    }

    /// Places `ts` within ±2³¹ of the previous timestamp.
    pub fn update(&mut self, ts: u32) -> u64 {
        let ext = match self.last_ext {
            None => TS_EXT_BASE + ts as u64,
            Some(last) => {
                let delta = ts.wrapping_sub(last as u32) as i32 as i64;
                (last as i64 + delta) as u64
            }
        };
        self.last_ext = Some(ext);
        ext
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_forward_and_back() {
        let mut t = SeqTracker::default();
        let SeqUpdate::Ext(a) = t.update(65_534) else {
            panic!()
        };
        assert_eq!(t.update(65_535), SeqUpdate::Ext(a + 1));
        assert_eq!(t.update(0), SeqUpdate::Ext(a + 2));
        assert_eq!(t.update(2), SeqUpdate::Ext(a + 4));
        // A late packet from before the wrap.
        assert_eq!(t.update(65_535), SeqUpdate::Ext(a + 1));
        assert_eq!(t.update(1), SeqUpdate::Ext(a + 3));
        assert_eq!(t.max_ext(), Some(a + 4));
        // Many wraps in order.
        let mut s = 2u16;
        let mut e = a + 4;
        for _ in 0..200_000 {
            s = s.wrapping_add(1);
            e += 1;
            assert_eq!(t.update(s), SeqUpdate::Ext(e));
        }
    }

    #[test]
    fn a_jump_needs_confirmation() {
        let mut t = SeqTracker::default();
        let SeqUpdate::Ext(a) = t.update(100) else {
            panic!()
        };
        assert_eq!(t.update(30_000), SeqUpdate::Jump);
        assert_eq!(t.update(101), SeqUpdate::Ext(a + 1));
        assert_eq!(t.update(40_000), SeqUpdate::Jump);
        let SeqUpdate::Restart(r) = t.update(40_001) else {
            panic!()
        };
        assert!(r > a + 1);
        assert_eq!(r & 0xFFFF, 40_001);
        assert_eq!(t.update(40_002), SeqUpdate::Ext(r + 1));
    }

    #[test]
    fn timestamps_unfold() {
        let mut t = TsTracker::default();
        let a = t.update(u32::MAX - 159);
        assert_eq!(t.update(0), a + 160);
        assert_eq!(t.update(160), a + 320);
        assert_eq!(t.update(0), a + 160);
    }
}
