//! One vocabulary for every transport: what a node serves (`--transports tcp,rdma,shm`) and
//! what a client picks per node (`--transport auto|tcp|rdma|shm`; `auto` takes shared memory
//! for nodes on the client's host, then RDMA, then TCP), checked before anything starts so a
//! missing device or library is a clear refusal, never a failure half way through.

use std::sync::Arc;

use mooring_core::{Error, ErrorCode, Result};
use mooring_proto::transport::{DataPlane, DataServer};

/// A data-plane transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Transport {
    /// The node's TCP data server (every node serves it).
    Tcp,
    /// One-sided RDMA READ/WRITE through the node's NIC.
    Rdma,
    /// The segment in shared memory, mapped by clients on the node's host.
    Shm,
}

impl Transport {
    /// The name used on the command line and in config files.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
            Transport::Shm => "shm",
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
    /// Always shared memory (fails for nodes on other hosts or without it).
    Shm,
}

impl TransportChoice {
    /// The choice `name` (as on the command line, any case) names, if any.
    pub fn named(name: &str) -> Option<TransportChoice> {
        [Self::Auto, Self::Tcp, Self::Rdma, Self::Shm]
            .into_iter()
            .find(|choice| choice.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            TransportChoice::Auto => "auto",
            TransportChoice::Tcp => "tcp",
            TransportChoice::Rdma => "rdma",
            TransportChoice::Shm => "shm",
        }
    }
}

/// What a node serves unless told otherwise: TCP, and its memory to clients on its host.
pub const DEFAULT_SERVED: &str = "tcp,shm";

/// The transports a `--transports` flag (or its config key) names, [`DEFAULT_SERVED`] when
/// it names none.
pub fn served(list: Option<&str>) -> Result<Vec<Transport>> {
    parse_served(list.unwrap_or(DEFAULT_SERVED))
}

/// Parses a node's `--transports` list (comma-separated, e.g. `tcp,rdma`).
pub fn parse_served(list: &str) -> Result<Vec<Transport>> {
    let mut served = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let transport = match name {
            "tcp" => Transport::Tcp,
            "rdma" => Transport::Rdma,
            "shm" => Transport::Shm,
            other => {
                return Err(Error::new(
                    ErrorCode::INVALID_PARAMS,
                    format!(
                        "unknown transport {other:?}: use a list of tcp, rdma and shm (e.g. \
                         tcp,shm)"
                    ),
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
            "--transports names no transport: use a list of tcp, rdma and shm (e.g. tcp,shm)",
        ));
    }
    if !served.contains(&Transport::Tcp) {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            "--transports must include tcp: every node serves its data over TCP (stage \
             requests, clients on other hosts, the RDMA and shared-memory handshakes)",
        ));
    }
    served.sort();
    Ok(served)
}

/// `server`, offering its exports in shared memory to clients on this host too (the node
/// must then back its segments with shared memory: see `NodeConfig::shared`): to processes
/// of this user, and of `group`'s members if given.
pub fn serve_shm(server: Arc<dyn DataServer>, group: Option<u32>) -> Result<Arc<dyn DataServer>> {
    #[cfg(not(madsim))]
    {
        let allowed = mooring_transport_shm::AllowedPeers::owner_only();
        let allowed = match group {
            Some(gid) => allowed.with_group(gid),
            None => allowed,
        };
        let shm = mooring_transport_shm::ShmServer::start_allowing(allowed)?;
        Ok(Arc::new(mooring_transport_shm::ShmDataServer::new(
            server, shm,
        )))
    }
    #[cfg(madsim)]
    {
        let _ = (server, group);
        Err(no_shm_in_simulation())
    }
}

/// The id of group `name` (a number is taken as it is), from `/etc/group`.
pub fn group_id(name: &str) -> Result<u32> {
    if let Ok(gid) = name.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group").map_err(|e| {
        Error::new(
            ErrorCode::INVALID_PARAMS,
            format!("cannot read /etc/group to find group {name:?} ({e}): give its number"),
        )
    })?;
    groups
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let group = fields.next()?;
            let gid = fields.nth(1)?.parse().ok()?;
            (group == name).then_some(gid)
        })
        .next()
        .ok_or_else(|| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("no group named {name:?} in /etc/group: give its name or number"),
            )
        })
}

#[cfg(madsim)]
fn no_shm_in_simulation() -> Error {
    Error::new(
        ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
        "shared memory needs real processes; the simulation runs every node in one",
    )
}

/// `plane`, reaching nodes on this host through shared memory (all of them under `shm`,
/// where a node on another host is an error; those that offer it under `auto`).
pub fn same_host(plane: Arc<dyn DataPlane>, choice: TransportChoice) -> Result<Arc<dyn DataPlane>> {
    match choice {
        TransportChoice::Tcp | TransportChoice::Rdma => Ok(plane),
        #[cfg(not(madsim))]
        TransportChoice::Auto | TransportChoice::Shm => {
            let required = choice == TransportChoice::Shm;
            match mooring_transport_shm::ShmDataPlane::new(plane.clone(), required) {
                Ok(shm) => Ok(Arc::new(shm)),
                Err(e) if required => Err(e),
                Err(e) => {
                    tracing::debug!("no shared memory for this client: {e}");
                    Ok(plane)
                }
            }
        }
        #[cfg(madsim)]
        TransportChoice::Auto => Ok(plane),
        #[cfg(madsim)]
        TransportChoice::Shm => Err(no_shm_in_simulation()),
    }
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

/// `server`, serving RDMA too on the first of `devices` that exists (any device when empty),
/// registering `register_bytes` with it. The error says what is missing: kernel support, a
/// device, memlock, or a build with RDMA (`--features rdma`).
pub fn serve_rdma(
    server: Arc<dyn DataServer>,
    devices: &[String],
    register_bytes: u64,
) -> Result<Arc<dyn DataServer>> {
    #[cfg(feature = "rdma")]
    {
        use mooring_transport_rdma::verbs::Verbs;
        use mooring_transport_rdma::{RdmaDataServer, RdmaServer, server::DEFAULT_MAX_QUEUE_PAIRS};
        let verbs = mooring_transport_rdma::device::open(devices, register_bytes)?;
        let name = verbs.caps().name.clone();
        let rdma = Arc::new(RdmaServer::new(Arc::new(verbs), DEFAULT_MAX_QUEUE_PAIRS));
        tracing::info!(device = %name, "serving RDMA");
        Ok(Arc::new(RdmaDataServer::new(server, rdma)))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = server;
        Err(without_rdma_build(devices, register_bytes))
    }
}

/// The data plane a client uses: `via` (the data servers' transport) for `tcp`; under
/// `auto`, shared memory for nodes on this host that offer it, then RDMA for nodes that serve
/// it when this process can open a device, else `via`; RDMA only under `rdma`, failing here
/// if no device can be opened; shared memory only under `shm`.
pub fn client_data_plane(
    via: Arc<dyn DataPlane>,
    choice: TransportChoice,
    devices: &[String],
) -> Result<Arc<dyn DataPlane>> {
    let network = match choice {
        TransportChoice::Shm => via,
        _ => network_data_plane(via, choice, devices)?,
    };
    same_host(network, choice)
}

/// RDMA (as `choice` asks) in front of `via`.
fn network_data_plane(
    via: Arc<dyn DataPlane>,
    choice: TransportChoice,
    devices: &[String],
) -> Result<Arc<dyn DataPlane>> {
    if choice == TransportChoice::Tcp {
        return Ok(via);
    }
    #[cfg(feature = "rdma")]
    {
        use mooring_transport_rdma::{RdmaClient, RdmaConfig, RdmaDataPlane};
        match mooring_transport_rdma::device::open(devices, 0) {
            Ok(verbs) => {
                let client = RdmaClient::new(Arc::new(verbs), RdmaConfig::default());
                let required = choice == TransportChoice::Rdma;
                Ok(Arc::new(RdmaDataPlane::new(client, via, required)))
            }
            Err(e) if choice == TransportChoice::Rdma => Err(e),
            Err(e) => {
                tracing::debug!("no RDMA for this client, using TCP: {e}");
                Ok(via)
            }
        }
    }
    #[cfg(not(feature = "rdma"))]
    match choice {
        TransportChoice::Rdma => Err(without_rdma_build(devices, 0)),
        _ => Ok(via),
    }
}

/// Why a build without RDMA cannot use it: what else is missing here too, or the build.
#[cfg(not(feature = "rdma"))]
fn without_rdma_build(devices: &[String], register_bytes: u64) -> Error {
    match mooring_transport_rdma::device::choose(devices, register_bytes) {
        Err(missing) => missing,
        Ok(choice) => Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            format!(
                "RDMA device {} is present, but this build of mooring has no RDMA support: \
                 install libibverbs-dev librdmacm-dev clang libclang-dev and build with \
                 `cargo build --release -p mooring --features rdma`",
                choice.name
            ),
        ),
    }
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
        assert_eq!(
            parse_served("shm,tcp").unwrap(),
            vec![Transport::Tcp, Transport::Shm]
        );
        assert!(
            parse_served("shm")
                .unwrap_err()
                .to_string()
                .contains("must include tcp")
        );
        assert_eq!(
            device_names(Some("mlx5_0, mlx5_1,")),
            vec!["mlx5_0".to_string(), "mlx5_1".to_string()]
        );
        assert!(device_names(None).is_empty());
    }

    #[test]
    fn rdma_is_refused_with_the_reason_on_this_machine() {
        if std::path::Path::new("/sys/class/infiniband").exists() {
            eprintln!(
                "SKIPPED: this machine has RDMA devices; the refusal is for machines without"
            );
            return;
        }
        let via: Arc<dyn DataPlane> = mooring_transport_tcp::TcpDataPlane::new(
            Arc::new(mooring_transport_tcp::LocalSegments::default()),
            Default::default(),
        );
        for choice in [TransportChoice::Auto, TransportChoice::Tcp] {
            assert!(
                client_data_plane(via.clone(), choice, &[]).is_ok(),
                "{choice:?}"
            );
        }
        let e = match client_data_plane(via, TransportChoice::Rdma, &[]) {
            Err(e) => e,
            Ok(_) => panic!("RDMA chosen without a device"),
        };
        assert_eq!(e.code, ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
        let message = e.to_string();
        assert!(
            message.contains("RDMA") && message.contains("no RDMA kernel support"),
            "{message}"
        );
    }
}
