//! The browser client the daemon serves at `/`, and `GET /v1/model`.
//!
//! The page (HTML, CSS, three JavaScript modules) is compiled into the
//! binary: nothing is fetched at run time and nothing comes from a third
//! party. Audio is Opus through the browser's own WebCodecs encoder and
//! decoder, in Ogg pages made and read by the page's `ogg.js`, so no codec is
//! vendored (see docs/browser.md, "Why WebCodecs").
//!
//! Invariants:
//! - The page and its assets are public (`is_public`): with `listen.token`
//!   set, the page asks for the token and sends it with its own requests;
//!   `/v1/model` and `/api/chat` stay behind the token.
//! - Every asset is answered with a Content-Security-Policy that allows only
//!   this origin (no inline script, no third-party anything), `nosniff`, no
//!   referrer (a `?token=` never leaves in a Referer header) and
//!   `Cache-Control: no-cache` (a new daemon's page is never mixed with an
//!   old one's cached modules).

use crate::app::CoreApp;
use crate::http::{self, HttpError, RequestHead};
use futures_lite::AsyncWrite;

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        path: "/",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("page/index.html"),
    },
    Asset {
        path: "/assets/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("page/style.css"),
    },
    Asset {
        path: "/assets/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("page/app.js"),
    },
    Asset {
        path: "/assets/ogg.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("page/ogg.js"),
    },
    Asset {
        path: "/assets/worklets.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("page/worklets.js"),
    },
];

/// The model description endpoint.
pub const MODEL_PATH: &str = "/v1/model";

/// What every asset is sent with.
const PAGE_HEADERS: &[(&str, &str)] = &[
    (
        "Content-Security-Policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self' data:; media-src 'self'; base-uri 'none'; form-action 'none'; \
         frame-ancestors 'none'",
    ),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-cache"),
    ("Permissions-Policy", "microphone=(self)"),
];

fn asset(path: &str) -> Option<&'static Asset> {
    let path = if path == "/index.html" { "/" } else { path };
    ASSETS.iter().find(|a| a.path == path)
}

/// Whether `path` is the page or one of its assets (public, whatever
/// `listen.token` says).
pub fn is_public(path: &str) -> bool {
    asset(path).is_some()
}

/// Whether this module answers `path`.
pub fn owns(path: &str) -> bool {
    path == MODEL_PATH || asset(path).is_some()
}

/// Answers one request for a path [`owns`] accepted.
pub async fn handle<S>(
    stream: &mut S,
    app: &CoreApp,
    api: &super::ApiShared,
    head: &RequestHead,
) -> Result<(), HttpError>
where
    S: AsyncWrite + Unpin + ?Sized,
{
    if head.method != "GET" {
        return http::write_error(stream, 405, "method not allowed").await;
    }
    if head.path == MODEL_PATH {
        let body = api.model.to_json(&app.shared.config.defaults);
        return http::write_json(stream, 200, &body).await;
    }
    match asset(&head.path) {
        Some(a) => http::write_response(stream, 200, a.content_type, a.body, PAGE_HEADERS).await,
        None => http::write_error(stream, 404, "no such endpoint").await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_modules_are_embedded() {
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.path);
            assert!(is_public(a.path) && owns(a.path));
        }
        assert!(is_public("/index.html"));
        assert!(owns(MODEL_PATH) && !is_public(MODEL_PATH));
        assert!(!is_public("/assets/") && !is_public("/assets/../capacity"));
        // Every module the page imports is served.
        let html = std::str::from_utf8(asset("/").unwrap().body).unwrap();
        assert!(html.contains("/assets/app.js") && html.contains("/assets/style.css"));
        let app = std::str::from_utf8(asset("/assets/app.js").unwrap().body).unwrap();
        assert!(app.contains("./ogg.js") && app.contains("/assets/worklets.js"));
        // Nothing refers to another origin: no URL with a host anywhere
        // (the page builds its WebSocket URL from `location.host`).
        for a in ASSETS {
            let text = std::str::from_utf8(a.body).unwrap();
            for (at, _) in text.match_indices("://") {
                let host_start = text[at + 3..].chars().next();
                assert!(
                    !host_start.is_some_and(|c| c.is_ascii_alphanumeric()),
                    "{} refers to another origin near {:?}",
                    a.path,
                    &text[at.saturating_sub(10)..(at + 20).min(text.len())]
                );
            }
        }
    }
}
