//! The Realtime API's `error` event: what a session refuses, in the API's
//! own shape (`{"type": "error", "event_id", "error": {"type", "code",
//! "message", "param", "event_id"}}`), so that the SDKs and frameworks
//! read it as they read OpenAI's.
//!
//! `type` is `invalid_request_error` for what the client sent and
//! `server_error` for what moshid could not do; `code` is stable (the
//! table in `docs/api.md`); `param` names the field refused
//! (`session.audio.output.voice`); `event_id` is the client's id of the
//! event refused, when it gave one.

use serde_json::{json, Value};

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// `invalid_request_error` or `server_error`.
    pub error_type: &'static str,
    /// A stable code.
    pub code: &'static str,
    /// For people.
    pub message: String,
    /// The field refused, if one is.
    pub param: Option<String>,
    /// The client's id of the event refused.
    pub event_id: Option<String>,
}

impl ApiError {
    /// Something the client sent that moshid refuses.
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            error_type: "invalid_request_error",
            code,
            message: message.into(),
            param: None,
            event_id: None,
        }
    }

    /// Something moshid could not do.
    pub fn server(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            error_type: "server_error",
            ..ApiError::invalid(code, message)
        }
    }

    /// A field refused: `invalid_request_error`, code `unsupported_field`.
    pub fn field(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::invalid("unsupported_field", message).param(param)
    }

    /// With the field it is about.
    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// About the client's event `event_id`.
    pub fn about(mut self, event_id: Option<String>) -> Self {
        if self.event_id.is_none() {
            self.event_id = event_id;
        }
        self
    }

    /// The `error` event, with the server's own `event_id`.
    pub fn to_event(&self, server_event_id: &str) -> Value {
        json!({
            "type": "error",
            "event_id": server_event_id,
            "error": {
                "type": self.error_type,
                "code": self.code,
                "message": self.message,
                "param": self.param,
                "event_id": self.event_id,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_shape() {
        let e = ApiError::field("session.instructions", "no instructions here")
            .about(Some("evt_7".into()));
        let v = e.to_event("event_1_2");
        assert_eq!(v["type"], "error");
        assert_eq!(v["event_id"], "event_1_2");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "unsupported_field");
        assert_eq!(v["error"]["param"], "session.instructions");
        assert_eq!(v["error"]["event_id"], "evt_7");
        let s = ApiError::server("no_capacity", "full").to_event("e");
        assert_eq!(s["error"]["type"], "server_error");
        assert!(s["error"]["param"].is_null());
    }
}
