//! Connecting: a client alone, or one contributing a segment from an in-process node whose
//! data server takes the port given or the first free one of a range.

use std::path::Path;

use mooring::peer::peer_addresses;
use mooring::transports::TransportChoice;
use mooring::{Client, ClientConfig};
use mooring_core::{Error, ErrorCode, Result};

use super::NativeClient;
use super::backend::Backend;
use crate::errors::invalid;

/// Where a port search for the in-process node's data server starts and ends.
pub(super) type PortRange = (u16, u16);

impl NativeClient {
    /// Connects to the cluster `master` names: a master (see [`NativeClient::connect_async`])
    /// or a peer cluster (`peer://...`), which a store with a segment size joins as a peer
    /// listening on `hostname` (its port, or any free one).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn join(
        master: String,
        hostname: String,
        segment_size: u64,
        token_file: Option<String>,
        ports: PortRange,
        rdma: Option<Vec<String>>,
        tenant: Option<String>,
        transport: Option<TransportChoice>,
    ) -> Result<(Backend, String)> {
        let Some(seeds) = peer_addresses(&master) else {
            let (client, hostname) = NativeClient::connect_async(
                master,
                hostname,
                segment_size,
                token_file,
                ports,
                rdma,
                tenant,
                transport,
            )
            .await?;
            return Ok((Backend::Master(client), hostname));
        };
        if transport.is_some_and(|t| t != TransportChoice::Auto) {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!(
                    "{master} names a peer cluster, whose peers choose shared memory or TCP \
                     themselves: unset MOORING_TRANSPORT"
                ),
            ));
        }
        if rdma.is_some() || tenant.is_some() {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                format!(
                    "{master} names a peer cluster, which moves data over TCP and serves no \
                     tenants yet: use protocol \"tcp\" and the default tenant"
                ),
            ));
        }
        let token = mooring::token::resolve(token_file.as_deref().map(Path::new))?;
        let (host, port) = split_port(&hostname)?;
        let listen = format!("{host}:{}", port.unwrap_or(0));
        let backend = Backend::join_peers(seeds, &listen, segment_size, token).await?;
        let hostname = backend.segment_name().map_or(hostname, str::to_string);
        Ok((backend, hostname))
    }

    /// Connects, contributing `segment_size` bytes from a data server on `host:port`, the
    /// port being the one in `hostname` or the first free one of `ports`. `transport`, when
    /// given, is how this client reaches nodes (otherwise RDMA for `protocol="rdma"`, else the
    /// best a node offers).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn connect_async(
        master: String,
        hostname: String,
        segment_size: u64,
        token_file: Option<String>,
        ports: PortRange,
        rdma: Option<Vec<String>>,
        tenant: Option<String>,
        transport: Option<TransportChoice>,
    ) -> Result<(Client, String)> {
        let token = mooring::token::resolve(token_file.as_deref().map(Path::new))?;
        // Mooncake's `protocol="rdma"`: data over RDMA (failing here without a device), and a
        // contributed segment served over RDMA too.
        let base = |config: ClientConfig| {
            let mut config = ClientConfig {
                token: token.clone(),
                tenant: tenant.clone(),
                ..config
            };
            if let Some(devices) = &rdma {
                config.transport = TransportChoice::Rdma;
                config.rdma_devices = devices.clone();
                if let Some(segment) = config.segment.as_mut() {
                    segment.rdma_devices = Some(devices.clone());
                }
            }
            if let Some(transport) = transport {
                config.transport = transport;
            }
            config
        };
        if segment_size == 0 {
            let client = Client::connect(base(ClientConfig::new(master))).await?;
            return Ok((client, hostname));
        }
        let (host, explicit) = split_port(&hostname)?;
        let candidates: Vec<u16> = match explicit {
            Some(port) => vec![port],
            None => free_ports(host, ports),
        };
        let mut last = None;
        for port in candidates.into_iter().take(20) {
            let name = format!("{host}:{port}");
            let mut config =
                base(ClientConfig::new(master.clone()).contributing(segment_size, &name));
            if let Some(segment) = config.segment.as_mut() {
                segment.advertise = Some(name.clone());
                segment.node.name = Some(name.clone());
                // Engines on one host (prefill beside decode) map each other's segments.
                segment.node.shared = true;
            }
            match Client::connect(config).await {
                Ok(client) => return Ok((client, name)),
                // Another process took the port between the probe and the bind: next one.
                Err(e) if e.to_string().contains("cannot listen on") && explicit.is_none() => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            invalid(format!(
                "no free port for the data server on {host} in {}-{}: free one, or give local_hostname as host:port",
                ports.0, ports.1
            ))
        }))
    }
}

/// The transport `MOORING_TRANSPORT` names: `auto`, `tcp`, `shm` or `rdma`.
pub(super) fn transport_choice(name: &str) -> Result<TransportChoice> {
    TransportChoice::named(name).ok_or_else(|| {
        invalid(format!(
            "MOORING_TRANSPORT={name:?}: use auto (shared memory where it can, then RDMA, then \
             TCP), tcp, shm or rdma"
        ))
    })
}

/// Splits `host[:port]`.
fn split_port(hostname: &str) -> Result<(&str, Option<u16>)> {
    if hostname.is_empty() {
        return Err(invalid(
            "local_hostname is empty: give this machine's address or name",
        ));
    }
    // An IPv6 address without brackets has colons but no port.
    match hostname.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') || host.ends_with(']') => {
            let port = port.parse().map_err(|_| {
                invalid(format!(
                    "{hostname:?}: the part after ':' is not a port number"
                ))
            })?;
            Ok((host, Some(port)))
        }
        _ => Ok((hostname, None)),
    }
}

/// Ports of `range` free on `host` right now, starting at a random one (so processes that
/// start together spread out).
fn free_ports(host: &str, range: PortRange) -> Vec<u16> {
    let (low, high) = (range.0.min(range.1), range.0.max(range.1));
    let span = u32::from(high - low) + 1;
    let start = (mooring::random_client_id().0 % u128::from(span)) as u32;
    (0..span)
        .map(|i| low + ((start + i) % span) as u16)
        .filter(|port| std::net::TcpListener::bind((host, *port)).is_ok())
        .take(20)
        .collect()
}
