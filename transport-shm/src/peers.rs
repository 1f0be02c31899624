//! Who may use a node's shared-memory socket. The socket lives in the abstract namespace,
//! which has no file permissions: any local user can connect. The kernel says who connected
//! (`SO_PEERCRED`: the peer's uid, gid and pid at connect time), and the node serves only the
//! users it allows — its own uid, and on request the members of one group — before giving
//! the peer a handoff slot. Each allowed user has a share of the slots of its own, so one
//! user flooding the socket cannot starve another.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

/// What the kernel says about the process at the other end of a Unix socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Its effective user id.
    pub uid: u32,
    /// Its effective group id.
    pub gid: u32,
    /// Its process id (to look up supplementary groups).
    pub pid: i32,
}

/// The credentials of `stream`'s peer, as the kernel recorded them at connect time.
pub fn peer_cred(stream: &UnixStream) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, writable ucred and `len` its size, as SO_PEERCRED expects;
    // the descriptor is open for the call (borrowed from `stream`).
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        uid: cred.uid,
        gid: cred.gid,
        pid: cred.pid,
    })
}

/// The users a node's shared-memory socket serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedPeers {
    uid: u32,
    group: Option<u32>,
}

impl AllowedPeers {
    /// Only processes running as this process's effective user (the default).
    pub fn owner_only() -> AllowedPeers {
        AllowedPeers {
            // SAFETY: geteuid has no preconditions and cannot fail.
            uid: unsafe { libc::geteuid() },
            group: None,
        }
    }

    /// Also members of group `gid` (as their primary group or a supplementary one).
    pub fn with_group(self, gid: u32) -> AllowedPeers {
        AllowedPeers {
            group: Some(gid),
            ..self
        }
    }

    /// Whether `peer` may use the socket.
    pub fn admits(&self, peer: PeerCred) -> bool {
        if peer.uid == self.uid {
            return true;
        }
        let Some(group) = self.group else {
            return false;
        };
        peer.gid == group || supplementary_groups(peer.pid).contains(&group)
    }

    /// Who is allowed, for messages.
    pub fn describe(&self) -> String {
        match self.group {
            Some(gid) => format!("uid {} and members of gid {gid}", self.uid),
            None => format!("uid {} only", self.uid),
        }
    }
}

/// The supplementary groups of process `pid`, from `/proc` (empty if it is gone).
fn supplementary_groups(pid: i32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| {
            groups
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Handoffs in progress per user, each user held to its own share.
pub(crate) struct SlotsPerUser {
    per_user: usize,
    held: Mutex<HashMap<u32, usize>>,
}

impl SlotsPerUser {
    /// At most `per_user` handoffs at once for each user.
    pub(crate) fn new(per_user: usize) -> SlotsPerUser {
        SlotsPerUser {
            per_user,
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Takes a slot for `uid`, if it has one left.
    pub(crate) fn take(&self, uid: u32) -> bool {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(uid).or_default();
        if *count >= self.per_user {
            return false;
        }
        *count += 1;
        true
    }

    /// Gives back a slot `uid` took.
    pub(crate) fn give_back(&self, uid: u32) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&uid) {
            *count -= 1;
            if *count == 0 {
                held.remove(&uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_is_admitted_and_others_only_through_the_group() {
        let owner = AllowedPeers::owner_only();
        let me = PeerCred {
            uid: owner.uid,
            gid: 12345,
            pid: 0,
        };
        let stranger = PeerCred {
            uid: owner.uid.wrapping_add(1),
            gid: 4242,
            pid: -1,
        };
        assert!(owner.admits(me));
        assert!(!owner.admits(stranger));
        assert!(owner.clone().with_group(4242).admits(stranger));
        assert!(!owner.with_group(4243).admits(stranger));
    }

    #[test]
    fn a_connected_pair_reports_this_process() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let cred = peer_cred(&a).expect("SO_PEERCRED");
        assert_eq!(cred.pid, std::process::id() as i32);
        assert!(AllowedPeers::owner_only().admits(cred));
    }

    #[test]
    fn each_user_has_its_own_share_of_slots() {
        let slots = SlotsPerUser::new(2);
        assert!(slots.take(1) && slots.take(1));
        assert!(!slots.take(1), "user 1 used its share");
        assert!(slots.take(2), "user 2 is not starved by user 1");
        slots.give_back(1);
        assert!(slots.take(1));
    }
}
