//! Digest authentication of callers (RFC 3261 §22 over RFC 7616, RFC 8760
//! for SHA-256): the challenge a request without good credentials gets,
//! and the verification of the credentials a request brings.
//!
//! Which requests are challenged is the endpoint's rule (see
//! [`super::endpoint`]): INVITEs that create a dialog, from sources not in
//! `sip.allowed_sources`. Everything else within a dialog rides on the
//! dialog (RFC 3261 §22.1: ACK and CANCEL cannot be challenged), and
//! OPTIONS pings are answered without credentials.
//!
//! Verdicts: no Authorization for our realm → 401 with one
//! `WWW-Authenticate: Digest` per `sip.auth.algorithms`, each with
//! `qop="auth"`, a fresh nonce ([`moshid_telephony::sip::nonce`]) and the core's opaque;
//! a header that cannot be read, or lacks what `qop=auth` needs, or whose
//! `uri` is not the Request-URI → 400 with a `Warning` (RFC 7616 §3.4.6);
//! an unknown user, an algorithm not offered or a wrong response → 401
//! again (the same answer for each, so that usernames cannot be probed);
//! a correct response with a nonce that is expired, not ours, or replayed
//! (`nc` not above the last), or with another opaque → 401 with
//! `stale=true` (RFC 7616 §3.3: the peer may retry without asking its
//! user). Only a correct response on a good nonce is [`Verdict::Caller`].

use crate::config::sip::SipAuthConfig;
use moshid_telephony::sip::auth_header::{self, DigestResponse};
use moshid_telephony::sip::digest::{self, Algorithm};
use moshid_telephony::sip::message::Request;
use moshid_telephony::sip::nonce::Nonces;
use std::time::{Duration, Instant};

/// What a request's credentials earned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated as this username.
    Caller(String),
    /// 401 with fresh challenges; `stale` when the response was right but
    /// the nonce was not; `why` for the `Warning` and the log.
    Challenge {
        /// RFC 7616 `stale=true`.
        stale: bool,
        /// Why.
        why: String,
    },
    /// 400: the Authorization header is malformed.
    Malformed(String),
}

/// One core's authenticator.
pub struct Authenticator {
    realm: String,
    credentials: Vec<(String, String)>,
    algorithms: Vec<Algorithm>,
    nonces: Nonces,
    opaque: String,
}

impl Authenticator {
    /// From `sip.auth` (already validated); `None` when the system's random
    /// source cannot key the nonces (the endpoint then refuses to run).
    pub fn new(c: &SipAuthConfig, now: Instant) -> Option<Authenticator> {
        let nonces = Nonces::new(Duration::from_secs(c.nonce_seconds), c.max_nonces, now)?;
        let opaque = {
            use ring::rand::SecureRandom;
            let mut b = [0u8; 12];
            ring::rand::SystemRandom::new().fill(&mut b).ok()?;
            b.iter().map(|x| format!("{x:02x}")).collect()
        };
        Some(Authenticator {
            realm: c.realm.clone(),
            credentials: c
                .credentials
                .iter()
                .map(|(u, p)| (u.clone(), p.clone()))
                .collect(),
            algorithms: c
                .algorithms
                .iter()
                .filter_map(|a| Algorithm::parse(a))
                .collect(),
            nonces,
            opaque,
        })
    }

    /// The `WWW-Authenticate` header lines of a 401 (one nonce for all).
    pub fn challenge(&mut self, stale: bool, now: Instant) -> Vec<String> {
        let nonce = self.nonces.issue(now);
        let stale = if stale { ", stale=true" } else { "" };
        self.algorithms
            .iter()
            .map(|a| {
                format!(
                    "WWW-Authenticate: Digest realm=\"{}\", qop=\"auth\", algorithm={}, nonce=\"{nonce}\", opaque=\"{}\"{stale}",
                    self.realm,
                    a.name(),
                    self.opaque
                )
            })
            .collect()
    }

    /// Verifies the credentials of `req`.
    pub fn verify(&mut self, req: &Request, now: Instant) -> Verdict {
        let challenge = |why: &str| Verdict::Challenge {
            stale: false,
            why: why.to_string(),
        };
        // A request may carry credentials for several realms (one header
        // each, RFC 3261 §22.4): ours is the one to check; every header
        // must still be readable.
        let mut ours: Option<DigestResponse> = None;
        for value in req.msg.headers_named("Authorization") {
            let c = match auth_header::parse(value) {
                Ok(c) => c,
                Err(e) => return Verdict::Malformed(e.to_string()),
            };
            if !c.scheme.eq_ignore_ascii_case("Digest") || c.param("realm") != Some(&self.realm) {
                continue;
            }
            match DigestResponse::from_credentials(&c) {
                Ok(d) if ours.is_none() => ours = Some(d),
                Ok(_) => {
                    return Verdict::Malformed(format!(
                        "Authorization: two Digest answers for realm \"{}\"",
                        self.realm
                    ))
                }
                Err(e) => return Verdict::Malformed(e.to_string()),
            }
        }
        let Some(d) = ours else {
            return challenge("credentials required");
        };
        if d.uri != req.uri {
            return Verdict::Malformed("Authorization: uri is not the Request-URI".into());
        }
        let Some(algorithm) =
            Algorithm::parse(&d.algorithm).filter(|a| self.algorithms.contains(a))
        else {
            return challenge("algorithm not offered");
        };
        // An unknown user is checked against a password nobody has, so
        // that it costs what a known one does and answers the same.
        let (known, password) = match self.credentials.iter().find(|(u, _)| *u == d.username) {
            Some((_, p)) => (true, p.as_str()),
            None => (false, ""),
        };
        let right = digest::verify(
            &digest::Inputs {
                algorithm,
                username: &d.username,
                realm: &self.realm,
                password,
                method: &req.method,
                uri: &d.uri,
                nonce: &d.nonce,
                nc: &d.nc_text,
                cnonce: &d.cnonce,
            },
            &d.response,
        );
        if !(known && right) {
            return challenge("wrong credentials");
        }
        if d.opaque.as_deref() != Some(self.opaque.as_str()) {
            return Verdict::Challenge {
                stale: true,
                why: "opaque not issued here".into(),
            };
        }
        match self.nonces.accept(&d.nonce, d.nc, now) {
            Ok(()) => Verdict::Caller(d.username),
            Err(r) => Verdict::Challenge {
                stale: true,
                why: r.why().into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_telephony::sip::message::parse_request;

    fn authenticator(algorithms: &[&str]) -> Authenticator {
        let c = SipAuthConfig {
            credentials: [("alice".to_string(), "s3cret".to_string())].into(),
            algorithms: algorithms.iter().map(|a| a.to_string()).collect(),
            nonce_seconds: 10,
            ..SipAuthConfig::default()
        };
        Authenticator::new(&c, Instant::now()).unwrap()
    }

    fn invite(auth: &[&str]) -> Request {
        let mut text = String::from(
            "INVITE sip:moshi@127.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:5061;branch=z9hG4bK1\r\n\
             From: <sip:alice@127.0.0.1>;tag=1\r\nTo: <sip:moshi@127.0.0.1>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n",
        );
        for a in auth {
            text.push_str(&format!("Authorization: {a}\r\n"));
        }
        text.push_str("Content-Length: 0\r\n\r\n");
        parse_request(text.as_bytes()).unwrap().unwrap()
    }

    /// A param of a challenge header line.
    fn param(line: &str, name: &str) -> String {
        let creds = auth_header::parse(line.trim_start_matches("WWW-Authenticate:")).unwrap();
        creds.param(name).unwrap().to_string()
    }

    /// What a client answers to `challenge` (written independently of
    /// [`digest::response`], with the hash crates directly).
    #[allow(clippy::too_many_arguments)]
    fn answer(
        challenge: &str,
        algorithm: &str,
        user: &str,
        password: &str,
        uri: &str,
        nc: u32,
        cnonce: &str,
    ) -> String {
        let realm = param(challenge, "realm");
        let nonce = param(challenge, "nonce");
        let opaque = param(challenge, "opaque");
        let h = |s: String| -> String {
            use sha2::Digest;
            let bytes: Vec<u8> = if algorithm == "MD5" {
                md5::Md5::digest(s.as_bytes()).to_vec()
            } else {
                sha2::Sha256::digest(s.as_bytes()).to_vec()
            };
            bytes.iter().map(|b| format!("{b:02x}")).collect()
        };
        let ha1 = h(format!("{user}:{realm}:{password}"));
        let ha2 = h(format!("INVITE:{uri}"));
        let response = h(format!("{ha1}:{nonce}:{nc:08x}:{cnonce}:auth:{ha2}"));
        format!(
            "Digest username=\"{user}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", \
             response=\"{response}\", algorithm={algorithm}, qop=auth, nc={nc:08x}, cnonce=\"{cnonce}\", opaque=\"{opaque}\""
        )
    }

    const URI: &str = "sip:moshi@127.0.0.1:5060";

    #[test]
    fn challenges_one_header_per_algorithm_sha256_first() {
        let mut a = authenticator(&["SHA-256", "MD5"]);
        let now = Instant::now();
        let ch = a.challenge(false, now);
        assert_eq!(ch.len(), 2);
        assert_eq!(param(&ch[0], "algorithm"), "SHA-256");
        assert_eq!(param(&ch[1], "algorithm"), "MD5");
        for c in &ch {
            assert_eq!(param(c, "realm"), "moshid");
            assert_eq!(param(c, "qop"), "auth");
            assert!(!c.contains("stale"));
        }
        assert_eq!(param(&ch[0], "nonce"), param(&ch[1], "nonce"));
        assert_ne!(
            param(&ch[0], "nonce"),
            param(&a.challenge(true, now)[0], "nonce")
        );
        assert_eq!(param(&a.challenge(true, now)[1], "stale"), "true");
        assert_eq!(
            a.verify(&invite(&[]), now),
            Verdict::Challenge {
                stale: false,
                why: "credentials required".into()
            }
        );
    }

    #[test]
    fn right_answers_pass_wrong_ones_are_challenged() {
        let mut a = authenticator(&["SHA-256", "MD5"]);
        let now = Instant::now();
        for (i, alg) in ["SHA-256", "MD5"].into_iter().enumerate() {
            let ch = a.challenge(false, now)[i].clone();
            let good = answer(&ch, alg, "alice", "s3cret", URI, 1, "c0ffee");
            assert_eq!(
                a.verify(&invite(&[&good]), now),
                Verdict::Caller("alice".into()),
                "{alg}"
            );
            // The same answer again: a replay (right digest, used nc).
            assert!(matches!(
                a.verify(&invite(&[&good]), now),
                Verdict::Challenge { stale: true, .. }
            ));
            let next = answer(&ch, alg, "alice", "s3cret", URI, 2, "c0ffee");
            assert_eq!(
                a.verify(&invite(&[&next]), now),
                Verdict::Caller("alice".into())
            );
        }
        let ch = a.challenge(false, now)[0].clone();
        for (user, password) in [("alice", "wrong"), ("bob", "s3cret"), ("Alice", "s3cret")] {
            let bad = answer(&ch, "SHA-256", user, password, URI, 1, "c");
            assert_eq!(
                a.verify(&invite(&[&bad]), now),
                Verdict::Challenge {
                    stale: false,
                    why: "wrong credentials".into()
                },
                "{user}/{password}"
            );
        }
        // Not offered: MD5 when only SHA-256 is.
        let mut only = authenticator(&["SHA-256"]);
        let ch = only.challenge(false, now)[0].clone();
        let md5 = answer(&ch, "MD5", "alice", "s3cret", URI, 1, "c");
        assert!(matches!(
            only.verify(&invite(&[&md5]), now),
            Verdict::Challenge { stale: false, .. }
        ));
    }

    #[test]
    fn stale_nonces_and_foreign_opaques() {
        let mut a = authenticator(&["SHA-256"]);
        let t0 = Instant::now();
        let ch = a.challenge(false, t0)[0].clone();
        let good = answer(&ch, "SHA-256", "alice", "s3cret", URI, 1, "c");
        assert_eq!(
            a.verify(&invite(&[&good]), t0 + Duration::from_secs(11)),
            Verdict::Challenge {
                stale: true,
                why: "nonce expired".into()
            }
        );
        // Another core's nonce and opaque (its own key).
        let mut other = authenticator(&["SHA-256"]);
        assert!(matches!(
            other.verify(&invite(&[&good]), t0),
            Verdict::Challenge { stale: true, .. }
        ));
        let swapped = good.replace(&param(&ch, "opaque"), "0000");
        assert!(matches!(
            a.verify(&invite(&[&swapped]), t0),
            Verdict::Challenge { stale: true, .. }
        ));
    }

    #[test]
    fn malformed_and_mismatched_headers() {
        let mut a = authenticator(&["SHA-256", "MD5"]);
        let now = Instant::now();
        let ch = a.challenge(false, now)[0].clone();
        let good = answer(&ch, "SHA-256", "alice", "s3cret", URI, 1, "c");
        let cases = [
            "Digest".to_string(),
            "Digest username=\"alice".to_string(),
            good.replace(", qop=auth", ""),
            good.replace("nc=00000001", "nc=1"),
            good.replace(&format!("uri=\"{URI}\""), "uri=\"sip:other@h\""),
        ];
        for c in &cases {
            assert!(
                matches!(a.verify(&invite(&[c.as_str()]), now), Verdict::Malformed(_)),
                "{c}"
            );
        }
        // Another realm's credentials (for a proxy, say) are passed over.
        let theirs = good.replace("realm=\"moshid\"", "realm=\"pbx\"");
        assert!(matches!(
            a.verify(&invite(&[&theirs]), now),
            Verdict::Challenge { stale: false, .. }
        ));
        assert_eq!(
            a.verify(&invite(&[&theirs, &good]), now),
            Verdict::Caller("alice".into())
        );
        // Two answers for our realm: which would count? Neither.
        assert!(matches!(
            a.verify(&invite(&[&good, &good]), now),
            Verdict::Malformed(_)
        ));
    }
}
