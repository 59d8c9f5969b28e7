//! `/v1/realtime`: the conversation's client events and the events of its
//! responses (see [`super::responses`] for how the model's continuous
//! output is cut into them, and [`super::settings`] for what
//! `session.update` may change).
//!
//! Events and what they do here:
//!
//! * `input_audio_buffer.append`: the audio goes to the model as it comes
//!   (there is no buffer to wait in: the model hears while it speaks).
//! * `input_audio_buffer.commit`: the audio since the last commit becomes
//!   the caller's item (`input_audio_buffer.committed`); under 100 ms of it
//!   is refused (`input_audio_buffer_commit_empty`). With `server_vad`,
//!   each stretch of detected speech is committed by itself.
//! * `input_audio_buffer.clear`: what the model has not heard yet (an
//!   unfinished 80 ms frame) is dropped (`input_audio_buffer.cleared`).
//! * `response.create`: the model decides when it speaks; the next words it
//!   says are sent (it lifts the mute of a cancelled utterance). Refused
//!   while a response is in progress
//!   (`conversation_already_has_active_response`) or when it asks for what
//!   the session refuses (instructions, tools, another modality, another
//!   conversation, `input` items).
//! * `response.cancel`: the response in progress ends `cancelled`
//!   (`response_cancel_not_active` when none is).
//! * `conversation.item.truncate`: the client stopped playing the model's
//!   item; if it is the one in progress, its response ends `cancelled`;
//!   answered with `conversation.item.truncated`. The model's own memory of
//!   what it said is not truncated.
//! * `conversation.item.create`, and every other event: refused, naming
//!   the event (the model takes no text or items, only the caller's audio).
//!
//! A response's events, in the API's order: `response.created`,
//! `conversation.item.added`, `response.output_item.added`,
//! `response.content_part.added`, then per frame
//! `response.output_audio.delta` and, when the frame has text,
//! `response.output_audio_transcript.delta`; at its end
//! `response.output_audio.done`, `response.output_audio_transcript.done`,
//! `response.content_part.done`, `response.output_item.done`,
//! `conversation.item.done`, `response.done`. `rate_limits.updated` is
//! never sent (moshid has no rate limits; admission refuses a session
//! instead).

use super::client_event::{clip, ClientEvent, Kind};
use super::error::ApiError;
use super::responses::Ending;
use super::session::{Reject, RtSession};
use super::settings::{
    apply_update, realtime_session_json, translation_session_json, Described, Endpoint,
};
use super::vad::{Vad, VadEvent};
use super::wire::DeltaOf;
use crate::session::record::EndReason;
use serde_json::{json, Value};

impl RtSession {
    /// The session object of `session.created`/`.updated`.
    fn session_json(&self) -> Value {
        let d = Described {
            id: &self.api_id,
            model: &self.model_name,
            expires_at: self.expires_at(),
        };
        match self.endpoint {
            Endpoint::Conversation => realtime_session_json(&self.settings, &d),
            Endpoint::Translation => {
                translation_session_json(&self.shared.config.realtime.translation_language, &d)
            }
        }
    }

    /// `session.created`, the session's first event.
    pub async fn send_created(&mut self) -> Result<(), EndReason> {
        let event = json!({
            "type": "session.created",
            "event_id": self.wire.next_event_id(),
            "session": self.session_json(),
        });
        self.send_event(&event).await?;
        self.flush_wire(false).await
    }

    /// `session.update` (either endpoint): applied whole or refused whole.
    pub async fn on_session_update(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        let Some(session) = event.session.as_ref() else {
            return Err(Reject::Refused(
                ApiError::invalid("invalid_event", "`session` is missing").param("session"),
            ));
        };
        let language = &self.shared.config.realtime.translation_language;
        let next = apply_update(&self.settings, session, self.endpoint, language)
            .map_err(Reject::Refused)?;
        if next.output != self.settings.output {
            // Frames are written before events are read: none is queued.
            let capacity = self.shared.config.session.max_frames_in_flight + 1;
            self.out_frames
                .set_format(next.output, capacity)
                .map_err(|e| Reject::End(EndReason::SendFailed(format!("audio path: {e}"))))?;
        }
        self.input
            .set_format(next.input)
            .map_err(|e| Reject::End(EndReason::SendFailed(format!("audio path: {e}"))))?;
        match (&mut self.vad, next.turn_detection.as_ref()) {
            (_, None) => self.vad = None,
            (Some(v), Some(t)) => v.reconfigure(t),
            (None, Some(t)) => self.vad = Some(Vad::new(t)),
        }
        self.settings = next;
        let event = json!({
            "type": "session.updated",
            "event_id": self.wire.next_event_id(),
            "session": self.session_json(),
        });
        self.send_event(&event).await?;
        Ok(())
    }

    /// One client event of `/v1/realtime`.
    pub async fn on_conversation_event(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        match event.kind() {
            Kind::SessionUpdate => self.on_session_update(event).await,
            Kind::InputAudioAppend => self.on_append(event).await,
            Kind::InputAudioCommit => self.on_commit().await,
            Kind::InputAudioClear => {
                self.input.clear();
                let e = json!({"type": "input_audio_buffer.cleared", "event_id": self.wire.next_event_id()});
                Ok(self.send_event(&e).await?)
            }
            Kind::ResponseCreate => self.on_response_create(event),
            Kind::ResponseCancel => self.on_response_cancel(event).await,
            Kind::ItemTruncate => self.on_truncate(event).await,
            Kind::ItemCreate => Err(Reject::Refused(
                ApiError::invalid(
                    "unsupported_item",
                    "this model takes no text or items: it hears only the input audio",
                )
                .param("item"),
            )),
            Kind::TranslationAppend | Kind::SessionClose | Kind::Other => {
                Err(self.unsupported(event))
            }
        }
    }

    async fn on_commit(&mut self) -> Result<(), Reject> {
        let ms = self.input.uncommitted_ms();
        if ms < 100 {
            return Err(Reject::Refused(ApiError::invalid(
                "input_audio_buffer_commit_empty",
                format!("{ms} ms of audio since the last commit: at least 100 ms is needed"),
            )));
        }
        self.input.commit();
        self.user_items += 1;
        let e = json!({
            "type": "input_audio_buffer.committed",
            "event_id": self.wire.next_event_id(),
            "item_id": self.wire.user_item_id(self.user_items),
            "previous_item_id": null,
        });
        Ok(self.send_event(&e).await?)
    }

    fn on_response_create(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        if let Some(n) = self.responses.open() {
            return Err(Reject::Refused(ApiError::invalid(
                "conversation_already_has_active_response",
                format!(
                    "response {} is in progress: the model speaks when it wants",
                    self.wire.response_id(n)
                ),
            )));
        }
        if let Some(r) = event.response.as_ref().filter(|r| !r.is_null()) {
            check_response_params(r).map_err(Reject::Refused)?;
        }
        self.responses.unmute();
        Ok(())
    }

    async fn on_response_cancel(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        let open = self.responses.open();
        let named = event.response_id.as_ref().map(|t| t.as_str());
        let matches = match (open, named) {
            (Some(n), Some(id)) => id == self.wire.response_id(n),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if !matches {
            return Err(Reject::Refused(ApiError::invalid(
                "response_cancel_not_active",
                "no response in progress to cancel",
            )));
        }
        Ok(self.close_open_response(Ending::ClientCancelled).await?)
    }

    async fn on_truncate(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        let item_id = event.item_id.as_ref().map(|t| t.as_str()).unwrap_or("");
        let n = self
            .wire
            .response_of_item(item_id)
            .filter(|&n| n >= 1 && n <= self.responses.opened());
        let Some(n) = n else {
            return Err(Reject::Refused(
                ApiError::invalid(
                    "item_truncate_invalid_item_id",
                    format!(
                        "`{}` is not an item of the model in this session",
                        clip(item_id)
                    ),
                )
                .param("item_id"),
            ));
        };
        if event.content_index.unwrap_or(0) != 0 {
            return Err(Reject::Refused(
                ApiError::invalid(
                    "invalid_value",
                    "the model's items have one content part: 0",
                )
                .param("content_index"),
            ));
        }
        if self.responses.open() == Some(n) {
            self.close_open_response(Ending::ClientCancelled).await?;
        }
        let e = json!({
            "type": "conversation.item.truncated",
            "event_id": self.wire.next_event_id(),
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": event.audio_end_ms.unwrap_or(0),
        });
        Ok(self.send_event(&e).await?)
    }

    /// The events of the oldest output frame.
    pub async fn emit_conversation_frame(&mut self) -> Result<(), EndReason> {
        let token = self.out_frames.front().map_or(0, |(_, t)| t);
        let shared = self.shared.clone();
        let piece = shared
            .pieces
            .text_for_token(token)
            .filter(|p| !p.is_empty());
        let action = self.responses.on_frame(piece.is_some());
        if let Some(n) = action.open {
            self.open_response(n).await?;
        }
        if let Some(n) = action.send {
            self.room_for_a_frame().await?;
            let (bytes, _) = self.out_frames.front().expect("a frame waits");
            let of = DeltaOf::Response(n);
            self.wire
                .push_audio_delta(of, bytes)
                .expect("room was made for a frame");
            if let Some(piece) = piece {
                self.wire
                    .push_transcript_delta(of, piece)
                    .expect("room was made for a frame");
                self.transcript.push(piece);
            }
            if let Some(ending) = action.close {
                self.close_response(n, ending).await?;
            }
        }
        Ok(())
    }

    /// Closes the response in progress, if any, with `ending`.
    pub async fn close_open_response(&mut self, ending: Ending) -> Result<(), EndReason> {
        match self.responses.cancel(ending) {
            Some(n) => self.close_response(n, ending).await,
            None => Ok(()),
        }
    }

    async fn open_response(&mut self, n: u64) -> Result<(), EndReason> {
        self.transcript.clear();
        let response_id = self.wire.response_id(n);
        let item_id = self.wire.assistant_item_id(n);
        let item = json!({
            "id": item_id, "object": "realtime.item", "type": "message",
            "role": "assistant", "status": "in_progress", "content": [],
        });
        let events = [
            json!({"type": "response.created", "response": self.response_json(n, "in_progress", None, Value::Array(vec![]))}),
            json!({"type": "conversation.item.added", "previous_item_id": null, "item": item}),
            json!({"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item}),
            json!({"type": "response.content_part.added", "response_id": response_id, "item_id": item_id,
                   "output_index": 0, "content_index": 0, "part": {"type": "audio", "transcript": ""}}),
        ];
        self.send_all(events).await
    }

    async fn close_response(&mut self, n: u64, ending: Ending) -> Result<(), EndReason> {
        let response_id = self.wire.response_id(n);
        let item_id = self.wire.assistant_item_id(n);
        let transcript = self.transcript.text.clone();
        let item = json!({
            "id": item_id, "object": "realtime.item", "type": "message", "role": "assistant",
            "status": ending.item_status(),
            "content": [{"type": "output_audio", "transcript": transcript}],
        });
        let ids = json!({"response_id": response_id, "item_id": item_id, "output_index": 0, "content_index": 0});
        let with = |mut v: Value| {
            for (k, x) in ids.as_object().expect("an object") {
                v[k] = x.clone();
            }
            v
        };
        let details = ending
            .reason()
            .map(|r| json!({"type": ending.status(), "reason": r}));
        let events = [
            with(json!({"type": "response.output_audio.done"})),
            with(
                json!({"type": "response.output_audio_transcript.done", "transcript": transcript}),
            ),
            with(
                json!({"type": "response.content_part.done", "part": {"type": "audio", "transcript": transcript}}),
            ),
            json!({"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item}),
            json!({"type": "conversation.item.done", "previous_item_id": null, "item": item}),
            json!({"type": "response.done", "response": self.response_json(n, ending.status(), details, json!([item]))}),
        ];
        self.send_all(events).await
    }

    /// Sends events, each with the next event id.
    async fn send_all<const N: usize>(&mut self, events: [Value; N]) -> Result<(), EndReason> {
        for mut e in events {
            e["event_id"] = self.wire.next_event_id().into();
            self.send_event(&e).await?;
        }
        Ok(())
    }

    fn response_json(&self, n: u64, status: &str, details: Option<Value>, output: Value) -> Value {
        json!({
            "id": self.wire.response_id(n),
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output,
            "conversation_id": format!("conv_{}", self.rec.id),
            "output_modalities": ["audio"],
            "audio": {"output": {"format": self.settings.output.to_json(), "voice": null}},
            "max_output_tokens": "inf",
            "metadata": null,
            "usage": null,
        })
    }

    /// The caller's speech events detected since the last call.
    pub async fn emit_vad_events(&mut self) -> Result<(), EndReason> {
        while let Some(e) = self.vad_events.pop_front() {
            match e {
                VadEvent::Started { audio_start_ms } => {
                    self.user_items += 1;
                    let e = json!({
                        "type": "input_audio_buffer.speech_started",
                        "event_id": self.wire.next_event_id(),
                        "audio_start_ms": audio_start_ms,
                        "item_id": self.wire.user_item_id(self.user_items),
                    });
                    self.send_event(&e).await?;
                    if self
                        .settings
                        .turn_detection
                        .is_some_and(|t| t.interrupt_response)
                    {
                        self.close_open_response(Ending::TurnDetected).await?;
                    }
                }
                VadEvent::Stopped { audio_end_ms } => {
                    let item_id = self.wire.user_item_id(self.user_items);
                    self.input.commit();
                    let events = [
                        json!({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": audio_end_ms, "item_id": item_id}),
                        json!({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": null}),
                    ];
                    self.send_all(events).await?;
                }
            }
        }
        Ok(())
    }
}

/// What `response.create` may ask: the session's own settings only.
pub fn check_response_params(r: &Value) -> Result<(), ApiError> {
    let Some(obj) = r.as_object() else {
        return Err(
            ApiError::invalid("invalid_value", "`response` must be an object").param("response"),
        );
    };
    for (key, v) in obj {
        let param = format!("response.{key}");
        let ok = match key.as_str() {
            "output_modalities" => v.is_null() || *v == json!(["audio"]),
            "instructions" => v.is_null() || v.as_str() == Some(""),
            "tools" => v.is_null() || v.as_array().is_some_and(Vec::is_empty),
            "tool_choice" => v.is_null() || matches!(v.as_str(), Some("auto" | "none")),
            "max_output_tokens" => v.is_null() || v.as_str() == Some("inf"),
            "conversation" => v.is_null() || v.as_str() == Some("auto"),
            "input" | "metadata" | "audio" | "prompt" => v.is_null(),
            _ => false,
        };
        if !ok {
            return Err(ApiError::field(
                param,
                "the model speaks on its own: a response takes none of the session's refused settings, another conversation or input items",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_response_params;
    use serde_json::json;

    #[test]
    fn response_create_takes_the_sessions_own_settings() {
        assert!(check_response_params(&json!({"output_modalities": ["audio"]})).is_ok());
        assert!(
            check_response_params(&json!({"conversation": "auto", "instructions": ""})).is_ok()
        );
        for (r, param) in [
            (
                json!({"output_modalities": ["text"]}),
                "response.output_modalities",
            ),
            (json!({"instructions": "say hi"}), "response.instructions"),
            (json!({"conversation": "none"}), "response.conversation"),
            (json!({"input": []}), "response.input"),
            (json!({"temperature": 1}), "response.temperature"),
        ] {
            assert_eq!(
                check_response_params(&r).unwrap_err().param.as_deref(),
                Some(param)
            );
        }
        assert!(check_response_params(&json!(3)).is_err());
    }
}
