//! `/v1/realtime/translations`: a Hibiki model as the Realtime API's
//! continuous translation session.
//!
//! The client sends `session.update` (`audio.output.language`: the
//! language the model produces, `realtime.translation_language`, or a
//! refusal naming it; `audio.input.transcription` and
//! `audio.input.noise_reduction` refused unless `null`: the model gives no
//! source-language text), `session.input_audio_buffer.append` (24 kHz
//! PCM16, any length: cut into the model's 80 ms frames) and
//! `session.close`. Every frame the model answers is a
//! `session.output_audio.delta` (PCM16 at 24 kHz, `elapsed_ms` the frame's
//! place in the output, 80 ms apart) and, when it has text, a
//! `session.output_transcript.delta` with the same `elapsed_ms`;
//! `session.input_transcript.delta` is never sent.
//!
//! `session.close` ends the input as the official inference does: the
//! unfinished frame is completed with silence, the model gets its
//! end-of-stream input, then silence until it ends its text or
//! `session.drain_max_frames` frames have gone; every answer is sent, then
//! `session.closed` (carrying the session's final record) and a close. The
//! socket is not read meanwhile.

use super::client_event::{ClientEvent, Kind};
use super::session::{Drain, Reject, RtSession};
use super::wire::DeltaOf;
use crate::events::SessionState;
use crate::session::record::EndReason;
use crate::FRAME_MS;

impl RtSession {
    /// One client event of `/v1/realtime/translations`.
    pub async fn on_translation_event(&mut self, event: &ClientEvent<'_>) -> Result<(), Reject> {
        match event.kind() {
            Kind::SessionUpdate => self.on_session_update(event).await,
            Kind::TranslationAppend => self.on_append(event).await,
            Kind::SessionClose => {
                self.start_drain();
                Ok(())
            }
            _ => Err(self.unsupported(event)),
        }
    }

    fn start_drain(&mut self) {
        if self.drain.is_some() {
            return;
        }
        self.input.pad_to_frame();
        self.drain = Some(Drain {
            text_eos: self.shared.model_info.drain_text_eos,
            eos_sent: false,
            fillers_left: self.shared.config.session.drain_max_frames,
            done: false,
        });
        if let Some(events) = self.link.events() {
            events.state(SessionState::Draining);
        }
    }

    /// Feeds the model's end of input as the budget allows (the caller's
    /// own audio first).
    pub fn drain_step(&mut self) {
        let Some(d) = self.drain.as_mut() else {
            return;
        };
        if self.input.has_pending() {
            return;
        }
        let mut budget = self.link.budget(None);
        if !d.eos_sent {
            if budget == 0 {
                return;
            }
            if d.text_eos.is_some() && self.link.send_end_of_input() {
                budget -= 1;
            }
            d.eos_sent = true;
            self.frame.fill(0.0);
        }
        while d.text_eos.is_some() && !d.done && d.fillers_left > 0 && budget > 0 {
            self.link.send_filler(&self.frame, &mut self.rec);
            d.fillers_left -= 1;
            budget -= 1;
        }
    }

    /// `Some` once the drain is over and every answer was written.
    pub fn drain_finished(&self) -> Option<EndReason> {
        let d = self.drain.as_ref()?;
        let model_done = d.text_eos.is_none() || d.done || d.fillers_left == 0;
        (d.eos_sent
            && model_done
            && !self.input.has_pending()
            && self.link.in_flight() == 0
            && self.out_frames.is_empty())
        .then_some(EndReason::InputFinished)
    }

    /// The events of the oldest output frame of a translation.
    pub async fn emit_translation_frame(&mut self) -> Result<(), EndReason> {
        let token = self.out_frames.front().map_or(0, |(_, t)| t);
        if let Some(d) = self.drain.as_mut() {
            d.done |= d.text_eos == Some(token);
        }
        let shared = self.shared.clone();
        let piece = shared
            .pieces
            .text_for_token(token)
            .filter(|p| !p.is_empty());
        self.room_for_a_frame().await?;
        let of = DeltaOf::Translation(self.frames_emitted * FRAME_MS as u64);
        let (bytes, _) = self.out_frames.front().expect("a frame waits");
        self.wire
            .push_audio_delta(of, bytes)
            .expect("room was made for a frame");
        if let Some(piece) = piece {
            self.wire
                .push_transcript_delta(of, piece)
                .expect("room was made for a frame");
        }
        Ok(())
    }
}
