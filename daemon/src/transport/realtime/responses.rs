//! How a full-duplex model's continuous output becomes the Realtime API's
//! responses (pure; the session writes the events it decides).
//!
//! Moshi speaks whenever it wants, one 80 ms frame of audio and one text
//! token per frame; its text is padding while it is silent. In `turns`
//! mode a response opens on the first frame whose text is a word piece
//! (the model starts to speak) and closes, `completed`, after
//! `realtime.response_silence_ms` of padding; the audio between responses
//! is not sent (the client plays its own silence). In `continuous` mode
//! every frame is sent: a response opens at the first frame and stays open
//! until it is cancelled.
//!
//! A response ends `cancelled` when the client sends `response.cancel`
//! (`client_cancelled`), or when the caller starts to speak while
//! `server_vad`'s `interrupt_response` is on (`turn_detected`), or when the
//! client truncates its item. The model itself cannot be stopped (it hears
//! and speaks at once), so in `turns` mode a cancelled utterance stays
//! muted — nothing of it is sent — until the model falls silent for the
//! response silence; `response.create` lifts the mute at once. In
//! `continuous` mode the next frame opens the next response.
//!
//! Invariants: at most one response is open; every opened response is
//! closed exactly once ([`Responses::on_frame`] or [`Responses::cancel`]);
//! nothing allocates.

use crate::config::realtime::ResponseMode;

/// Why a response ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The model fell silent (`completed`).
    Completed,
    /// `response.cancel` or a truncation (`cancelled`, `client_cancelled`).
    ClientCancelled,
    /// The caller started to speak (`cancelled`, `turn_detected`).
    TurnDetected,
    /// The session ended under it (`incomplete`).
    SessionEnded,
}

impl Ending {
    /// `response.status`.
    pub fn status(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::ClientCancelled | Ending::TurnDetected => "cancelled",
            Ending::SessionEnded => "incomplete",
        }
    }

    /// `response.status_details.reason`, where the API has one.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Ending::Completed | Ending::SessionEnded => None,
            Ending::ClientCancelled => Some("client_cancelled"),
            Ending::TurnDetected => Some("turn_detected"),
        }
    }

    /// The item's status.
    pub fn item_status(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            _ => "incomplete",
        }
    }
}

/// What to do with one output frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameAction {
    /// Open response number `n` before the frame.
    pub open: Option<u64>,
    /// Send the frame's audio (and its text) in response `n`.
    pub send: Option<u64>,
    /// Close that response after the frame.
    pub close: Option<Ending>,
}

/// The response state of one session.
#[derive(Debug)]
pub struct Responses {
    mode: ResponseMode,
    silence_frames: u32,
    open: Option<u64>,
    opened: u64,
    /// Padding frames in a row.
    silent: u32,
    muted: bool,
}

impl Responses {
    /// Responses in `mode`, closing after `silence_frames` of padding.
    pub fn new(mode: ResponseMode, silence_frames: u32) -> Self {
        Responses {
            mode,
            silence_frames: silence_frames.max(1),
            open: None,
            opened: 0,
            silent: 0,
            muted: false,
        }
    }

    /// The response open now, if any.
    pub fn open(&self) -> Option<u64> {
        self.open
    }

    /// Responses opened so far (their numbers are 1 to this).
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Whether a cancelled utterance is muted.
    pub fn muted(&self) -> bool {
        self.muted
    }

    /// One output frame; `speaks` says whether its text is a word piece.
    pub fn on_frame(&mut self, speaks: bool) -> FrameAction {
        self.silent = if speaks {
            0
        } else {
            self.silent.saturating_add(1)
        };
        let mut action = FrameAction::default();
        if self.muted {
            if self.silent >= self.silence_frames {
                self.muted = false;
            }
            return action;
        }
        if self.open.is_none() && (speaks || self.mode == ResponseMode::Continuous) {
            self.opened += 1;
            self.open = Some(self.opened);
            action.open = self.open;
        }
        if self.open.is_some() {
            action.send = self.open;
            if self.mode == ResponseMode::Turns && self.silent >= self.silence_frames {
                self.open = None;
                action.close = Some(Ending::Completed);
            }
        }
        action
    }

    /// Cancels the open response (`Some(n)` when one was open, to be closed
    /// with `ending`); in `turns` mode the rest of the utterance is muted.
    pub fn cancel(&mut self, ending: Ending) -> Option<u64> {
        let n = self.open.take()?;
        if self.mode == ResponseMode::Turns && ending != Ending::SessionEnded {
            // Mute until the model falls silent (now, if it already is).
            self.muted = self.silent < self.silence_frames;
        }
        Some(n)
    }

    /// `response.create`: the model's next words are sent, even mid-utterance.
    pub fn unmute(&mut self) {
        self.muted = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(r: &mut Responses, frames: &str) -> Vec<FrameAction> {
        frames.chars().map(|c| r.on_frame(c == 'w')).collect()
    }

    #[test]
    fn turns_open_on_words_and_close_on_silence() {
        let mut r = Responses::new(ResponseMode::Turns, 3);
        let a = run(&mut r, "..ww.w...w");
        assert_eq!(a[0], FrameAction::default());
        assert_eq!(a[2].open, Some(1));
        assert!(a[2..8].iter().all(|x| x.send == Some(1)));
        assert_eq!(a[8].close, Some(Ending::Completed));
        assert_eq!(r.open(), Some(2));
        assert_eq!(a[9].open, Some(2));
        assert_eq!(r.opened(), 2);
    }

    #[test]
    fn a_cancelled_utterance_stays_muted_until_silence_or_create() {
        let mut r = Responses::new(ResponseMode::Turns, 2);
        run(&mut r, "ww");
        assert_eq!(r.cancel(Ending::ClientCancelled), Some(1));
        assert_eq!(r.cancel(Ending::ClientCancelled), None);
        let a = run(&mut r, "w.w..w");
        assert!(
            a[..5].iter().all(|x| x.send.is_none() && x.open.is_none()),
            "{a:?}"
        );
        assert_eq!(a[5].open, Some(2));
        r.cancel(Ending::TurnDetected);
        assert!(r.muted());
        r.unmute();
        assert_eq!(r.on_frame(true).open, Some(3));
        // A response closes after one padding frame at the shortest.
        let mut r = Responses::new(ResponseMode::Turns, 1);
        run(&mut r, "w");
        assert_eq!(r.on_frame(false).close, Some(Ending::Completed));
        assert_eq!(r.open(), None);
    }

    #[test]
    fn continuous_sends_every_frame() {
        let mut r = Responses::new(ResponseMode::Continuous, 2);
        let a = run(&mut r, "....");
        assert_eq!(a[0].open, Some(1));
        assert!(a.iter().all(|x| x.send == Some(1) && x.close.is_none()));
        assert_eq!(r.cancel(Ending::ClientCancelled), Some(1));
        assert!(!r.muted());
        assert_eq!(r.on_frame(false).open, Some(2));
    }

    #[test]
    fn endings_in_the_api_words() {
        assert_eq!(Ending::TurnDetected.status(), "cancelled");
        assert_eq!(Ending::TurnDetected.reason(), Some("turn_detected"));
        assert_eq!(Ending::Completed.item_status(), "completed");
        assert_eq!(Ending::SessionEnded.status(), "incomplete");
    }
}
