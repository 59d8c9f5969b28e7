//! Helpers shared by the end-to-end tests (start a daemon, speak its protocols).
