//! Answering a digest challenge (RFC 3261 §22.2, RFC 7616, RFC 8760): the
//! client side of [`moshid_telephony::sip::digest`], for the requests moshid sends itself
//! (the INVITEs of the calls it places, its REGISTERs).
//!
//! A 401 carries `WWW-Authenticate`, a 407 `Proxy-Authenticate`, one per
//! algorithm offered; moshid picks SHA-256 over MD5 among those it can
//! answer, takes `qop=auth` when offered (or none: RFC 2069's form), and
//! answers with `Authorization` or `Proxy-Authorization`. A challenge is
//! kept so that later requests to the same server (a REGISTER's refresh)
//! carry credentials at once, `nc` counting up, until a new challenge
//! replaces it.
//!
//! Invariants: never panics on any header (the parser is
//! [`moshid_telephony::sip::auth_header::parse`], fuzzed); a challenge moshid cannot answer
//! (another scheme, `auth-int` only, an unknown algorithm) is an error
//! naming why, so the request fails with that reason instead of looping.

use crate::config::sip::SipClientCredentials;
use moshid_telephony::sip::auth_header;
use moshid_telephony::sip::digest::{self, Algorithm, Inputs};
use moshid_telephony::sip::message::Message;
use moshid_telephony::sip::quoted_string::{self, QuotedStringError};

/// A challenge moshid can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// From a 407 (answered with `Proxy-Authorization`).
    pub proxy: bool,
    /// The algorithm picked.
    pub algorithm: Algorithm,
    /// `realm`.
    pub realm: String,
    /// `nonce`.
    pub nonce: String,
    /// `opaque`, returned as given.
    pub opaque: Option<String>,
    /// Whether `qop=auth` is used (else RFC 2069's form).
    pub qop_auth: bool,
    /// The last `nc` sent with this nonce.
    pub nc: u32,
}

/// Reads the challenges of a 401 or 407 response and picks the one to
/// answer.
pub fn pick(response: &Message, code: u16) -> Result<Challenge, String> {
    let (name, proxy) = match code {
        401 => ("WWW-Authenticate", false),
        407 => ("Proxy-Authenticate", true),
        _ => return Err(format!("{code} is not a challenge")),
    };
    let mut best: Option<Challenge> = None;
    let mut why = format!("no {name} header");
    for value in response.headers_named(name) {
        let c = match auth_header::parse(value) {
            Ok(c) => c,
            Err(e) => {
                why = format!("{name}: {}", e.0);
                continue;
            }
        };
        if !c.scheme.eq_ignore_ascii_case("Digest") {
            why = format!("{name}: scheme `{}` (moshid answers Digest)", c.scheme);
            continue;
        }
        let algorithm = match c.param("algorithm") {
            None => Algorithm::Md5,
            Some(a) => match Algorithm::parse(a) {
                Some(a) => a,
                None => {
                    why = format!("{name}: algorithm `{a}` (moshid answers SHA-256 and MD5)");
                    continue;
                }
            },
        };
        let qop_auth = match c.param("qop") {
            None => false,
            Some(q) if q.split(',').any(|t| t.trim().eq_ignore_ascii_case("auth")) => true,
            Some(q) => {
                why = format!("{name}: qop `{q}` (moshid answers qop=auth)");
                continue;
            }
        };
        let (Some(realm), Some(nonce)) = (c.param("realm"), c.param("nonce")) else {
            why = format!("{name}: no realm or nonce");
            continue;
        };
        let candidate = Challenge {
            proxy,
            algorithm,
            realm: realm.to_string(),
            nonce: nonce.to_string(),
            opaque: c.param("opaque").map(str::to_string),
            qop_auth,
            nc: 0,
        };
        let better = match &best {
            None => true,
            Some(b) => b.algorithm == Algorithm::Md5 && algorithm == Algorithm::Sha256,
        };
        if better {
            best = Some(candidate);
        }
    }
    best.ok_or(why)
}

impl Challenge {
    /// The header line (`Authorization: …` or `Proxy-Authorization: …`)
    /// for a request of `method` to `uri`, with `cnonce`; counts `nc` up.
    ///
    /// The realm, nonce and opaque go back as the challenge gave them:
    /// their values (what the digest is computed over, RFC 7616 §3.4's
    /// `unq()`) written by [`quoted_string::write`], so a control character
    /// the server escaped is escaped again. `Err` names a value no quoted
    /// string can carry (a line break; the parser never yields one, and
    /// `sip.*.auth.username` and the URIs are checked before they get here).
    pub fn answer(
        &mut self,
        creds: &SipClientCredentials,
        method: &str,
        uri: &str,
        cnonce: &str,
    ) -> Result<String, String> {
        self.nc = self.nc.wrapping_add(1).max(1);
        let nc = format!("{:08x}", self.nc);
        let inputs = Inputs {
            algorithm: self.algorithm,
            username: &creds.username,
            realm: &self.realm,
            password: &creds.password,
            method,
            uri,
            nonce: &self.nonce,
            nc: &nc,
            cnonce,
        };
        let name = if self.proxy {
            "Proxy-Authorization"
        } else {
            "Authorization"
        };
        let q = |what: &str, v: &str| {
            quoted_string::quoted(v)
                .map_err(|e: QuotedStringError| format!("{name}: `{what}`: {e}"))
        };
        let mut h = format!(
            "{name}: Digest username={}, realm={}, nonce={}, uri={}, algorithm={}",
            q("username", &creds.username)?,
            q("realm", &self.realm)?,
            q("nonce", &self.nonce)?,
            q("uri", uri)?,
            self.algorithm.name()
        );
        if self.qop_auth {
            let response = digest::response(&inputs);
            h.push_str(&format!(
                ", response=\"{response}\", qop=auth, nc={nc}, cnonce={}",
                q("cnonce", cnonce)?
            ));
        } else {
            let response = digest::response_without_qop(&inputs);
            h.push_str(&format!(", response=\"{response}\""));
        }
        if let Some(o) = &self.opaque {
            h.push_str(&format!(", opaque={}", q("opaque", o)?));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moshid_telephony::sip::message::parse;

    fn creds() -> SipClientCredentials {
        SipClientCredentials {
            username: "alice".into(),
            password: "s3cret".into(),
        }
    }

    fn response_with(headers: &str, code: u16) -> Message {
        let text = format!(
            "SIP/2.0 {code} X\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nFrom: <sip:a@h>;tag=1\r\n\
             To: <sip:b@h>;tag=2\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n{headers}Content-Length: 0\r\n\r\n"
        );
        parse(text.as_bytes()).unwrap()
    }

    /// The answer is what moshid's own server side verifies (the same
    /// digest, computed from the header the client wrote).
    #[test]
    fn picks_sha256_and_answers_verifiably() {
        let m = response_with(
            "WWW-Authenticate: Digest realm=\"r\", qop=\"auth\", algorithm=MD5, nonce=\"n1\"\r\n\
             WWW-Authenticate: Digest realm=\"r\", qop=\"auth,auth-int\", algorithm=SHA-256, nonce=\"n1\", opaque=\"o\"\r\n",
            401,
        );
        let mut c = pick(&m, 401).unwrap();
        assert_eq!(
            (c.algorithm, c.proxy, c.qop_auth),
            (Algorithm::Sha256, false, true)
        );
        let h = c.answer(&creds(), "INVITE", "sip:b@h", "cn").unwrap();
        let value = h.strip_prefix("Authorization: ").unwrap();
        let parsed = auth_header::parse(value).unwrap();
        let r = auth_header::DigestResponse::from_credentials(&parsed).unwrap();
        assert_eq!((r.nc, r.opaque.as_deref()), (1, Some("o")));
        let inputs = Inputs {
            algorithm: Algorithm::Sha256,
            username: "alice",
            realm: "r",
            password: "s3cret",
            method: "INVITE",
            uri: "sip:b@h",
            nonce: "n1",
            nc: &r.nc_text,
            cnonce: &r.cnonce,
        };
        assert!(digest::verify(&inputs, &r.response));
        // The next request with the same challenge counts nc up.
        let h2 = c.answer(&creds(), "REGISTER", "sip:h", "cn2").unwrap();
        assert!(h2.contains("nc=00000002"), "{h2}");
    }

    /// RFC 2617 §3.5's example (MD5, qop=auth) as the client computes it.
    #[test]
    fn rfc_2617_example() {
        let m = response_with(
            "Proxy-Authenticate: Digest realm=\"testrealm@host.com\", qop=\"auth\", \
             nonce=\"dcd98b7102dd2f0e8b11d0f600bfb0c093\", opaque=\"5ccc069c403ebaf9f0171e9517f40e41\"\r\n",
            407,
        );
        let mut c = pick(&m, 407).unwrap();
        assert!(c.proxy);
        let creds = SipClientCredentials {
            username: "Mufasa".into(),
            password: "Circle Of Life".into(),
        };
        let h = c
            .answer(&creds, "GET", "/dir/index.html", "0a4f113b")
            .unwrap();
        assert!(h.starts_with("Proxy-Authorization: Digest "), "{h}");
        assert!(
            h.contains("response=\"6629fae49393a05397450978507c4ef1\""),
            "{h}"
        );
    }

    #[test]
    fn without_qop_and_refusals() {
        let m = response_with("WWW-Authenticate: Digest realm=\"r\", nonce=\"n\"\r\n", 401);
        let mut c = pick(&m, 401).unwrap();
        assert!(!c.qop_auth);
        let h = c.answer(&creds(), "REGISTER", "sip:h", "x").unwrap();
        assert!(!h.contains("qop") && !h.contains("cnonce"), "{h}");
        let inputs = Inputs {
            algorithm: Algorithm::Md5,
            username: "alice",
            realm: "r",
            password: "s3cret",
            method: "REGISTER",
            uri: "sip:h",
            nonce: "n",
            nc: "",
            cnonce: "",
        };
        assert!(h.contains(&digest::response_without_qop(&inputs)));
        for (headers, code) in [
            ("", 401),
            ("WWW-Authenticate: Basic realm=\"r\"\r\n", 401),
            (
                "WWW-Authenticate: Digest realm=\"r\", nonce=\"n\", algorithm=SHA-512-256\r\n",
                401,
            ),
            (
                "WWW-Authenticate: Digest realm=\"r\", nonce=\"n\", qop=\"auth-int\"\r\n",
                401,
            ),
            ("WWW-Authenticate: Digest realm=\"r\"\r\n", 401),
            ("WWW-Authenticate: Digest realm=\"r\", nonce=\"n\"\r\n", 407),
            ("WWW-Authenticate: Digest realm=\"r\", nonce=\"n\"\r\n", 403),
            ("WWW-Authenticate: Digest realm=\"r, nonce=\"n\r\n", 401),
        ] {
            assert!(
                pick(&response_with(headers, code), code).is_err(),
                "{headers}"
            );
        }
        // Quotes in values are escaped.
        let m = response_with(
            "WWW-Authenticate: Digest realm=\"a\\\"b\", nonce=\"n\"\r\n",
            401,
        );
        let h = pick(&m, 401)
            .unwrap()
            .answer(&creds(), "INVITE", "sip:x", "c")
            .unwrap();
        assert!(h.contains(r#"realm="a\"b""#), "{h}");
    }

    /// A 401 whose realm holds an escaped control character (0x1c), as
    /// RFC 3261 §25.1's quoted-pair allows (found by fuzzing
    /// `sip_client_response`; the same bytes are a seed in
    /// `fuzz/corpus/sip_client_response/`). The answer escapes it again,
    /// moshid's own server-side parser reads it back to the same realm,
    /// and the digest is computed over the unescaped realm.
    #[test]
    fn echoes_an_escaped_control_character_in_the_realm() {
        use base64::Engine;
        const FOUND: &str = "U0lQLzIuMCA0MDEgU2VxOiAxSVROVkVJIA0KV1dXLUF1dGhlbnRpY2F0ZTogRGlnZXN0IHJlYWxtPSJwYnguUFBQUFBQUFBJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSUlJSVBQUFBQUFBQUFBQUFBQUFBQUFBQUFBdXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1cXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXFxcXBxcXFxcXFxcXFxcXFxcXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1TXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXV1dXVBQdGVzdCIsIG5vbmNlPSI0N0RvbnRhMWQ5YzMxIiwgcW9wPSJhdXRoIiwgYWxnb3JpdGhtPU1ENSwgb3BhcXVlPSJvcDAiDQpDb250ZW50LUxlbmd0aDogMA0KDQo=";
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(FOUND)
            .unwrap();
        let m = parse(&bytes).unwrap();
        let mut c = pick(&m, 401).unwrap();
        // On the wire: 47 backslashes, 0x1c, 13 backslashes, `]` — that is
        // 23 escaped backslashes, an escaped 0x1c, 6 escaped backslashes
        // and an escaped `]`.
        let bs = |n: usize| "\\".repeat(n);
        let meant = format!("{}\u{1c}{}]", bs(23), bs(6));
        assert!(c.realm.contains(&meant), "{:?}", c.realm);
        let h = c
            .answer(&creds(), "INVITE", "sip:a@127.0.0.1", "0123abcd")
            .unwrap();
        // Written back: the same escapes, but for the `]` that needs none.
        let written = format!("{}\u{1c}{}]", bs(47), bs(12));
        assert!(h.contains(&written), "escaped again: {h:?}");
        let value = h.strip_prefix("Authorization: ").unwrap();
        let r = auth_header::DigestResponse::from_credentials(&auth_header::parse(value).unwrap())
            .unwrap();
        assert_eq!(r.realm, c.realm);
        assert_eq!(r.opaque.as_deref(), Some("op0"));
        let inputs = Inputs {
            algorithm: Algorithm::Md5,
            username: "alice",
            realm: &c.realm,
            password: "s3cret",
            method: "INVITE",
            uri: "sip:a@127.0.0.1",
            nonce: "47Donta1d9c31",
            nc: &r.nc_text,
            cnonce: &r.cnonce,
        };
        assert!(digest::verify(&inputs, &r.response));
    }

    /// A value no quoted string can carry is an error, not a broken header.
    #[test]
    fn refuses_to_write_a_line_break() {
        let m = response_with("WWW-Authenticate: Digest realm=\"r\", nonce=\"n\"\r\n", 401);
        let mut c = pick(&m, 401).unwrap();
        let why = c
            .answer(&creds(), "INVITE", "sip:x\r\nVia: y", "c")
            .unwrap_err();
        assert!(why.contains("`uri`"), "{why}");
    }
}
