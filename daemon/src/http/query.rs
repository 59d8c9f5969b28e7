//! Query strings (`application/x-www-form-urlencoded` style): `&`-separated
//! `key=value` pairs, `+` meaning space, `%XX` escapes, decoded to UTF-8.
//!
//! Invariants: the number of parameters is bounded (checked while scanning,
//! before decoding), a malformed escape or non-UTF-8 result is an error rather
//! than being passed through, and nothing here panics on any input.

use super::HttpError;

/// Default bound on the number of parameters accepted by [`parse_query`].
pub const MAX_QUERY_PARAMS: usize = 64;

/// Decodes `query` (with or without a leading `?`) into `(key, value)` pairs in
/// order, keeping duplicates. Empty segments (`a=1&&b=2`) are skipped; a
/// segment without `=` has an empty value. At most [`MAX_QUERY_PARAMS`]
/// parameters.
pub fn parse_query(query: &str) -> Result<Vec<(String, String)>, HttpError> {
    parse_query_limited(query, MAX_QUERY_PARAMS)
}

/// [`parse_query`] with an explicit bound on the number of parameters;
/// more is [`HttpError::TooManyQueryParams`].
pub fn parse_query_limited(
    query: &str,
    max_params: usize,
) -> Result<Vec<(String, String)>, HttpError> {
    let query = query.strip_prefix('?').unwrap_or(query);
    let count = query.split('&').filter(|s| !s.is_empty()).count();
    if count > max_params {
        return Err(HttpError::TooManyQueryParams { limit: max_params });
    }
    let mut pairs = Vec::with_capacity(count);
    for segment in query.split('&').filter(|s| !s.is_empty()) {
        let (key, value) = segment.split_once('=').unwrap_or((segment, ""));
        pairs.push((percent_decode(key)?, percent_decode(value)?));
    }
    Ok(pairs)
}

/// Decodes one component: `+` is a space, `%XX` a byte; the result must be UTF-8.
pub fn percent_decode(s: &str) -> Result<String, HttpError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = bytes.get(i + 1).copied().and_then(hex_value);
                let lo = bytes.get(i + 2).copied().and_then(hex_value);
                let (Some(hi), Some(lo)) = (hi, lo) else {
                    let escape: String = s[i..].chars().take(3).collect();
                    return Err(HttpError::BadQuery(format!(
                        "invalid percent-escape `{escape}` at byte {i}"
                    )));
                };
                out.push(hi << 4 | lo);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| {
        HttpError::BadQuery(format!("`{s}` is not valid UTF-8 after percent-decoding"))
    })
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn decodes() {
        assert_eq!(
            parse_query("?voice=a+b%2Bc&&flag&x=%C3%A9%3d&x=2").unwrap(),
            pairs(&[("voice", "a b+c"), ("flag", ""), ("x", "é="), ("x", "2")])
        );
        assert_eq!(parse_query("").unwrap(), pairs(&[]));
        assert_eq!(parse_query("k%20y=v=w").unwrap(), pairs(&[("k y", "v=w")]));
    }

    #[test]
    fn rejects_bad_escapes_and_utf8() {
        for bad in ["a=%", "a=%4", "a=%zz", "a=%é", "%ff=1", "a=%C3"] {
            let e = parse_query(bad).unwrap_err();
            assert!(matches!(e, HttpError::BadQuery(_)), "{bad}: {e:?}");
            assert_eq!(e.status(), Some(400));
        }
    }

    #[test]
    fn bounds_count() {
        assert_eq!(parse_query_limited("a&b&c", 3).unwrap().len(), 3);
        let e = parse_query_limited("a&b&c&d", 3).unwrap_err();
        assert!(
            matches!(e, HttpError::TooManyQueryParams { limit: 3 }),
            "{e:?}"
        );
        let many = "a=1&".repeat(MAX_QUERY_PARAMS + 1);
        assert!(parse_query(&many).is_err());
    }
}
