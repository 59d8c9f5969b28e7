//! The `Authorization` header of a SIP request (RFC 3261 §20.7 and §25.1,
//! RFC 7616 §3.4): a scheme, then comma-separated `name=value` parameters
//! whose values are tokens or quoted strings; and the typed view of a
//! Digest response the endpoint verifies.
//!
//! Hand-written, like the rest of the SIP grammar here: the header is a
//! short list, and what matters is that every input gets a clear answer.
//! Parameter names are case-insensitive (kept lower-cased); quoted strings
//! may hold commas and quoted-pairs (read, and unescaped, by
//! [`super::quoted_string`], the one grammar moshid reads and writes them
//! with); a value may be a token without quotes (`qop=auth`,
//! `nc=00000001`). The same parser reads the challenges moshid answers as
//! a client (`WWW-Authenticate`, `Proxy-Authenticate`).
//!
//! Invariants: parsing never panics on any input (fuzzed:
//! `fuzz/fuzz_targets/sip_auth_header.rs`); at most [`MAX_PARAMS`]
//! parameters are read; a parameter named twice is an error, so there is
//! never a question of which one was verified.

use super::message::is_token_byte;
use super::quoted_string;

/// Parameters accepted in one header.
pub const MAX_PARAMS: usize = 32;

/// Why an `Authorization` header could not be read (the request gets 400
/// with this in a `Warning`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Authorization: {0}")]
pub struct AuthHeaderError(pub String);

fn err(why: impl Into<String>) -> AuthHeaderError {
    AuthHeaderError(why.into())
}

/// A parsed header: the scheme and its parameters in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The scheme as sent (`Digest`; compared case-insensitively).
    pub scheme: String,
    /// `(lower-cased name, unescaped value)` in order, each name once.
    pub params: Vec<(String, String)>,
}

impl Credentials {
    /// The value of parameter `name` (lower-case).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    i
}

/// Reads an `Authorization` (or `Proxy-Authorization`) value.
pub fn parse(value: &str) -> Result<Credentials, AuthHeaderError> {
    let b = value.as_bytes();
    let mut i = skip_ws(b, 0);
    let start = i;
    while i < b.len() && is_token_byte(b[i]) {
        i += 1;
    }
    if i == start {
        return Err(err("no scheme"));
    }
    let scheme = value[start..i].to_string();
    if i < b.len() && b[i] != b' ' && b[i] != b'\t' {
        return Err(err("bad scheme"));
    }
    let mut params: Vec<(String, String)> = Vec::new();
    i = skip_ws(b, i);
    if i == b.len() {
        return Err(err("no parameters"));
    }
    loop {
        // name
        let n0 = i;
        while i < b.len() && is_token_byte(b[i]) {
            i += 1;
        }
        if i == n0 {
            return Err(err("a parameter without a name"));
        }
        let name = value[n0..i].to_ascii_lowercase();
        i = skip_ws(b, i);
        if b.get(i) != Some(&b'=') {
            return Err(err(format!("parameter `{}` without `=`", clip(&name))));
        }
        i = skip_ws(b, i + 1);
        // value: quoted string or token
        let v = if b.get(i) == Some(&b'"') {
            let (v, end) = quoted_string::read(value, i)
                .map_err(|e| err(format!("parameter `{}`: {e}", clip(&name))))?;
            i = end;
            v
        } else {
            let v0 = i;
            while i < b.len() && is_token_byte(b[i]) {
                i += 1;
            }
            if i == v0 {
                return Err(err(format!("parameter `{}` without a value", clip(&name))));
            }
            value[v0..i].to_string()
        };
        if params.iter().any(|(n, _)| *n == name) {
            return Err(err(format!("parameter `{}` given twice", clip(&name))));
        }
        if params.len() >= MAX_PARAMS {
            return Err(err(format!("more than {MAX_PARAMS} parameters")));
        }
        params.push((name, v));
        i = skip_ws(b, i);
        match b.get(i) {
            None => break,
            Some(b',') => {
                i = skip_ws(b, i + 1);
                if i == b.len() {
                    return Err(err("a trailing comma"));
                }
            }
            Some(_) => return Err(err("parameters must be separated by commas")),
        }
    }
    Ok(Credentials { scheme, params })
}

fn clip(s: &str) -> String {
    s.chars().take(24).collect()
}

/// The parameters of a Digest response (RFC 7616 §3.4) that the endpoint
/// needs, checked for presence and form (not yet for truth).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestResponse {
    /// `username`.
    pub username: String,
    /// `realm`.
    pub realm: String,
    /// `nonce`, as the endpoint issued it (if it did).
    pub nonce: String,
    /// `uri`: must be the Request-URI.
    pub uri: String,
    /// `response`: the hex digest, lower-cased here.
    pub response: String,
    /// `algorithm`, as sent (`MD5` when absent, RFC 7616 §3.4).
    pub algorithm: String,
    /// `qop` (only `auth` is accepted; required, as moshid offers it).
    pub qop: String,
    /// `nc`, the nonce count (8 hex digits on the wire).
    pub nc: u32,
    /// `nc` as sent (it enters the digest as written).
    pub nc_text: String,
    /// `cnonce`.
    pub cnonce: String,
    /// `opaque`, when sent.
    pub opaque: Option<String>,
}

impl DigestResponse {
    /// The Digest view of `c`; `Err` says what is missing or malformed.
    pub fn from_credentials(c: &Credentials) -> Result<DigestResponse, AuthHeaderError> {
        if !c.scheme.eq_ignore_ascii_case("Digest") {
            return Err(err(format!("scheme `{}` is not Digest", clip(&c.scheme))));
        }
        let need = |name: &str| {
            c.param(name)
                .map(str::to_string)
                .ok_or_else(|| err(format!("no `{name}`")))
        };
        let username = need("username")?;
        let realm = need("realm")?;
        let nonce = need("nonce")?;
        let uri = need("uri")?;
        let response = need("response")?.to_ascii_lowercase();
        if response.is_empty() || !response.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err("`response` is not hexadecimal"));
        }
        if c.param("userhash")
            .is_some_and(|u| u.eq_ignore_ascii_case("true"))
        {
            // Not offered by moshid (RFC 7616 §3.4.4).
            return Err(err("`userhash=true` is not supported"));
        }
        let algorithm = c.param("algorithm").unwrap_or("MD5").to_string();
        let qop = c
            .param("qop")
            .ok_or_else(|| err("no `qop` (moshid offers qop=\"auth\" and requires it)"))?;
        if !qop.eq_ignore_ascii_case("auth") {
            return Err(err(format!("qop `{}` is not auth", clip(qop))));
        }
        let nc_text = need("nc")?;
        if nc_text.len() != 8 || !nc_text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err("`nc` must be 8 hex digits"));
        }
        let nc = u32::from_str_radix(&nc_text, 16).map_err(|_| err("bad `nc`"))?;
        if nc == 0 {
            return Err(err("`nc` starts at 00000001"));
        }
        let cnonce = need("cnonce")?;
        if cnonce.is_empty() {
            return Err(err("empty `cnonce`"));
        }
        Ok(DigestResponse {
            username,
            realm,
            nonce,
            uri,
            response,
            algorithm,
            qop: qop.to_ascii_lowercase(),
            nc,
            nc_text,
            cnonce,
            opaque: c.param("opaque").map(str::to_string),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1's SHA-256 Authorization, on one line.
    const RFC: &str = "Digest username=\"Mufasa\", realm=\"http-auth@example.org\", \
        uri=\"/dir/index.html\", algorithm=SHA-256, nonce=\"7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v\", \
        nc=00000001, cnonce=\"f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ\", qop=auth, \
        response=\"753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1\", \
        opaque=\"FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS\"";

    #[test]
    fn reads_the_rfc_example() {
        let c = parse(RFC).unwrap();
        assert_eq!(c.scheme, "Digest");
        let d = DigestResponse::from_credentials(&c).unwrap();
        assert_eq!(d.username, "Mufasa");
        assert_eq!(d.realm, "http-auth@example.org");
        assert_eq!(d.uri, "/dir/index.html");
        assert_eq!(d.algorithm, "SHA-256");
        assert_eq!((d.nc, d.nc_text.as_str()), (1, "00000001"));
        assert_eq!(d.qop, "auth");
        assert_eq!(
            d.opaque.as_deref(),
            Some("FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS")
        );
    }

    #[test]
    fn quotes_escapes_commas_and_case() {
        // sipp's form: no spaces, names in any case, commas inside quotes.
        let c = parse(
            "digest USERNAME=\"a\\\"b, c\",Realm=\"r\\\\x\" , nonce = n1,uri=\"sip:m@h;x=\\\"y\\\"\"",
        )
        .unwrap();
        assert_eq!(c.scheme, "digest");
        assert_eq!(c.param("username"), Some("a\"b, c"));
        assert_eq!(c.param("realm"), Some("r\\x"));
        assert_eq!(c.param("nonce"), Some("n1"));
        assert_eq!(c.param("uri"), Some("sip:m@h;x=\"y\""));
        // Any ASCII character but CR and LF may be escaped, a control
        // character must be (RFC 3261 §25.1).
        assert_eq!(
            parse("Digest realm=\"a\\\u{1c}\\\u{7f}\\\tb\"")
                .unwrap()
                .param("realm"),
            Some("a\u{1c}\u{7f}\tb")
        );
        // An empty quoted string is a value.
        assert_eq!(
            parse("Digest opaque=\"\"").unwrap().param("opaque"),
            Some("")
        );
    }

    /// Every malformed header gets an error, none panics.
    #[test]
    fn malformed_table() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("   ", "blank"),
            ("Digest", "no parameters"),
            ("Digest ", "no parameters after space"),
            ("Dig(est a=b", "bad scheme"),
            ("Digest =b", "no name"),
            ("Digest a", "no ="),
            ("Digest a=", "no value"),
            ("Digest a=\"b", "unclosed quote"),
            ("Digest a=\"b\\", "escape at the end"),
            ("Digest a=\"b\\\r\"", "escaped CR"),
            ("Digest a=\"b\u{1}\"", "control character"),
            ("Digest a=\"b\u{7f}\"", "DEL"),
            ("Digest a=\"b\\\u{e9}\"", "escaped non-ASCII"),
            ("Digest a=b,", "trailing comma"),
            ("Digest a=b,,c=d", "empty element"),
            ("Digest a=b c=d", "no comma"),
            ("Digest a=b, A=c", "twice, other case"),
            ("Digest a=\"b\"x", "junk after a quote"),
            ("Digest a=b;c", "semicolon"),
            ("Digest a=(b)", "bad token"),
        ];
        for (text, what) in cases {
            assert!(parse(text).is_err(), "{what}: {text:?} accepted");
        }
        let many: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=v")).collect();
        assert!(parse(&format!("Digest {}", many.join(","))).is_err());
    }

    /// Well-formed headers whose Digest response is not usable.
    #[test]
    fn digest_response_checks() {
        let base = "username=\"u\", realm=\"r\", nonce=\"n\", uri=\"sip:a@h\", response=\"0a1B\", qop=auth, nc=00000001, cnonce=\"c\"";
        let d = |s: &str| DigestResponse::from_credentials(&parse(s).unwrap());
        let ok = d(&format!("Digest {base}")).unwrap();
        assert_eq!(ok.algorithm, "MD5", "absent algorithm means MD5");
        assert_eq!(ok.response, "0a1b", "lower-cased");
        assert_eq!(ok.opaque, None);
        let without = |name: &str| {
            let kept: Vec<&str> = base
                .split(", ")
                .filter(|p| !p.starts_with(&format!("{name}=")))
                .collect();
            format!("Digest {}", kept.join(", "))
        };
        for name in [
            "username", "realm", "nonce", "uri", "response", "qop", "nc", "cnonce",
        ] {
            assert!(d(&without(name)).is_err(), "without {name}");
        }
        let with = |from: &str, to: &str| format!("Digest {}", base.replace(from, to));
        for (from, to) in [
            ("qop=auth", "qop=auth-int"),
            ("nc=00000001", "nc=1"),
            ("nc=00000001", "nc=0000000g"),
            ("nc=00000001", "nc=00000000"),
            ("response=\"0a1B\"", "response=\"xyz\""),
            ("response=\"0a1B\"", "response=\"\""),
            ("cnonce=\"c\"", "cnonce=\"\""),
        ] {
            assert!(d(&with(from, to)).is_err(), "{to}");
        }
        assert!(d(&format!("Basic {base}")).is_err());
        assert!(d(&format!("Digest {base}, userhash=true")).is_err());
        assert!(d(&format!("Digest {base}, userhash=false")).is_ok());
    }
}
