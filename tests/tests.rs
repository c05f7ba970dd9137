//! Integration tests: the built `verwalter` binary, run the way users run it.
//!
//! Index:
//! - `cli`: `verwalter check`, `verwalter schedule`, `--version`, bad settings.
//! - `daemon`: a single node on a temp copy of `examples/minimal`: schedule over HTTP, edits
//!   picked up without a restart, a broken scheduler shown in `/v1/status` with the old schedule
//!   kept, the schedule persisted across a restart, clean exit on SIGTERM.

mod util;

mod cli;
mod daemon;
