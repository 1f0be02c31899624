//! Cutting a transfer into lanes and chunks: a large transfer is striped over several
//! connections ([`split_lanes`]), and each lane's share is sent as pipelined requests of
//! bounded size ([`chunk_ops`]). Pieces remember which operation they belong to, so each
//! operation's checksum can be assembled from the pieces that moved.

use mooring_proto::wire::Range;

/// A piece of a write operation's source, remembering which operation it belongs to.
#[derive(Clone, Copy)]
pub(crate) struct WritePiece<'a> {
    pub(crate) op: usize,
    pub(crate) src: &'a [u8],
}

/// A piece of a read operation's destination, remembering which operation it belongs to.
pub(crate) struct ReadPiece<'a> {
    pub(crate) op: usize,
    pub(crate) dest: &'a mut [u8],
}

/// Splits `(addr, buffer)` operations into `lanes` groups of about equal bytes, cutting
/// buffers where needed.
pub(crate) fn split_lanes<B: SplitBuf>(ops: Vec<(u64, B)>, lanes: usize) -> Vec<Vec<(u64, B)>> {
    let total: usize = ops.iter().map(|o| o.1.size()).sum();
    chunk_ops(ops, total.div_ceil(lanes.max(1)))
}

/// Splits `(addr, buffer)` operations, in order, into groups of at most `per_chunk` bytes,
/// cutting buffers where needed.
pub(crate) fn chunk_ops<B: SplitBuf>(ops: Vec<(u64, B)>, per_chunk: usize) -> Vec<Vec<(u64, B)>> {
    let per_chunk = per_chunk.max(1);
    let mut out: Vec<Vec<(u64, B)>> = vec![Vec::new()];
    let mut room = per_chunk;
    for (mut addr, mut buf) in ops {
        while buf.size() > 0 {
            if room == 0 {
                out.push(Vec::new());
                room = per_chunk;
            }
            let take = room.min(buf.size());
            let (head, tail) = buf.split(take);
            out.last_mut().expect("a chunk").push((addr, head));
            addr += take as u64;
            room -= take;
            buf = tail;
        }
    }
    out.retain(|c| !c.is_empty());
    out
}

/// The ranges an operation group covers.
pub(crate) fn ranges_of<B: SplitBuf>(ops: &[(u64, B)]) -> Vec<Range> {
    ops.iter()
        .map(|(addr, buf)| Range {
            addr: *addr,
            len: buf.size() as u64,
        })
        .collect()
}

/// A buffer that can be cut in two.
pub(crate) trait SplitBuf: Sized {
    fn size(&self) -> usize;
    fn split(self, at: usize) -> (Self, Self);
}

impl SplitBuf for &mut [u8] {
    fn size(&self) -> usize {
        self.len()
    }
    fn split(self, at: usize) -> (Self, Self) {
        self.split_at_mut(at)
    }
}

impl SplitBuf for ReadPiece<'_> {
    fn size(&self) -> usize {
        self.dest.len()
    }
    fn split(self, at: usize) -> (Self, Self) {
        let (head, tail) = self.dest.split_at_mut(at);
        let op = self.op;
        (ReadPiece { op, dest: head }, ReadPiece { op, dest: tail })
    }
}

impl SplitBuf for WritePiece<'_> {
    fn size(&self) -> usize {
        self.src.len()
    }
    fn split(self, at: usize) -> (Self, Self) {
        let (head, tail) = self.src.split_at(at);
        let op = self.op;
        (WritePiece { op, src: head }, WritePiece { op, src: tail })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_cover_every_byte_once_in_order() {
        let mut a = vec![0u8; 1000];
        let mut b = [0u8; 10];
        let ops: Vec<(u64, &mut [u8])> = vec![(100, &mut a[..]), (5000, &mut b[..])];
        let lanes = split_lanes(ops, 3);
        assert_eq!(lanes.len(), 3);
        let flat: Vec<(u64, usize)> = lanes.iter().flatten().map(|(a, b)| (*a, b.len())).collect();
        assert_eq!(flat, [(100, 337), (437, 337), (774, 326), (5000, 10)]);
    }
}
