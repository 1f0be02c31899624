//! Requests to the master and its replies: every RPC a client or node makes, declared once
//! with its reply type, and the envelope a request travels in.

use rkyv::rancor;
use rkyv::util::AlignedVec;

use mooring_core::{
    Checksum, ClientId, CopyGrant, DiskReport, DiskSyncAck, Error, ErrorCode, HeartbeatAck, HoldId,
    KeyListing, PrefetchGrant, PutGrant, ReplicaList, ReplicateConfig, SegmentId, SegmentInfo,
    SegmentSpec, StatsReport, TaskId, TaskReport, WriteId,
};

use super::cluster::ClusterInfo;
use super::frame::{FrameError, FrameKind, WireMessage, wire_message};
use super::standby::{FollowChunk, StateFile};
use crate::auth::{Peer, Roles};
use mooring_core::tenant::{local_key, stored_key, tenant_of};

pub use messages::*;

/// A request to the master that names its reply: `control.call(GetReplicaList { key })`
/// returns a [`ReplicaList`], and a reply of another kind is an error, not an arm at every
/// call site. Every request type travels as its [`MasterRequest`] variant of the same name,
/// answered by the [`Reply`] variant of that name.
pub trait Call: Into<MasterRequest> {
    /// What the master answers this request with.
    type Reply;
    /// The request's name, for errors and logs.
    const NAME: &'static str;
    /// The reply of this request's kind, or the reply as received if it is another kind.
    fn from_reply(reply: Reply) -> Result<Self::Reply, Box<Reply>>;
}

/// Declares each master RPC once: its request type (fields), its reply type, and their
/// variants in [`MasterRequest`] and [`Reply`].
macro_rules! master_rpcs {
    ($(
        $(#[$meta:meta])*
        $name:ident { $($field:ident : $fty:ty),* $(,)? } => $reply:ty;
    )*) => {
        $(
            $(#[$meta])*
            #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
            #[rkyv(derive(Debug))]
            pub struct $name { $(pub $field: $fty,)* }

            impl From<$name> for MasterRequest {
                fn from(request: $name) -> MasterRequest {
                    MasterRequest::$name(request)
                }
            }

            impl Call for $name {
                type Reply = $reply;
                const NAME: &'static str = stringify!($name);
                fn from_reply(reply: Reply) -> Result<$reply, Box<Reply>> {
                    match reply {
                        Reply::$name(r) => Ok(r),
                        other => Err(Box::new(other)),
                    }
                }
            }
        )*

        /// A request to the master. Every call that names a client counts as its heartbeat.
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum MasterRequest { $($name($name),)* }

        /// What the master answers: the variant named after the request, carrying its reply.
        #[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
        #[rkyv(derive(Debug))]
        pub enum Reply { $($name($reply),)* }

        impl MasterRequest {
            /// The request's name, for errors and logs.
            pub fn name(&self) -> &'static str {
                match self { $(MasterRequest::$name(_) => stringify!($name),)* }
            }

            /// This request archived as its own type (not as the enum of every request,
            /// whose archive is as large as its largest variant), with its name.
            pub fn archive_alone(&self) -> (&'static str, AlignedVec) {
                match self {
                    $(MasterRequest::$name(request) => (
                        stringify!($name),
                        rkyv::to_bytes::<rancor::Error>(request).expect("in-memory serialization"),
                    ),)*
                }
            }

            /// The request named `name` from the bytes [`MasterRequest::archive_alone`]
            /// gave (aligned to 16); why not, if they are not one.
            pub fn from_archived_alone(name: &[u8], bytes: &[u8]) -> Result<MasterRequest, String> {
                $(if name == stringify!($name).as_bytes() {
                    return rkyv::from_bytes::<$name, rancor::Error>(bytes)
                        .map(MasterRequest::$name)
                        .map_err(|e| format!("a {} does not decode: {e}", stringify!($name)));
                })*
                Err(format!("no request is named {:?}", String::from_utf8_lossy(name)))
            }
        }
    };
}

/// Calls `$each` on every object key `$request` names (as `&String`, or `&mut String` when
/// `$request` is borrowed mutably): the one list of which requests name keys, and where.
macro_rules! each_key {
    ($request:expr, $each:expr) => {{
        use MasterRequest as R;
        let mut each = $each;
        match $request {
            R::PutStart(PutStart { key, .. })
            | R::PutEnd(PutEnd { key, .. })
            | R::PutRevoke(PutRevoke { key, .. })
            | R::PutAbort(PutAbort { key, .. })
            | R::GetReplicaList(GetReplicaList { key })
            | R::Exist(Exist { key })
            | R::ExistPrefetch(ExistPrefetch { key, .. })
            | R::GetSize(GetSize { key })
            | R::Remove(Remove { key })
            | R::AcquireHold(AcquireHold { key, .. })
            | R::CopyStart(CopyStart { key, .. })
            | R::MoveStart(MoveStart { key, .. }) => each(key),
            R::BatchPutStart(BatchPutStart { items, .. }) => {
                items.into_iter().for_each(|(key, _)| each(key))
            }
            R::BatchPutEnd(BatchPutEnd { items, .. }) => {
                items.into_iter().for_each(|(key, _, _)| each(key))
            }
            R::BatchPutRevoke(BatchPutRevoke { items, .. }) => {
                items.into_iter().for_each(|(key, _)| each(key))
            }
            R::BatchGetReplicaList(BatchGetReplicaList { keys })
            | R::BatchExist(BatchExist { keys })
            | R::BatchExistPrefetch(BatchExistPrefetch { keys, .. })
            | R::BatchReplicaClear(BatchReplicaClear { keys, .. }) => {
                keys.into_iter().for_each(|key| each(key))
            }
            _ => {}
        }
    }};
}

/// The master's RPCs. Each is the master operation of the same name (see
/// [`Master`](mooring_core::Master)), with its arguments and its result; rkyv's generated
/// archive types carry no docs, hence the allowance.
#[allow(missing_docs)]
mod messages {
    use super::*;

    master_rpcs! {
        /// Registers a client; the reply carries the settings it must follow.
        Hello { client: ClientId } => ClusterInfo;
        Heartbeat { client: ClientId } => HeartbeatAck;
        /// The client is done: forget it now rather than after the client TTL.
        Goodbye { client: ClientId } => ();
        MountSegment { client: ClientId, spec: SegmentSpec } => SegmentId;
        UnmountSegment { client: ClientId, name: String } => ();
        /// The segments with these ids (None for one not mounted).
        DescribeSegments { ids: Vec<SegmentId> } => Vec<Option<SegmentInfo>>;
        ListSegments {} => Vec<SegmentInfo>;
        /// Starts a put, or an upsert if `upsert`.
        PutStart {
            client: ClientId,
            key: String,
            size: u64,
            config: ReplicateConfig,
            upsert: bool,
        } => PutGrant;
        /// Ends a put or upsert; `checksum` is the crc32c of the value written.
        PutEnd {
            client: ClientId,
            key: String,
            write: WriteId,
            checksum: Checksum,
        } => ();
        PutRevoke { client: ClientId, key: String, write: WriteId } => ();
        PutAbort { client: ClientId, key: String, write: WriteId } => ();
        BatchPutStart {
            client: ClientId,
            items: Vec<(String, u64)>,
            config: ReplicateConfig,
            upsert: bool,
        } => Vec<Result<PutGrant, Error>>;
        /// Ends many writes: `(key, write, checksum)` each.
        BatchPutEnd {
            client: ClientId,
            items: Vec<(String, WriteId, Checksum)>,
        } => Vec<Result<(), Error>>;
        BatchPutRevoke {
            client: ClientId,
            items: Vec<(String, WriteId)>,
        } => Vec<Result<(), Error>>;
        GetReplicaList { key: String } => ReplicaList;
        BatchGetReplicaList { keys: Vec<String> } => Vec<Result<ReplicaList, Error>>;
        Exist { key: String } => bool;
        BatchExist { keys: Vec<String> } => Vec<Result<bool, Error>>;
        /// `exist(key, prefetch=true)` (docs/prefetch.md); `preferred` are the caller's own
        /// segments.
        ExistPrefetch {
            client: ClientId,
            key: String,
            preferred: Vec<String>,
        } => (bool, Option<PrefetchGrant>);
        BatchExistPrefetch {
            client: ClientId,
            keys: Vec<String>,
            preferred: Vec<String>,
        } => Vec<Result<(bool, Option<PrefetchGrant>), Error>>;
        DiskSync { client: ClientId, segment: SegmentId, report: DiskReport } => DiskSyncAck;
        GetSize { key: String } => u64;
        Remove { key: String } => ();
        /// Removes every removable object of `tenant`; answers how many.
        RemoveAll { tenant: String } => u64;
        /// Removes `tenant`'s removable objects whose keys (as the tenant named them) match.
        RemoveByRegex { tenant: String, pattern: String } => u64;
        /// `tenant`'s readable objects whose keys match, with leases; keys as the tenant
        /// named them.
        QueryByRegex { tenant: String, pattern: String } => Vec<(String, ReplicaList)>;
        /// `tenant`'s keys matching `pattern` with sizes and replica counts; grants no lease.
        ListKeys { tenant: String, pattern: String } => Vec<KeyListing>;
        AcquireHold { client: ClientId, key: String } => (HoldId, ReplicaList);
        ReleaseHold { client: ClientId, hold: HoldId } => ();
        CopyStart { client: ClientId, key: String, targets: Vec<String> } => CopyGrant;
        MoveStart {
            client: ClientId,
            key: String,
            source: String,
            target: String,
        } => CopyGrant;
        TaskEnd { client: ClientId, task: TaskId } => ();
        TaskRevoke { client: ClientId, task: TaskId } => ();
        /// Gives up a task whose transfers may still land (see `Master::task_abort`).
        TaskAbort { client: ClientId, task: TaskId } => ();
        /// Repair copies for a storage node to carry out (see `Master::take_repairs`).
        TakeRepairs { client: ClientId, max: u32 } => Vec<(String, CopyGrant)>;
        /// The master's stats and census (boxed: the largest reply by far).
        GetStats {} => Box<StatsReport>;
        /// A standby master asks the leader for its state files from `offset` in `at` (the
        /// standby holds everything before that on disk, which acknowledges it); the leader
        /// answers at once when it has more, or after a short wait with nothing.
        Follow { follower: String, at: StateFile, offset: u64 } => FollowChunk;
        /// Mooncake's BatchQueryIp: the hosts of each client's mounted segments (clients
        /// with none are left out).
        BatchQueryIp { clients: Vec<ClientId> } => Vec<(ClientId, Vec<String>)>;
        /// Mooncake's BatchReplicaClear: clears the caller's own objects among `keys`, whole
        /// or (with `segment`) their replicas there; answers the keys cleared.
        BatchReplicaClear {
            client: ClientId,
            keys: Vec<String>,
            segment: Option<String>,
        } => Vec<String>;
        /// Mooncake's QueryTask: where a copy or move task stands (see `Master::query_task`).
        QueryTask { task: TaskId } => TaskReport;
    }
}

impl MasterRequest {
    /// The client the request acts as, if it names one: a server that knows which client a
    /// connection speaks for refuses requests naming another.
    pub fn client(&self) -> Option<ClientId> {
        use MasterRequest as R;
        match self {
            R::Hello(Hello { client })
            | R::Heartbeat(Heartbeat { client })
            | R::Goodbye(Goodbye { client })
            | R::MountSegment(MountSegment { client, .. })
            | R::UnmountSegment(UnmountSegment { client, .. })
            | R::PutStart(PutStart { client, .. })
            | R::PutEnd(PutEnd { client, .. })
            | R::PutRevoke(PutRevoke { client, .. })
            | R::PutAbort(PutAbort { client, .. })
            | R::BatchPutStart(BatchPutStart { client, .. })
            | R::BatchPutEnd(BatchPutEnd { client, .. })
            | R::BatchPutRevoke(BatchPutRevoke { client, .. })
            | R::ExistPrefetch(ExistPrefetch { client, .. })
            | R::BatchExistPrefetch(BatchExistPrefetch { client, .. })
            | R::DiskSync(DiskSync { client, .. })
            | R::AcquireHold(AcquireHold { client, .. })
            | R::ReleaseHold(ReleaseHold { client, .. })
            | R::CopyStart(CopyStart { client, .. })
            | R::MoveStart(MoveStart { client, .. })
            | R::TaskEnd(TaskEnd { client, .. })
            | R::TaskRevoke(TaskRevoke { client, .. })
            | R::TaskAbort(TaskAbort { client, .. })
            | R::TakeRepairs(TakeRepairs { client, .. })
            | R::BatchReplicaClear(BatchReplicaClear { client, .. }) => Some(*client),
            R::DescribeSegments(_)
            | R::ListSegments(_)
            | R::GetReplicaList(_)
            | R::BatchGetReplicaList(_)
            | R::Exist(_)
            | R::BatchExist(_)
            | R::GetSize(_)
            | R::Remove(_)
            | R::RemoveAll(_)
            | R::RemoveByRegex(_)
            | R::QueryByRegex(_)
            | R::ListKeys(_)
            | R::GetStats(_)
            | R::Follow(_)
            | R::BatchQueryIp(_)
            | R::QueryTask(_) => None,
        }
    }

    /// Whether its answer acknowledges a change a client will rely on, so a master that keeps
    /// a journal sends it only once the request is on disk. Reads, existence checks, listings
    /// and heartbeats (a `Hello` is one) need not wait: if one is lost with a crash, so is
    /// everything after it, a restarted master grants every object a fresh lease
    /// (`Master::resume`), and a client it does not know registers again with its next
    /// heartbeat.
    pub fn needs_durability(&self) -> bool {
        use MasterRequest as R;
        !matches!(
            self,
            R::Heartbeat(_)
                | R::Hello(_)
                | R::DescribeSegments(_)
                | R::ListSegments(_)
                | R::GetReplicaList(_)
                | R::BatchGetReplicaList(_)
                | R::Exist(_)
                | R::BatchExist(_)
                | R::GetSize(_)
                | R::QueryByRegex(_)
                | R::ListKeys(_)
                | R::GetStats(_)
                | R::Follow(_)
                | R::BatchQueryIp(_)
                | R::QueryTask(_)
        )
    }

    /// Whether its answer reports state a client must never see go back, though it changes
    /// nothing: such a read waits, as a change does, until everything applied before it is
    /// durable (on every in-sync standby, in a group), so no restart or failover undoes what
    /// it reported. A task reported ended must stay ended (simulation seed 51467: a copy
    /// reported succeeded by a leader cut off a moment later was running again at the next).
    pub fn reports_settled_state(&self) -> bool {
        matches!(self, MasterRequest::QueryTask(_))
    }

    /// The tenant a listing, regex query or wholesale removal is scoped to.
    pub fn tenant(&self) -> Option<&str> {
        use MasterRequest as R;
        match self {
            R::RemoveAll(RemoveAll { tenant })
            | R::RemoveByRegex(RemoveByRegex { tenant, .. })
            | R::QueryByRegex(QueryByRegex { tenant, .. })
            | R::ListKeys(ListKeys { tenant, .. }) => Some(tenant),
            _ => None,
        }
    }

    /// Scopes a client's request to `tenant`: each key it names becomes the key the master
    /// stores for the tenant, and a listing, regex query or wholesale removal is the tenant's.
    /// A key holding the tenant separator is refused (`INVALID_KEY`).
    pub fn scope_to(&mut self, tenant: &str) -> Result<(), Error> {
        use MasterRequest as R;
        if let R::RemoveAll(RemoveAll { tenant: scope })
        | R::RemoveByRegex(RemoveByRegex { tenant: scope, .. })
        | R::QueryByRegex(QueryByRegex { tenant: scope, .. })
        | R::ListKeys(ListKeys { tenant: scope, .. }) = self
        {
            *scope = tenant.to_string();
        }
        let mut refused = None;
        each_key!(self, |key: &mut String| match stored_key(tenant, key) {
            Ok(stored) => *key = stored,
            Err(e) => refused = refused.take().or(Some(e)),
        });
        refused.map_or(Ok(()), Err)
    }

    /// The object keys a client's request names (as the master stores them). A node's disk
    /// report names keys of every tenant and is not among them.
    pub fn keys<'a>(&'a self) -> Vec<&'a str> {
        let mut keys = Vec::new();
        each_key!(self, |key: &'a String| keys.push(key.as_str()));
        keys
    }

    /// Why `peer` may not make this request, if it may not: it names a client other than the
    /// one the connection speaks for (no peer acts as another's id: ends its writes, unmounts
    /// its segments, says its goodbye), it needs a role the peer's credential lacks, or it
    /// reaches outside the credential's tenant (a key, a listing, a removal).
    pub fn refusal_for(&self, peer: &Peer) -> Option<Error> {
        let bound = ClientId(peer.client);
        if let Some(named) = self.client().filter(|named| *named != bound) {
            return Some(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!("this connection speaks for {bound:?}; it cannot act as {named:?}"),
            ));
        }
        if let Some(outside) = self.outside_tenant(peer) {
            return Some(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "{}/{} acts in tenant {:?}, and this {} reaches into tenant {outside:?}",
                    peer.tenant,
                    peer.name,
                    peer.tenant,
                    self.name()
                ),
            ));
        }
        let needed = self.roles_needed();
        match peer.roles.intersects(needed) {
            true => None,
            false => Some(Error::new(
                ErrorCode::ILLEGAL_CLIENT,
                format!(
                    "{}/{} holds the roles {}, and {} needs {}; issue it a credential with that \
                     role (`mooring token issue --role ...`)",
                    peer.tenant,
                    peer.name,
                    peer.roles,
                    self.name(),
                    match needed {
                        Roles::ALL => "any".to_string(),
                        needed => format!("one of {needed}"),
                    }
                ),
            )),
        }
    }

    /// The tenant outside `peer`'s own this request reaches, if it does. Only member
    /// credentials are bound to a tenant; the cluster token's holders act in any.
    fn outside_tenant<'a>(&'a self, peer: &Peer) -> Option<&'a str> {
        peer.credential?;
        let scoped = self.tenant().into_iter();
        let keyed = self.keys().into_iter().map(tenant_of);
        scoped.chain(keyed).find(|tenant| *tenant != peer.tenant)
    }

    /// The roles of which a peer needs one to make this request. Reads of the cluster's shape
    /// and a client's own presence need none; what a member does as a node, a client or a
    /// standby needs that role; removing everything needs an admin.
    pub fn roles_needed(&self) -> Roles {
        use MasterRequest as R;
        match self {
            R::Hello(_)
            | R::Heartbeat(_)
            | R::Goodbye(_)
            | R::DescribeSegments(_)
            | R::ListSegments(_)
            | R::GetStats(_)
            | R::BatchQueryIp(_)
            | R::QueryTask(_) => Roles::ALL,
            R::MountSegment(_) | R::UnmountSegment(_) | R::DiskSync(_) | R::TakeRepairs(_) => {
                Roles::NODE
            }
            // Nodes run repair copies, clients their own copies and moves.
            R::TaskEnd(_) | R::TaskRevoke(_) | R::TaskAbort(_) => Roles::NODE.union(Roles::CLIENT),
            R::Follow(_) => Roles::STANDBY,
            R::RemoveAll(_) => Roles::ADMIN,
            R::PutStart(_)
            | R::PutEnd(_)
            | R::PutRevoke(_)
            | R::PutAbort(_)
            | R::BatchPutStart(_)
            | R::BatchPutEnd(_)
            | R::BatchPutRevoke(_)
            | R::ExistPrefetch(_)
            | R::BatchExistPrefetch(_)
            | R::AcquireHold(_)
            | R::ReleaseHold(_)
            | R::CopyStart(_)
            | R::MoveStart(_)
            | R::BatchReplicaClear(_)
            | R::GetReplicaList(_)
            | R::BatchGetReplicaList(_)
            | R::Exist(_)
            | R::BatchExist(_)
            | R::GetSize(_)
            | R::Remove(_)
            | R::RemoveByRegex(_)
            | R::QueryByRegex(_)
            | R::ListKeys(_) => Roles::CLIENT,
        }
    }

    /// Whether it changes the cluster wholesale (removes many objects, unmounts): logged with
    /// the peer that asked.
    pub fn is_admin(&self) -> bool {
        matches!(
            self,
            MasterRequest::RemoveAll(_)
                | MasterRequest::RemoveByRegex(_)
                | MasterRequest::UnmountSegment(_)
        )
    }
}

/// A master response: the reply or the error.
pub type MasterResponse = Result<Reply, Error>;

/// A [`MasterRequest`] as it travels, with when it was sent and how long it may still be
/// applied. A stream stalled by a partition delivers its bytes when the partition heals,
/// long after the sender stopped waiting; a master that applied such a request then would
/// act unseen (a remove the caller gave up on taking the value it wrote since). So the
/// master refuses a request that arrives past its validity.
#[derive(Clone, Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
#[rkyv(derive(Debug))]
pub struct ControlRequest {
    /// When it was sent: microseconds on the sender's clock for this connection, which
    /// starts at zero as the client sends its handshake answer.
    pub sent_at_us: u64,
    /// How long after `sent_at_us` the master may still apply it: what the sender will still
    /// wait, less the shortest round trip it has seen on this connection (a bound on how far
    /// the master's view of the sender's clock may lag).
    pub valid_for_us: u64,
    /// The request.
    pub request: MasterRequest,
}

wire_message!(ControlRequest, FrameKind::MasterRequest);
wire_message!(MasterResponse, FrameKind::MasterResponse);

impl Reply {
    /// Keys in a reply to a scoped request, as the tenant named them (see
    /// [`MasterRequest::scope_to`]).
    pub fn unscope(&mut self) {
        if let Reply::BatchReplicaClear(keys) = self {
            for key in keys.iter_mut() {
                *key = local_key(key).to_string();
            }
        }
    }

    /// Blanks the owners of segments `viewer` does not own, for a peer that is neither a node
    /// nor an admin: a client needs a segment's address and key to read, never who mounted it.
    pub fn hide_owners(&mut self, viewer: ClientId) {
        let hide = |info: &mut SegmentInfo| {
            if info.owner != viewer {
                info.owner = ClientId(0);
            }
        };
        match self {
            Reply::ListSegments(list) => list.iter_mut().for_each(hide),
            Reply::DescribeSegments(list) => list.iter_mut().flatten().for_each(hide),
            _ => {}
        }
    }
}
