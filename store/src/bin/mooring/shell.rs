//! The store from the shell: `put`, `get`, `cp`, `mv`, `rm` and `ls`, each the whole life of
//! one client.

use std::io::{Read, Write};

use mooring::peer::{MAX_GUEST_VALUE, PeerGuest, peer_addresses};
use mooring::{Client, ClientConfig};
use mooring_core::{Error, ErrorCode, ReplicateConfig};

use super::args::{ClientArgs, CpArgs, GetArgs, LsArgs, MvArgs, PutArgs, RmArgs};
use super::output_failed;

async fn connect(args: &ClientArgs) -> Result<Client, Error> {
    let (master, rpc_timeout) = args.master_and_timeout()?;
    if peer_addresses(&master).is_some() {
        return Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            format!(
                "{master} names a peer cluster, which has no master to list keys, copy \
                 replicas or report segments: put, get and rm KEY work against it"
            ),
        ));
    }
    let mut config = ClientConfig::new(master);
    config.rpc_timeout = rpc_timeout;
    config.token = args.auth.token()?;
    config.transport = args.transport;
    config.rdma_devices = mooring::transports::device_names(args.rdma_device.as_deref());
    config.tenant = args.tenant.clone();
    Client::connect(config).await
}

/// A guest of the peer cluster `args` name, if it names one (`peer://...`).
fn peer_guest(args: &ClientArgs) -> Result<Option<PeerGuest>, Error> {
    let (address, timeout) = args.master_and_timeout()?;
    let Some(peers) = peer_addresses(&address) else {
        return Ok(None);
    };
    if args.tenant.is_some() {
        return Err(Error::new(
            ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
            "tenants are not served by peer clusters yet: drop --tenant (MOORING_TENANT)",
        ));
    }
    PeerGuest::new(peers, args.auth.token()?, timeout).map(Some)
}

/// Runs `work` with a client of the master `args` name, then says goodbye whether the work
/// succeeded or not: a CLI call is a client's whole life, and one that ends without a word
/// would be noticed only when it expires (one log line on the master per call).
pub(crate) async fn with_client<T>(
    args: &ClientArgs,
    work: impl AsyncFnOnce(&Client) -> Result<T, Error>,
) -> Result<T, Error> {
    let client = connect(args).await?;
    let result = work(&client).await;
    if let Err(e) = client.close().await {
        tracing::debug!("closing the client: {e}");
    }
    result
}

pub(crate) async fn run_put(args: PutArgs) -> Result<(), Error> {
    if let Some(guest) = peer_guest(&args.client)? {
        if args.replicas > 1 || args.hard_pin || args.soft_pin {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                "a peer cluster keeps one copy of each value, unpinned: drop --replicas, \
                 --hard-pin and --soft-pin",
            ));
        }
        // The newest write wins in a peer cluster, so a put is an upsert.
        let value = read_value(&args, MAX_GUEST_VALUE as u64)?;
        guest.put(&args.key, value.clone()).await?;
        out!("stored {} ({} bytes)", printable(&args.key), value.len());
        return Ok(());
    }
    let mut config = ReplicateConfig::replicas(args.replicas);
    config.with_hard_pin = args.hard_pin;
    if args.soft_pin {
        config = config.soft_pinned(None);
    } else if args.soft_unpin {
        config = config.soft_unpinned();
    }
    with_client(&args.client, async |client| {
        // A replica lives in one segment: a value larger than the largest cannot be stored,
        // so no more than that is read (`put k /dev/zero` ends with an error, not out of
        // memory).
        let limit = client
            .segments()
            .await?
            .iter()
            .map(|s| s.size)
            .max()
            .unwrap_or(0);
        let value = read_value(&args, limit)?;
        if args.upsert {
            client.upsert(&args.key, &value, &config).await?;
        } else {
            client.put(&args.key, &value, &config).await?;
        }
        // Replicas go to distinct segments: with fewer segments than asked, fewer are stored.
        // A listing takes no lease, so the value can be removed right after.
        let pattern = format!("^{}$", regex::escape(&args.key));
        let stored = client.query(&pattern).await?;
        let replicas = stored.first().map_or(0, |k| k.replicas);
        let key = printable(&args.key);
        if replicas < args.replicas {
            out!(
                "stored {key} ({} bytes) with {replicas} of the {} replicas asked: only \
                 {replicas} segments could take a copy",
                value.len(),
                args.replicas
            );
        } else {
            out!("stored {key} ({} bytes, {replicas} replicas)", value.len());
        }
        Ok(())
    })
    .await
}

/// The value `put` stores: the argument, or the file's (or stdin's) bytes, refused once they
/// pass `limit` bytes (the largest segment) without reading further.
fn read_value(args: &PutArgs, limit: u64) -> Result<Vec<u8>, Error> {
    let (name, source): (String, Box<dyn Read>) = match (&args.value, &args.file) {
        (Some(v), _) => (
            "the value".into(),
            Box::new(std::io::Cursor::new(v.clone())),
        ),
        (None, Some(path)) if path.as_os_str() != "-" => {
            let file = std::fs::File::open(path).map_err(|e| {
                Error::new(
                    ErrorCode::FILE_READ_FAIL,
                    format!("{}: {e}", path.display()),
                )
            })?;
            (path.display().to_string(), Box::new(file))
        }
        _ => ("stdin".into(), Box::new(std::io::stdin())),
    };
    let mut value = Vec::new();
    source
        .take(limit.saturating_add(1))
        .read_to_end(&mut value)
        .map_err(|e| Error::new(ErrorCode::FILE_READ_FAIL, format!("{name}: {e}")))?;
    if value.len() as u64 > limit {
        return Err(Error::new(
            ErrorCode::INVALID_PARAMS,
            format!(
                "{name} is larger than the largest segment ({limit} bytes), which is the most \
                 one value can be; nothing was stored (mount a larger segment, or split the value)"
            ),
        ));
    }
    Ok(value)
}

/// `key` with control characters escaped (`\n`, `\u{1b}`), so a listing cannot be garbled or
/// drive the terminal; every other character as it is.
fn printable(key: &str) -> String {
    key.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

pub(crate) async fn run_get(args: GetArgs) -> Result<(), Error> {
    if let Some(guest) = peer_guest(&args.client)? {
        let value = guest.get(&args.key).await?.ok_or_else(|| {
            Error::new(
                ErrorCode::OBJECT_NOT_FOUND,
                format!("{} has no value in the peer cluster", printable(&args.key)),
            )
        })?;
        return write_value(&args, &value);
    }
    with_client(&args.client, async |client| {
        let value = client.get(&args.key).await?;
        write_value(&args, &value)
    })
    .await
}

/// Writes a value `get` fetched where `args` say.
fn write_value(args: &GetArgs, value: &[u8]) -> Result<(), Error> {
    match &args.out {
        Some(path) => std::fs::write(path, value).map_err(|e| {
            Error::new(
                ErrorCode::FILE_WRITE_FAIL,
                format!("{}: {e}", path.display()),
            )
        })?,
        None => {
            let mut stdout = std::io::stdout();
            if let Err(e) = stdout.write_all(value).and_then(|()| stdout.flush()) {
                output_failed(e);
            }
        }
    }
    Ok(())
}

pub(crate) async fn run_cp(args: CpArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let targets: Vec<&str> = args.segments.iter().map(String::as_str).collect();
        client.copy(&args.key, &targets).await?;
        out!(
            "copied {} to {}",
            printable(&args.key),
            args.segments.join(", ")
        );
        Ok(())
    })
    .await
}

pub(crate) async fn run_mv(args: MvArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        client.move_replica(&args.key, &args.from, &args.to).await?;
        out!(
            "moved {} from {} to {}",
            printable(&args.key),
            args.from,
            args.to
        );
        Ok(())
    })
    .await
}

pub(crate) async fn run_rm(args: RmArgs) -> Result<(), Error> {
    if let Some(guest) = peer_guest(&args.client)? {
        let Some(key) = &args.key else {
            return Err(Error::new(
                ErrorCode::UNAVAILABLE_IN_CURRENT_MODE,
                "a peer cluster keeps no list of its keys, so it cannot remove by regex or \
                 remove all: name the key",
            ));
        };
        match guest.remove(key).await? {
            true => out!("removed {}", printable(key)),
            false => out!("{} had no value", printable(key)),
        }
        return Ok(());
    }
    with_client(&args.client, async |client| {
        if let Some(key) = &args.key {
            client.remove(key).await?;
            out!("removed {}", printable(key));
        } else if let Some(regex) = &args.regex {
            out!("removed {} objects", client.remove_by_regex(regex).await?);
        } else {
            out!("removed {} objects", client.remove_all().await?);
        }
        Ok(())
    })
    .await
}

pub(crate) async fn run_ls(args: LsArgs) -> Result<(), Error> {
    with_client(&args.client, async |client| {
        let keys = client.query(&args.regex).await?;
        for k in &keys {
            let disk = if k.on_disk { " +disk" } else { "" };
            out!(
                "{:>12}  {}x{disk}  {}",
                k.size,
                k.replicas,
                printable(&k.key)
            );
        }
        out!("{} keys", keys.len());
        Ok(())
    })
    .await
}
