//! Finding a group's masters through etcd, for clients and nodes given
//! `etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]` as the master's address (Mooncake's form for
//! its highly available masters) instead of every master's address.
//!
//! Masters that may lead campaign for their group's office under
//! `/mooring/<cluster>/leader/` (see [`crate::ha`]); each campaign key holds the master's
//! advertised address, and the oldest one is the leader's. This asks etcd's JSON gateway
//! (`POST /v3/kv/range`, which every etcd 3.4 and later serves on its client port) for those
//! keys, oldest first, so no etcd client library (nor the protobuf compiler it needs) is part
//! of a client's build. The control plane asks again whenever none of the masters it found
//! leads ([`mooring_transport_tcp::TcpControlPlane::discovered`]).

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use mooring_core::{Error, ErrorCode, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one question to one etcd endpoint may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest answer read from etcd.
const MAX_ANSWER: usize = 1 << 20;
/// The group name masters use when started without `--cluster`.
pub const DEFAULT_CLUSTER: &str = "default";

/// Where a group's masters are found: etcd's endpoints and the group's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdMasters {
    /// `host:port` of each etcd endpoint.
    endpoints: Vec<String>,
    /// The group's name (`mooring master --cluster`).
    cluster: String,
}

fn refused(what: String) -> Error {
    Error::new(ErrorCode::INVALID_PARAMS, what)
}

fn etcd_failed(what: String) -> Error {
    Error::new(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, what)
}

impl EtcdMasters {
    /// The etcd address `address` names, if it is one (`etcd://...`); an error if it is one
    /// this client cannot use.
    pub fn parse(address: &str) -> Result<Option<EtcdMasters>> {
        let Some(rest) = address.trim().strip_prefix("etcd://") else {
            return Ok(None);
        };
        // Endpoints may carry etcd's own `http://` (as `--etcd` takes them).
        let rest = rest.replace("http://", "");
        if rest.contains("://") {
            return Err(refused(format!(
                "{address:?}: masters are found through etcd's plain-http client port (give \
                 etcd://HOST:PORT)"
            )));
        }
        let (hosts, cluster) = match rest.split_once('/') {
            Some((hosts, cluster)) if !cluster.is_empty() => (hosts, cluster),
            Some((hosts, _)) => (hosts, DEFAULT_CLUSTER),
            None => (rest.as_str(), DEFAULT_CLUSTER),
        };
        let mut endpoints = Vec::new();
        for host in hosts
            .split([',', ';'])
            .map(str::trim)
            .filter(|h| !h.is_empty())
        {
            if !host.contains(':') {
                return Err(refused(format!(
                    "{address:?}: etcd endpoint {host:?} has no port (give etcd://HOST:PORT, \
                     e.g. etcd://127.0.0.1:2379)"
                )));
            }
            endpoints.push(host.to_string());
        }
        if endpoints.is_empty() {
            return Err(refused(format!(
                "{address:?} names no etcd endpoint (give etcd://HOST:PORT[/CLUSTER])"
            )));
        }
        Ok(Some(EtcdMasters {
            endpoints,
            cluster: cluster.to_string(),
        }))
    }

    /// The addresses of the masters campaigning for the group's office, the leader first;
    /// an error naming every endpoint tried when none answered or no master campaigns.
    pub async fn masters(&self) -> Result<Vec<String>> {
        let mut failures = Vec::new();
        for endpoint in &self.endpoints {
            match self.ask(endpoint).await {
                Ok(masters) if !masters.is_empty() => return Ok(masters),
                Ok(_) => failures.push(format!(
                    "{endpoint}: no master of group {:?} campaigns",
                    self.cluster
                )),
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
        Err(etcd_failed(format!(
            "cannot find a master through etcd ({}); check that etcd runs there and that \
             `mooring master --etcd` runs with --cluster {}",
            failures.join("; "),
            self.cluster
        )))
    }

    /// The campaigning masters according to one endpoint.
    async fn ask(&self, endpoint: &str) -> std::result::Result<Vec<String>, String> {
        let prefix = format!("/mooring/{}/leader/", self.cluster);
        // Every key under the prefix: the range ends where the prefix's last byte is one more.
        let mut end = prefix.clone().into_bytes();
        *end.last_mut().expect("a non-empty prefix") += 1;
        let question = serde_json::json!({
            "key": BASE64.encode(prefix.as_bytes()),
            "range_end": BASE64.encode(&end),
            "sort_order": "ASCEND",
            "sort_target": "CREATE",
        })
        .to_string();
        let answer = tokio::time::timeout(ASK_TIMEOUT, post(endpoint, "/v3/kv/range", &question))
            .await
            .map_err(|_| format!("no answer within {ASK_TIMEOUT:?}"))??;
        campaigners(&answer)
    }
}

impl std::fmt::Display for EtcdMasters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "etcd://{}/{}", self.endpoints.join(","), self.cluster)
    }
}

/// The masters' addresses in a range answer, in its order.
fn campaigners(answer: &[u8]) -> std::result::Result<Vec<String>, String> {
    let answer: serde_json::Value = serde_json::from_slice(answer)
        .map_err(|e| format!("etcd's answer is not JSON ({e}): is this etcd's client port?"))?;
    let Some(kvs) = answer.get("kvs") else {
        // etcd leaves out an empty list.
        return Ok(Vec::new());
    };
    let kvs = kvs
        .as_array()
        .ok_or("etcd's answer has a malformed key list")?;
    kvs.iter()
        .map(|kv| {
            let value = kv
                .get("value")
                .and_then(|v| v.as_str())
                .ok_or("a campaign key without a value")?;
            let bytes = BASE64
                .decode(value)
                .map_err(|e| format!("a campaign value is not base64: {e}"))?;
            String::from_utf8(bytes).map_err(|_| "a campaign value is not text".to_string())
        })
        .collect()
}

/// POSTs `body` (JSON) to `path` at `host:port`; the answer's body, if its status is 200.
async fn post(endpoint: &str, path: &str, body: &str) -> std::result::Result<Vec<u8>, String> {
    let mut stream = TcpStream::connect(endpoint)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    // HTTP/1.0: the answer is the bytes until etcd closes the connection (no chunks).
    let request = format!(
        "POST {path} HTTP/1.0\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot send: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER as u64 + 1)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("cannot read the answer: {e}"))?;
    if answer.len() > MAX_ANSWER {
        return Err(format!("the answer is over {MAX_ANSWER} bytes"));
    }
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer is not HTTP: is this etcd's client port?")?;
    let status = String::from_utf8_lossy(&answer[..split]);
    let status = status.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(format!("etcd answered {status:?}"));
    }
    Ok(answer[split + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_addresses_parse_with_or_without_a_group() {
        assert_eq!(EtcdMasters::parse("10.0.0.1:50051").unwrap(), None);
        let one = EtcdMasters::parse("etcd://127.0.0.1:2379")
            .unwrap()
            .unwrap();
        assert_eq!(one.to_string(), "etcd://127.0.0.1:2379/default");
        let two = EtcdMasters::parse("etcd://a:1;http://b:2/prod")
            .unwrap()
            .unwrap();
        assert_eq!(two.endpoints, ["a:1", "b:2"]);
        assert_eq!(two.cluster, "prod");
        for bad in [
            "etcd://",
            "etcd://host",
            "etcd://https://a:1",
            "etcd:///prod",
        ] {
            let e = EtcdMasters::parse(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{bad}");
            assert!(e.to_string().contains("etcd://HOST:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_range_answer_gives_the_campaigners_in_order() {
        let value = |s: &str| BASE64.encode(s);
        let answer = serde_json::json!({
            "header": {"revision": "9"},
            "kvs": [
                {"key": value("/mooring/default/leader/1a"), "value": value("m1:7000")},
                {"key": value("/mooring/default/leader/2b"), "value": value("m2:7000")},
            ],
            "count": "2",
        });
        assert_eq!(
            campaigners(answer.to_string().as_bytes()).unwrap(),
            ["m1:7000", "m2:7000"]
        );
        assert_eq!(
            campaigners(br#"{"header":{"revision":"3"}}"#).unwrap(),
            Vec::<String>::new()
        );
        assert!(campaigners(b"<html>").unwrap_err().contains("client port"));
        let bad = serde_json::json!({"kvs": [{"value": "***"}]}).to_string();
        assert!(campaigners(bad.as_bytes()).unwrap_err().contains("base64"));
    }
}
