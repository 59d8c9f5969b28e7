//! The HTTP routes the listener serves, in one table. Every request is
//! resolved against it before any handler runs: a path the table does not
//! hold answers 404, a method it does not hold for a known path 405. So a
//! route exists only once it is in [`ROUTES`] — and the documentation test
//! checks that every route here has its row in `docs/api.md`.
//!
//! Paths are compared segment by segment, empty segments ignored (as the
//! handlers split them); a `{name}` segment matches any one segment (an id,
//! an asset's file name), which the handler then looks up. A route behind a
//! configuration switch ([`Switch`]) is unknown while the switch is off.
//!
//! Invariants: resolving allocates nothing; the table holds each method and
//! path once.

/// A configuration switch that turns routes off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    /// `media_streams.enabled`.
    MediaStreams,
    /// `realtime.enabled`.
    Realtime,
}

impl Switch {
    /// The configuration key of the switch.
    pub const fn key(self) -> &'static str {
        match self {
            Switch::MediaStreams => "media_streams.enabled",
            Switch::Realtime => "realtime.enabled",
        }
    }
}

/// One route: a method and a path pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// `GET`, `POST`, `DELETE`.
    pub method: &'static str,
    /// The path, `{name}` for a segment that varies.
    pub path: &'static str,
    /// The switch that must be on for the route to exist.
    pub switch: Option<Switch>,
}

const fn route(method: &'static str, path: &'static str) -> Route {
    Route {
        method,
        path,
        switch: None,
    }
}

/// Every route the listener serves.
pub const ROUTES: &[Route] = &[
    // Kyutai's protocol (WebSocket) and Media Streams (WebSocket).
    route("GET", "/api/chat"),
    Route {
        method: "GET",
        path: "/v1/media-stream",
        switch: Some(Switch::MediaStreams),
    },
    // The OpenAI Realtime API (WebSocket): conversations and translations.
    Route {
        method: "GET",
        path: "/v1/realtime",
        switch: Some(Switch::Realtime),
    },
    Route {
        method: "GET",
        path: "/v1/realtime/translations",
        switch: Some(Switch::Realtime),
    },
    // The page and the model it shows.
    route("GET", "/"),
    route("GET", "/index.html"),
    route("GET", "/assets/{file}"),
    route("GET", "/v1/model"),
    // Health, capacity, metrics.
    route("GET", "/health"),
    route("GET", "/ready"),
    route("GET", "/capacity"),
    route("GET", "/metrics"),
    route("GET", "/admin/metrics"),
    route("POST", "/admin/metrics"),
    // Live sessions and their events.
    route("GET", "/v1/sessions"),
    route("GET", "/v1/sessions/{id}/events"),
    // RTP sessions.
    route("POST", "/v1/rtp/sessions"),
    route("GET", "/v1/rtp/sessions"),
    route("GET", "/v1/rtp/sessions/{id}"),
    route("GET", "/v1/rtp/sessions/{id}/events"),
    route("DELETE", "/v1/rtp/sessions/{id}"),
    // SIP: calls moshid places, its registrations.
    route("POST", "/v1/sip/calls"),
    route("GET", "/v1/sip/calls"),
    route("GET", "/v1/sip/calls/{id}"),
    route("DELETE", "/v1/sip/calls/{id}"),
    route("GET", "/v1/sip/registrations"),
];

/// What the table says of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// A route of the table.
    Route(&'static Route),
    /// The path is a route's, the method is not (405).
    WrongMethod,
    /// No route has this path (404).
    Unknown,
}

/// Whether `path` matches the pattern `pattern`.
fn matches(pattern: &str, path: &str) -> bool {
    let mut want = pattern.split('/').filter(|s| !s.is_empty());
    let mut have = path.split('/').filter(|s| !s.is_empty());
    loop {
        match (want.next(), have.next()) {
            (None, None) => return true,
            (Some(w), Some(h)) if w.starts_with('{') || w == h => {}
            _ => return false,
        }
    }
}

/// Resolves a request's method and path (without its query); `on` says
/// whether a switch is on.
pub fn resolve(method: &str, path: &str, on: impl Fn(Switch) -> bool) -> Resolved {
    let mut known_path = false;
    for r in ROUTES {
        if r.switch.is_some_and(|s| !on(s)) || !matches(r.path, path) {
            continue;
        }
        if r.method == method {
            return Resolved::Route(r);
        }
        known_path = true;
    }
    if known_path {
        Resolved::WrongMethod
    } else {
        Resolved::Unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_on(_: Switch) -> bool {
        true
    }

    #[test]
    fn requests_resolve_by_segments() {
        let r = |m, p| resolve(m, p, all_on);
        assert!(matches!(r("GET", "/health"), Resolved::Route(x) if x.path == "/health"));
        assert!(
            matches!(r("GET", "/v1/sessions/7/events"), Resolved::Route(x) if x.path == "/v1/sessions/{id}/events")
        );
        assert!(matches!(r("GET", "/"), Resolved::Route(x) if x.path == "/"));
        assert!(matches!(
            r("DELETE", "/v1/rtp/sessions/7/"),
            Resolved::Route(_)
        ));
        assert_eq!(r("POST", "/health"), Resolved::WrongMethod);
        assert_eq!(r("PUT", "/v1/sip/calls/7"), Resolved::WrongMethod);
        assert_eq!(r("GET", "/v1/sessions/7"), Resolved::Unknown);
        assert_eq!(r("GET", "/v1/rtp/sessions/7/events/x"), Resolved::Unknown);
        assert_eq!(r("GET", "/nothing"), Resolved::Unknown);
    }

    #[test]
    fn a_switched_off_route_is_unknown() {
        let off = |s: Switch| s != Switch::MediaStreams;
        assert_eq!(resolve("GET", "/v1/media-stream", off), Resolved::Unknown);
        assert_eq!(resolve("POST", "/v1/media-stream", off), Resolved::Unknown);
        assert_eq!(
            resolve("POST", "/v1/media-stream", all_on),
            Resolved::WrongMethod
        );
        assert_eq!(Switch::MediaStreams.key(), "media_streams.enabled");
        let no_realtime = |s: Switch| s != Switch::Realtime;
        assert_eq!(
            resolve("GET", "/v1/realtime/translations", no_realtime),
            Resolved::Unknown
        );
        assert!(matches!(
            resolve("GET", "/v1/realtime/translations", all_on),
            Resolved::Route(r) if r.path == "/v1/realtime/translations"
        ));
        assert!(matches!(
            resolve("GET", "/v1/realtime", all_on),
            Resolved::Route(r) if r.path == "/v1/realtime"
        ));
    }

    #[test]
    fn each_route_is_in_the_table_once() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {} twice",
                    a.method,
                    a.path
                );
            }
        }
    }
}
