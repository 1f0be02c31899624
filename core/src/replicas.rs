//! An object's list of memory replicas, in 16 bytes.
//!
//! Nearly every object has one replica, so that one sits inline; objects with none or with
//! several keep a boxed list behind a pointer-sized handle. The list shares its 16 bytes with
//! the inline replica (a replica's offset word is never zero, which leaves the compiler a
//! value to tell the two apart), where a small vector would need 24: with a
//! hundred million objects resident, those 8 bytes are 800 MB.
//!
//! Read it as a slice (`Deref`); change it with `push`, `retain` and `extend`, which keep the
//! inline form whenever exactly one replica is left.

use std::ops::{Deref, DerefMut};

use crate::object::Replica;

/// An object's memory replicas: one inline, or any number in a boxed list.
#[derive(Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) enum Replicas {
    /// Exactly one replica.
    One(Replica),
    /// None (no list) or several. Boxed so the handle is one pointer: a bare vector (24
    /// bytes) would not fit beside the inline replica's niche.
    #[allow(clippy::box_collection)]
    Many(Option<Box<Vec<Replica>>>),
}

impl Default for Replicas {
    fn default() -> Replicas {
        Replicas::Many(None)
    }
}

impl Replicas {
    /// Appends a replica.
    pub(crate) fn push(&mut self, replica: Replica) {
        match self {
            Replicas::Many(None) => *self = Replicas::One(replica),
            Replicas::One(first) => *self = Replicas::Many(Some(Box::new(vec![*first, replica]))),
            Replicas::Many(Some(list)) => list.push(replica),
        }
    }

    /// Keeps only the replicas `keep` says yes to, in order.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&Replica) -> bool) {
        match self {
            Replicas::One(only) => {
                if !keep(only) {
                    *self = Replicas::Many(None);
                }
            }
            Replicas::Many(None) => {}
            Replicas::Many(Some(list)) => {
                list.retain(|r| keep(r));
                self.settle();
            }
        }
    }

    /// Takes the inline form if the list holds exactly one replica, and drops an empty list.
    fn settle(&mut self) {
        if let Replicas::Many(Some(list)) = self {
            match list.len() {
                0 => *self = Replicas::Many(None),
                1 => *self = Replicas::One(list[0]),
                _ => {}
            }
        }
    }
}

impl Deref for Replicas {
    type Target = [Replica];

    fn deref(&self) -> &[Replica] {
        match self {
            Replicas::One(only) => std::slice::from_ref(only),
            Replicas::Many(None) => &[],
            Replicas::Many(Some(list)) => list,
        }
    }
}

impl DerefMut for Replicas {
    fn deref_mut(&mut self) -> &mut [Replica] {
        match self {
            Replicas::One(only) => std::slice::from_mut(only),
            Replicas::Many(None) => &mut [],
            Replicas::Many(Some(list)) => list,
        }
    }
}

impl std::fmt::Debug for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Extend<Replica> for Replicas {
    fn extend<I: IntoIterator<Item = Replica>>(&mut self, replicas: I) {
        for replica in replicas {
            self.push(replica);
        }
    }
}

impl FromIterator<Replica> for Replicas {
    fn from_iter<I: IntoIterator<Item = Replica>>(replicas: I) -> Replicas {
        let mut list = Replicas::default();
        list.extend(replicas);
        list
    }
}

impl<'a> IntoIterator for &'a Replicas {
    type Item = &'a Replica;
    type IntoIter = std::slice::Iter<'a, Replica>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for Replicas {
    type Item = Replica;
    type IntoIter = IntoIter;

    fn into_iter(self) -> IntoIter {
        match self {
            Replicas::One(only) => IntoIter::One(Some(only)),
            Replicas::Many(None) => IntoIter::One(None),
            Replicas::Many(Some(list)) => IntoIter::Many(list.into_iter()),
        }
    }
}

/// The replicas of a list, by value.
pub(crate) enum IntoIter {
    One(Option<Replica>),
    Many(std::vec::IntoIter<Replica>),
}

impl Iterator for IntoIter {
    type Item = Replica;

    fn next(&mut self) -> Option<Replica> {
        match self {
            IntoIter::One(only) => only.take(),
            IntoIter::Many(list) => list.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(segment: u32) -> Replica {
        Replica::processing(segment, u64::from(segment) * 64)
    }

    #[test]
    fn a_list_takes_sixteen_bytes() {
        assert_eq!(size_of::<Replicas>(), 16);
    }

    #[test]
    fn a_list_reads_and_changes_as_a_vector_does() {
        let mut list = Replicas::default();
        let mut model: Vec<Replica> = Vec::new();
        assert_eq!(&list[..], &model[..]);
        for segment in [0, 7, u32::MAX - 1, 3] {
            list.push(replica(segment));
            model.push(replica(segment));
            assert_eq!(&list[..], &model[..]);
        }
        for drop in [7, 0, 3, u32::MAX - 1] {
            list.retain(|r| r.segment != drop);
            model.retain(|r| r.segment != drop);
            assert_eq!(&list[..], &model[..]);
            let expected_form = match model.len() {
                1 => "one",
                0 => "none",
                _ => "many",
            };
            let form = match &list {
                Replicas::One(_) => "one",
                Replicas::Many(None) => "none",
                Replicas::Many(Some(_)) => "many",
            };
            assert_eq!(form, expected_form, "after dropping segment {drop}");
        }
        list.extend([replica(1), replica(2)]);
        list[1].set_status(crate::object::ReplicaStatus::Complete);
        let collected: Vec<Replica> = list.clone().into_iter().collect();
        assert_eq!(collected, &list[..]);
        assert!(collected[1].is_complete() && !collected[0].is_complete());
        assert_eq!(Replicas::from_iter([replica(9)]), Replicas::One(replica(9)));
    }
}
