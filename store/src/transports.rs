//! One vocabulary for every transport: what a node serves (`--transports tcp,rdma`) and what
//! a client picks per node (`--transport auto|tcp|rdma`), checked before anything starts so a
//! missing device or library is a clear refusal, never a failure half way through.

use mooring_core::{Error, ErrorCode, Result};

/// A data-plane transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// The node's TCP data server (every node serves it).
    Tcp,
    /// One-sided RDMA READ/WRITE through the node's NIC.
    Rdma,
}

impl Transport {
    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// What a client uses to reach a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TransportChoice {
    /// The best the node offers that this client can use.
    Auto,
    /// Always TCP.
    Tcp,
    /// Always RDMA (fails for nodes without it).
    Rdma,
}

/// Parses a node's `--transports` list (comma-separated, e.g. `tcp,rdma`).
pub fn parse_served(list: &str) -> Result<Vec<Transport>> {
    let mut served = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let transport = match name {
            "tcp" => Transport::Tcp,
            "rdma" => Transport::Rdma,
            "shm" => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    "the same-host transport (shm) is not available yet; serve tcp or rdma",
                ));
            }
            other => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!("unknown transport {other:?}: use tcp, rdma or both (tcp,rdma)"),
                ));
            }
        };
        if !served.contains(&transport) {
            served.push(transport);
        }
    }
    if served.is_empty() {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "--transports names no transport: use tcp, rdma or tcp,rdma",
        ));
    }
    served.sort();
    Ok(served)
}

/// Splits a `--rdma-device` list (`mlx5_0,mlx5_1`).
pub fn device_names(list: Option<&str>) -> Vec<String> {
    list.map(|l| {
        l.split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(String::from)
            .collect()
    })
    .unwrap_or_default()
}

/// Why this process cannot move data over RDMA with one of `devices` (any when empty),
/// registering `register_bytes`: no kernel support, no device, a memlock limit too low, a
/// build without ibverbs, or, where all of those are fine, that the node and client data
/// path over the RDMA transport is not built yet. The message says what to do.
pub fn rdma_unavailable(devices: &[String], register_bytes: u64) -> Error {
    let choice = match mooring_transport_rdma::device::choose(devices, register_bytes) {
        Ok(choice) => choice,
        Err(missing) => return missing,
    };
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        format!(
            "RDMA device {} is usable, but nodes and clients do not move data over RDMA yet \
             (the transport is built and tested on a software verbs model; the data path \
             through it is the next step): use --transports tcp / --transport tcp",
            choice.name
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_lists_parse_and_refuse_what_they_should() {
        assert_eq!(parse_served("tcp").unwrap(), vec![Transport::Tcp]);
        assert_eq!(
            parse_served("rdma, tcp,rdma").unwrap(),
            vec![Transport::Tcp, Transport::Rdma]
        );
        for bad in ["", ",", "udp", "tcp,quic"] {
            let e = parse_served(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad}");
        }
        assert!(
            parse_served("shm")
                .unwrap_err()
                .to_string()
                .contains("not available yet")
        );
        assert_eq!(
            device_names(Some("mlx5_0, mlx5_1,")),
            vec!["mlx5_0".to_string(), "mlx5_1".to_string()]
        );
        assert!(device_names(None).is_empty());
    }

    #[test]
    fn rdma_is_refused_with_the_reason_on_this_machine() {
        let e = rdma_unavailable(&[], 1 << 20);
        assert_eq!(e.code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
        let message = e.to_string();
        assert!(
            message.contains("RDMA")
                && (message.contains("--transports tcp") || message.contains("ulimit")),
            "{message}"
        );
    }
}
