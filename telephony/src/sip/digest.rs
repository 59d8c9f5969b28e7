//! The Digest computation (RFC 7616 §3.4.1, as SIP uses it: RFC 3261 §22.4,
//! RFC 8760 for SHA-256) with `qop=auth`:
//!
//! ```text
//! HA1      = H(username ":" realm ":" password)
//! HA2      = H(method ":" uri)
//! response = H(HA1 ":" nonce ":" nc ":" cnonce ":" "auth" ":" HA2)
//! ```
//!
//! where H is MD5 or SHA-256 written as lower-case hex. The hashes are the
//! RustCrypto crates (`md-5`, `sha2`); the check compares in constant time
//! (`subtle`), so the time a wrong response takes says nothing about how
//! much of it was right. The `-sess` variants, SHA-512-256 and `auth-int`
//! are not offered (see docs/sip.md, "Not done").

use sha2::Digest as _;
use subtle::ConstantTimeEq;

/// A Digest algorithm moshid offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// `SHA-256` (RFC 7616, RFC 8760): offered first.
    Sha256,
    /// `MD5` (RFC 2617, RFC 3261): what older peers know.
    Md5,
}

impl Algorithm {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "SHA-256",
            Algorithm::Md5 => "MD5",
        }
    }

    /// The algorithm named `s` (case-insensitive), if moshid has it.
    pub fn parse(s: &str) -> Option<Algorithm> {
        [Algorithm::Sha256, Algorithm::Md5]
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
    }

    /// H(data) as lower-case hex.
    pub fn hex(self, data: &[u8]) -> String {
        match self {
            Algorithm::Sha256 => to_hex(&sha2::Sha256::digest(data)),
            Algorithm::Md5 => to_hex(&md5::Md5::digest(data)),
        }
    }
}

fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// What a `qop=auth` response is computed from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// `username`, unescaped.
    pub username: &'a str,
    /// `realm`, unescaped.
    pub realm: &'a str,
    /// The password.
    pub password: &'a str,
    /// The request's method.
    pub method: &'a str,
    /// `uri` as the peer sent it (the Request-URI).
    pub uri: &'a str,
    /// `nonce`.
    pub nonce: &'a str,
    /// `nc` as sent (8 hex digits).
    pub nc: &'a str,
    /// `cnonce`.
    pub cnonce: &'a str,
}

/// The expected `response` value (lower-case hex).
pub fn response(i: &Inputs<'_>) -> String {
    let h = |s: String| i.algorithm.hex(s.as_bytes());
    let ha1 = h(format!("{}:{}:{}", i.username, i.realm, i.password));
    let ha2 = h(format!("{}:{}", i.method, i.uri));
    h(format!(
        "{ha1}:{}:{}:{}:auth:{ha2}",
        i.nonce, i.nc, i.cnonce
    ))
}

/// The response to a challenge without `qop` (RFC 2069, still sent by
/// some registrars): `H(HA1 ":" nonce ":" HA2)`; `nc` and `cnonce` are
/// not used. moshid answers such challenges but never issues one.
pub fn response_without_qop(i: &Inputs<'_>) -> String {
    let h = |s: String| i.algorithm.hex(s.as_bytes());
    let ha1 = h(format!("{}:{}:{}", i.username, i.realm, i.password));
    let ha2 = h(format!("{}:{}", i.method, i.uri));
    h(format!("{ha1}:{}:{ha2}", i.nonce))
}

/// Whether `given` (lower-case hex) is the response `i` gives, compared in
/// constant time.
pub fn verify(i: &Inputs<'_>, given: &str) -> bool {
    let want = response(i);
    // Lengths are public (the algorithm's); the contents are compared
    // without an early exit.
    want.len() == given.len() && bool::from(want.as_bytes().ct_eq(given.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1: the same request answered with SHA-256 and MD5.
    fn rfc(algorithm: Algorithm) -> Inputs<'static> {
        Inputs {
            algorithm,
            username: "Mufasa",
            realm: "http-auth@example.org",
            password: "Circle of Life",
            method: "GET",
            uri: "/dir/index.html",
            nonce: "7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v",
            nc: "00000001",
            cnonce: "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
        }
    }

    #[test]
    fn rfc_7616_vectors() {
        assert_eq!(
            response(&rfc(Algorithm::Sha256)),
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
        );
        assert_eq!(
            response(&rfc(Algorithm::Md5)),
            "8ca523f5e9506fed4657c9700eebdbec"
        );
    }

    /// RFC 2617 §3.5's MD5 example (the one SIP stacks were written against).
    #[test]
    fn rfc_2617_vector() {
        let i = Inputs {
            algorithm: Algorithm::Md5,
            username: "Mufasa",
            realm: "testrealm@host.com",
            password: "Circle Of Life",
            method: "GET",
            uri: "/dir/index.html",
            nonce: "dcd98b7102dd2f0e8b11d0f600bfb0c093",
            nc: "00000001",
            cnonce: "0a4f113b",
        };
        assert_eq!(response(&i), "6629fae49393a05397450978507c4ef1");
    }

    #[test]
    fn verify_takes_only_the_right_response() {
        let i = rfc(Algorithm::Sha256);
        assert!(verify(
            &i,
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
        ));
        assert!(!verify(
            &i,
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c0"
        ));
        assert!(!verify(&i, "8ca523f5e9506fed4657c9700eebdbec"));
        assert!(!verify(&i, ""));
        let wrong = Inputs {
            password: "Circle of life",
            ..i
        };
        assert!(!verify(
            &wrong,
            "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
        ));
        assert_eq!(Algorithm::parse("sha-256"), Some(Algorithm::Sha256));
        assert_eq!(Algorithm::parse("md5"), Some(Algorithm::Md5));
        assert_eq!(Algorithm::parse("MD5-sess"), None);
    }
}
