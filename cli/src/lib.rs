//! The `tether` command line: every command ([`commands`]), the engine of `tether sync` and
//! `tether dev` ([`sync`]), `tether bench` ([`bench`]) and `tether mcp` (`mcp`). It speaks to
//! relays and agents through [`tether_client`] only; `tether serve` runs [`tether_relay`].
#![warn(missing_docs)]

mod advice;
mod bench;
pub mod commands;
mod mcp;
pub mod sync;
