//! Running and watching a cluster: the master's and nodes' metrics and the dashboard over
//! HTTP, the benchmark behind `mooring bench`, and the demo behind `mooring demo`.

pub mod bench;
pub mod demo;
pub mod http;
pub mod metrics;
