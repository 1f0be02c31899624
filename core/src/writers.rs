//! Who wrote each object, interned: an object names its writer by a four-byte [`WriterRef`]
//! into this table instead of carrying the sixteen-byte [`ClientId`] itself.
//!
//! Ten million objects usually have a few hundred writers, so the table is small while the
//! twelve bytes it saves per object are not. Each entry counts the objects that name it and
//! is freed when the count reaches zero, so clients that come and go leave nothing behind.
//! The object table ([`crate::objects::ObjectTable`]) is the only one that adds and releases
//! references, as objects come, go and change writer.

use std::collections::BTreeMap;

use crate::ids::ClientId;
use crate::object::MAX_WRITERS;

/// An object's writer: an index into [`Writers`].
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(Debug))]
pub(crate) struct WriterRef(pub(crate) u32);

/// The table as a snapshot stores it: every entry's client (a free entry's is stale) and the
/// free entries in the order they are reused. How many objects name each entry is not stored:
/// a restore counts them from the objects.
#[derive(Clone, Debug, Default, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct WriterParts {
    pub(crate) clients: Vec<ClientId>,
    pub(crate) free: Vec<u32>,
}

/// Every client some object names as its writer, with how many objects do.
#[derive(Clone, Debug, Default)]
pub(crate) struct Writers {
    clients: Vec<ClientId>,
    /// Objects naming each entry; zero for a free entry.
    objects: Vec<u32>,
    free: Vec<u32>,
    by_client: BTreeMap<ClientId, u32>,
}

impl Writers {
    /// One more object names `client` as its writer; returns the reference it stores.
    pub(crate) fn add(&mut self, client: ClientId) -> WriterRef {
        if let Some(&entry) = self.by_client.get(&client) {
            self.objects[entry as usize] += 1;
            return WriterRef(entry);
        }
        let entry = match self.free.pop() {
            Some(entry) => {
                self.clients[entry as usize] = client;
                self.objects[entry as usize] = 1;
                entry
            }
            None => {
                debug_assert!(
                    self.clients.len() < MAX_WRITERS,
                    "writer room checked first"
                );
                let entry = self.clients.len() as u32;
                self.clients.push(client);
                self.objects.push(1);
                entry
            }
        };
        self.by_client.insert(client, entry);
        WriterRef(entry)
    }

    /// Whether a client no object names yet can get an entry whose reference an object can
    /// store (see [`crate::object::MAX_WRITERS`]).
    pub(crate) fn has_room(&self) -> bool {
        !self.free.is_empty() || self.clients.len() < MAX_WRITERS
    }

    /// One object fewer names `writer`; the entry is freed with its last object.
    pub(crate) fn release(&mut self, writer: WriterRef) {
        let count = &mut self.objects[writer.0 as usize];
        debug_assert!(*count > 0, "releasing a free writer entry");
        *count -= 1;
        if *count == 0 {
            self.by_client.remove(&self.clients[writer.0 as usize]);
            self.free.push(writer.0);
        }
    }

    /// The client `writer` stands for.
    pub(crate) fn client(&self, writer: WriterRef) -> ClientId {
        self.clients[writer.0 as usize]
    }

    /// The reference objects written by `client` hold, if any object names it.
    pub(crate) fn find(&self, client: ClientId) -> Option<WriterRef> {
        self.by_client.get(&client).map(|&entry| WriterRef(entry))
    }

    /// How many clients some object names.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_client.len()
    }

    /// The table for a snapshot.
    pub(crate) fn parts(&self) -> WriterParts {
        WriterParts {
            clients: self.clients.clone(),
            free: self.free.clone(),
        }
    }

    /// Rebuilds the table a snapshot stored, for objects naming `named` (one reference per
    /// object). Refuses a reference out of range or to a free entry, a free list that
    /// differs from the entries no object names, and two live entries for one client.
    pub(crate) fn from_parts(
        parts: WriterParts,
        named: impl Iterator<Item = WriterRef>,
    ) -> Result<Writers, String> {
        let WriterParts { clients, free } = parts;
        if clients.len() > MAX_WRITERS {
            return Err(format!(
                "{} writer entries, more than the {MAX_WRITERS} an object can name",
                clients.len()
            ));
        }
        let objects = count_named(clients.len(), named)?;
        let writers = Writers {
            by_client: BTreeMap::new(),
            clients,
            objects,
            free,
        };
        writers.check_free()?;
        let mut writers = writers;
        for (entry, &count) in writers.objects.iter().enumerate() {
            if count > 0
                && writers
                    .by_client
                    .insert(writers.clients[entry], entry as u32)
                    .is_some()
            {
                return Err(format!(
                    "client {:?} has two writer entries",
                    writers.clients[entry]
                ));
            }
        }
        Ok(writers)
    }

    /// Checks the table against the references `named` that the objects hold: each entry
    /// counts exactly the objects that name it, the free list holds exactly the entries none
    /// names, and the client map finds exactly the live entries.
    pub(crate) fn check(&self, named: impl Iterator<Item = WriterRef>) -> Result<(), String> {
        let counted = count_named(self.clients.len(), named)?;
        if counted != self.objects || self.objects.len() != self.clients.len() {
            return Err("writers: an entry's object count differs from the objects".into());
        }
        self.check_free()?;
        let live = self.objects.iter().filter(|&&c| c > 0).count();
        if self.by_client.len() != live
            || self.by_client.iter().any(|(client, &entry)| {
                self.objects.get(entry as usize).is_none_or(|&c| c == 0)
                    || self.clients[entry as usize] != *client
            })
        {
            return Err("writers: the client map differs from the live entries".into());
        }
        Ok(())
    }

    /// Heap bytes the table uses.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.clients.capacity() * size_of::<ClientId>()
            + (self.objects.capacity() + self.free.capacity()) * size_of::<u32>()
            + self.by_client.len() * (size_of::<ClientId>() + size_of::<u32>())
    }

    /// The free list holds each entry no object names, once, and nothing else.
    fn check_free(&self) -> Result<(), String> {
        let mut listed = vec![false; self.objects.len()];
        for &entry in &self.free {
            match listed.get_mut(entry as usize) {
                Some(seen) if !*seen && self.objects[entry as usize] == 0 => *seen = true,
                _ => {
                    return Err(format!(
                        "writers: free entry {entry} is out of range, named or listed twice"
                    ));
                }
            }
        }
        let unnamed = self.objects.iter().filter(|&&c| c == 0).count();
        if unnamed != self.free.len() {
            return Err("writers: the free list misses an entry no object names".into());
        }
        Ok(())
    }
}

/// How many of the references `named` name each of `entries` entries; refuses one out of
/// range.
fn count_named(entries: usize, named: impl Iterator<Item = WriterRef>) -> Result<Vec<u32>, String> {
    let mut counts = vec![0u32; entries];
    for writer in named {
        let count = counts
            .get_mut(writer.0 as usize)
            .ok_or_else(|| format!("an object names writer {} of {entries}", writer.0))?;
        *count = count
            .checked_add(1)
            .ok_or("more than 2^32 objects name one writer")?;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_while_an_object_names_it_and_is_reused_after() {
        let mut writers = Writers::default();
        let a = writers.add(ClientId(7));
        let again = writers.add(ClientId(7));
        let b = writers.add(ClientId(9));
        assert_eq!(a, again);
        assert_ne!(a, b);
        assert_eq!(writers.client(b), ClientId(9));
        assert_eq!(writers.len(), 2);
        writers.release(a);
        assert_eq!(
            writers.find(ClientId(7)),
            Some(a),
            "one object still names it"
        );
        writers.release(a);
        assert_eq!(writers.find(ClientId(7)), None);
        assert_eq!(writers.len(), 1);
        let c = writers.add(ClientId(11));
        assert_eq!(c, a, "the freed entry is reused");
        writers.check([b, c].into_iter()).unwrap();
        assert!(writers.check([b].into_iter()).is_err(), "a count too high");
        assert!(
            writers.check([b, c, c].into_iter()).is_err(),
            "a count too low"
        );
    }

    #[test]
    fn a_restore_counts_the_objects_and_refuses_what_does_not_add_up() {
        let mut writers = Writers::default();
        let a = writers.add(ClientId(1));
        let b = writers.add(ClientId(2));
        let c = writers.add(ClientId(3));
        writers.release(b);
        let named = [a, c, c];
        writers.add(ClientId(3));
        let restored = Writers::from_parts(writers.parts(), named.into_iter()).unwrap();
        restored.check(named.into_iter()).unwrap();
        assert_eq!(restored.find(ClientId(3)), Some(c));
        assert_eq!(restored.find(ClientId(2)), None);
        assert!(Writers::from_parts(writers.parts(), [a, b, c].into_iter()).is_err());
        assert!(Writers::from_parts(writers.parts(), [a].into_iter()).is_err());
        assert!(Writers::from_parts(writers.parts(), [a, c, WriterRef(9)].into_iter()).is_err());
        let twice = WriterParts {
            clients: vec![ClientId(5), ClientId(5)],
            free: vec![],
        };
        assert!(Writers::from_parts(twice, [WriterRef(0), WriterRef(1)].into_iter()).is_err());
    }
}
