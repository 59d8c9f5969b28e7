//! Digest nonces of one I/O core: signed, not stored, until used.
//!
//! A nonce is `hex(issued_ms ‖ serial ‖ HMAC-SHA-256(key, issued_ms ‖
//! serial)[..16])`, with a random key made when the core's endpoint starts.
//! Issuing one costs no memory, so a flood of unauthenticated INVITEs
//! cannot fill a table or push out a caller's nonce between its challenge
//! and its answer. A nonce is good for `sip.auth.nonce_seconds` from its
//! issue, on the core that issued it (the kernel keeps a peer on one core).
//!
//! Replays: the first time a nonce is used with a correct response, its
//! serial enters a table with its `nc`; later uses must carry a larger
//! `nc` (RFC 7616 §3.3, §5.13). The table only grows with requests whose
//! digest was right, holds at most `sip.auth.max_nonces` entries and drops
//! expired ones first. When it is full, the oldest nonce (of the table's
//! and the new one) is dropped and every nonce issued up to it counts as
//! stale from then on (a `watermark`), so a dropped entry can never be
//! replayed: its caller gets `stale=true` and
//! answers a fresh nonce without asking its user again.
//!
//! Invariants: serials grow with issue time, so the table's first entry
//! is its oldest; the table never exceeds its bound; nothing here panics
//! on any nonce text.

use ring::hmac;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Bytes of the MAC kept in a nonce (128 bits).
const MAC_BYTES: usize = 16;
/// Hex characters of a nonce: two u64 and the MAC.
const NONCE_HEX: usize = 2 * (8 + 8 + MAC_BYTES);

/// Why a nonce (with a correct response) was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not one this core issued (another core's, a restarted daemon's, or
    /// made up).
    Unknown,
    /// Older than `sip.auth.nonce_seconds`, or dropped from a full table.
    Expired,
    /// Its `nc` is not above the last one accepted.
    Replayed,
}

impl Refusal {
    /// For the `Warning` header and the log.
    pub fn why(self) -> &'static str {
        match self {
            Refusal::Unknown => "nonce not issued here",
            Refusal::Expired => "nonce expired",
            Refusal::Replayed => "nonce count replayed",
        }
    }
}

/// One core's nonces.
pub struct Nonces {
    key: hmac::Key,
    epoch: Instant,
    lifetime: Duration,
    max_used: usize,
    serial: u64,
    /// serial → (issued_ms, highest nc accepted).
    used: BTreeMap<u64, (u64, u32)>,
    /// Nonces with a serial up to this one are stale (dropped from `used`).
    watermark: u64,
}

impl Nonces {
    /// Nonces good for `lifetime`, at most `max_used` in the replay table,
    /// signed with a fresh random key (`None` if the system's random source
    /// fails: then no nonce can be trusted and auth cannot run).
    pub fn new(lifetime: Duration, max_used: usize, now: Instant) -> Option<Nonces> {
        let rng = ring::rand::SystemRandom::new();
        let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng).ok()?;
        Some(Nonces {
            key,
            epoch: now,
            lifetime,
            max_used: max_used.max(1),
            serial: 0,
            used: BTreeMap::new(),
            watermark: 0,
        })
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }

    fn mac(&self, body: &[u8; 16]) -> [u8; MAC_BYTES] {
        let tag = hmac::sign(&self.key, body);
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&tag.as_ref()[..MAC_BYTES]);
        out
    }

    /// A fresh nonce.
    pub fn issue(&mut self, now: Instant) -> String {
        self.serial += 1;
        let mut body = [0u8; 16];
        body[..8].copy_from_slice(&self.ms(now).to_be_bytes());
        body[8..].copy_from_slice(&self.serial.to_be_bytes());
        let mac = self.mac(&body);
        let mut s = String::with_capacity(NONCE_HEX);
        for b in body.iter().chain(mac.iter()) {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// `(issued_ms, serial)` of a nonce this core signed.
    fn open(&self, nonce: &str) -> Option<(u64, u64)> {
        if nonce.len() != NONCE_HEX || !nonce.is_ascii() {
            return None;
        }
        let mut bytes = [0u8; NONCE_HEX / 2];
        for (i, out) in bytes.iter_mut().enumerate() {
            *out = u8::from_str_radix(&nonce[2 * i..2 * i + 2], 16).ok()?;
        }
        let mut body = [0u8; 16];
        body.copy_from_slice(&bytes[..16]);
        // ring's verify compares the whole tag in constant time; the tag
        // here is truncated, so compare the prefix with `subtle`.
        let want = self.mac(&body);
        use subtle::ConstantTimeEq;
        if !bool::from(want.ct_eq(&bytes[16..])) {
            return None;
        }
        let issued = u64::from_be_bytes(body[..8].try_into().ok()?);
        let serial = u64::from_be_bytes(body[8..].try_into().ok()?);
        Some((issued, serial))
    }

    fn expired(&self, issued_ms: u64, now_ms: u64) -> bool {
        now_ms.saturating_sub(issued_ms) > self.lifetime.as_millis() as u64
    }

    /// Accepts `nonce` with count `nc` (the response was already checked),
    /// or says why not. Only an accepted use changes the table.
    pub fn accept(&mut self, nonce: &str, nc: u32, now: Instant) -> Result<(), Refusal> {
        let (issued, serial) = self.open(nonce).ok_or(Refusal::Unknown)?;
        let now_ms = self.ms(now);
        if serial > self.serial || issued > now_ms {
            return Err(Refusal::Unknown);
        }
        if self.expired(issued, now_ms) || serial <= self.watermark {
            return Err(Refusal::Expired);
        }
        // Expired entries go first (they are the oldest).
        while let Some((&s, &(i, _))) = self.used.first_key_value() {
            if !self.expired(i, now_ms) {
                break;
            }
            self.used.remove(&s);
        }
        if let Some((_, last)) = self.used.get_mut(&serial) {
            if nc <= *last {
                return Err(Refusal::Replayed);
            }
            *last = nc;
            return Ok(());
        }
        if self.used.len() >= self.max_used {
            let oldest = self.used.keys().next().copied().unwrap_or(u64::MAX);
            if serial < oldest {
                // This nonce is the oldest of all: its first use passes,
                // and the watermark makes every later one stale.
                self.watermark = self.watermark.max(serial);
                return Ok(());
            }
            self.used.pop_first();
            self.watermark = self.watermark.max(oldest);
        }
        self.used.insert(serial, (issued, nc));
        Ok(())
    }

    /// Entries in the replay table.
    pub fn used_len(&self) -> usize {
        self.used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nonces(max: usize) -> (Nonces, Instant) {
        let t0 = Instant::now();
        (Nonces::new(Duration::from_secs(30), max, t0).unwrap(), t0)
    }

    #[test]
    fn a_nonce_is_accepted_with_rising_counts_only() {
        let (mut n, t0) = nonces(16);
        let a = n.issue(t0);
        assert_eq!(a.len(), NONCE_HEX);
        assert_ne!(a, n.issue(t0), "every nonce is new");
        assert_eq!(n.accept(&a, 1, t0), Ok(()));
        assert_eq!(n.accept(&a, 1, t0), Err(Refusal::Replayed));
        assert_eq!(n.accept(&a, 3, t0), Ok(()));
        assert_eq!(n.accept(&a, 2, t0), Err(Refusal::Replayed));
        assert_eq!(n.used_len(), 1);
    }

    #[test]
    fn nonces_expire() {
        let (mut n, t0) = nonces(16);
        let a = n.issue(t0);
        let b = n.issue(t0);
        assert_eq!(n.accept(&a, 1, t0 + Duration::from_secs(30)), Ok(()));
        assert_eq!(
            n.accept(&b, 1, t0 + Duration::from_millis(30_001)),
            Err(Refusal::Expired)
        );
        // A used one expires as well, and leaves the table on the next use.
        assert_eq!(
            n.accept(&a, 2, t0 + Duration::from_secs(31)),
            Err(Refusal::Expired)
        );
        let later = t0 + Duration::from_secs(40);
        let c = n.issue(later);
        assert_eq!(n.accept(&c, 1, later), Ok(()));
        assert_eq!(n.used_len(), 1, "the expired entry was dropped");
    }

    #[test]
    fn forged_and_foreign_nonces_are_unknown() {
        let (mut n, t0) = nonces(16);
        let (other, _) = nonces(16);
        let a = n.issue(t0);
        // Another key (another core, an earlier run).
        let mut o = other;
        assert_eq!(o.accept(&a, 1, t0), Err(Refusal::Unknown));
        // One bit flipped in the time, the serial, the MAC.
        for pos in [1, 20, 40, NONCE_HEX - 1] {
            let mut bytes = a.clone().into_bytes();
            bytes[pos] = if bytes[pos] == b'0' { b'1' } else { b'0' };
            let forged = String::from_utf8(bytes).unwrap();
            assert_eq!(n.accept(&forged, 1, t0), Err(Refusal::Unknown), "{pos}");
        }
        for junk in [
            "",
            "zz",
            &a[1..],
            &format!("{a}0"),
            &"é".repeat(NONCE_HEX / 2),
        ] {
            assert_eq!(n.accept(junk, 1, t0), Err(Refusal::Unknown), "{junk:?}");
        }
        assert_eq!(n.used_len(), 0, "refusals leave no entry");
    }

    #[test]
    fn a_full_table_makes_older_nonces_stale_not_replayable() {
        let (mut n, t0) = nonces(2);
        let a = n.issue(t0);
        let b = n.issue(t0);
        let c = n.issue(t0);
        let d = n.issue(t0);
        assert_eq!(n.accept(&a, 1, t0), Ok(()));
        assert_eq!(n.accept(&c, 1, t0), Ok(()));
        // Full: `a` goes, and with it every nonce up to `a`.
        assert_eq!(n.accept(&d, 1, t0), Ok(()));
        assert_eq!(n.used_len(), 2);
        assert_eq!(n.accept(&a, 1, t0), Err(Refusal::Expired), "no replay");
        assert_eq!(n.accept(&a, 2, t0), Err(Refusal::Expired));
        // `b` was never used: its first use passes, but it is older than
        // everything in the table, so it is not kept and cannot come again.
        assert_eq!(n.accept(&b, 1, t0), Ok(()));
        assert_eq!(n.accept(&b, 2, t0), Err(Refusal::Expired));
        assert_eq!(n.accept(&c, 2, t0), Ok(()));
        assert_eq!(n.accept(&d, 2, t0), Ok(()));
        assert_eq!(n.accept(&d, 2, t0), Err(Refusal::Replayed));
        assert_eq!(n.used_len(), 2);
    }
}
