//! What the HTTP API decides before anything runs (the serving is `src/http/`).
//!
//! - [`access`]: which HTTP requests are refused (Host names of this node, same origin, form
//!   body types, tokens, connection and stream caps).
//! - [`graphql_cost`]: what a GraphQL document stands for with its fragments expanded, counted
//!   without expanding them (refused past a cap before anything runs it).
//! - [`subscriptions`]: which subscription results go out (only those that differ from the
//!   last one a client got).

pub mod access;
pub mod graphql_cost;
pub mod subscriptions;
