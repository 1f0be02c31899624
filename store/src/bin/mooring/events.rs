//! `mooring events`: follows a master's KV-event feed (`/kv_events` on its metrics address)
//! and prints each event as one line of JSON, for routers and operators.

use std::time::Duration;

use mooring::ops::http::fetch;
use mooring_core::{Error, ErrorCode};
use serde_json::Value;

use super::args::EventsArgs;
use super::wait_for_shutdown;

pub(crate) async fn run_events(args: EventsArgs) -> Result<(), Error> {
    let bearer = args.metrics_token()?;
    let interval = match &args.interval {
        Some(text) => mooring::config::parse_duration(text).map_err(super::usage_error)?,
        None => Duration::from_millis(100),
    };
    let mut follower = Follower {
        after: args.from_start.then_some(0),
        epoch: None,
    };
    tokio::select! {
        followed = async {
            loop {
                match follower.poll(&args, bearer.as_deref()).await {
                    Ok(true) => {}
                    Ok(false) => tokio::time::sleep(interval).await,
                    // The master is away (restarting, failing over): keep following; its
                    // next epoch tells whether events were missed meanwhile.
                    Err(e) if e.code == ErrorCode::RPC_FAIL => {
                        tracing::warn!("{e}; trying again in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        } => followed,
        () = wait_for_shutdown() => Ok(()),
    }
}

/// Where the follower is in the feed.
struct Follower {
    /// The last event number looked at (`None`: start from now).
    after: Option<u64>,
    /// The feed's epoch, once seen.
    epoch: Option<u64>,
}

impl Follower {
    /// Prints the next page's events; whether the page was full (more may be waiting).
    async fn poll(&mut self, args: &EventsArgs, bearer: Option<&str>) -> Result<bool, Error> {
        let mut query = format!(
            "/kv_events?tenant={}&prefix={}&limit={}",
            encode(&args.tenant),
            encode(args.prefix.as_deref().unwrap_or("")),
            args.page
        );
        if let Some(after) = self.after {
            query.push_str(&format!("&after={after}"));
        }
        let (status, body) = fetch(&args.metrics, &query, bearer).await?;
        let body = String::from_utf8_lossy(&body);
        if status != 200 {
            // Off, a wrong token, a bad parameter: nothing waiting fixes these.
            return Err(Error::new(
                ErrorCode::INVALID_PARAMS,
                format!(
                    "the master's metrics address answered {status}: {}",
                    body.trim()
                ),
            ));
        }
        let page: Value = serde_json::from_str(&body).map_err(|e| {
            Error::new(
                ErrorCode::INVALID_PARAMS,
                format!("{} serves no KV-event page: {e}", args.metrics),
            )
        })?;
        let epoch = page["epoch"].as_u64();
        if self.epoch.is_some() && epoch != self.epoch && self.after.is_some() {
            // Another master's numbers: start over from its oldest kept event.
            out!("{}", serde_json::json!({ "type": "AllBlocksCleared" }));
            self.epoch = epoch;
            self.after = Some(0);
            return Ok(true);
        }
        self.epoch = epoch;
        if page["missed"].as_bool() == Some(true) {
            out!("{}", serde_json::json!({ "type": "AllBlocksCleared" }));
        }
        let before = self.after.unwrap_or(0);
        let next = page["next"].as_u64().unwrap_or(before);
        for event in page["events"].as_array().into_iter().flatten() {
            out!("{event}");
        }
        self.after = Some(next);
        Ok(next.saturating_sub(before) >= args.page as u64)
    }
}

/// `text` as a query-string value.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}
