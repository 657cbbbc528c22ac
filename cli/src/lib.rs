//! The `tether` command line: every command ([`commands`]), the engine of `tether sync` and
//! `tether dev` ([`sync`]), `tether bench` ([`bench`]), `tether mcp` (`mcp`) and the sandbox templates (`templates`:
//! `tether image build --template`, `tether create --template`). It speaks to
//! relays and agents through [`tether_client`] only; `tether serve` runs [`tether_relay`].
#![warn(missing_docs)]

mod advice;
mod bench;
pub mod commands;
mod mcp;
pub mod sync;
mod templates;
