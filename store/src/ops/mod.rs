//! Running and watching a cluster: the master's and nodes' metrics and the dashboard over
//! HTTP, the benchmark behind `mooring bench`, and the demos behind `mooring demo` (and
//! `mooring demo --peer`).

pub mod bench;
pub mod demo;
pub mod http;
pub mod metrics;
pub mod peer_demo;
