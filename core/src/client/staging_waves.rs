//! How a batch that touches device (GPU) memory is staged through host memory.
//!
//! The client moves bytes with the CPU and the network, neither of which can touch device
//! memory, so a value on a device travels through a slab of pinned host memory: copied off
//! the device into the slab before it is sent, or received into the slab and copied onto the
//! device after. A client has a few slabs, so a batch is cut into waves, each packed into one
//! slab, and one wave's device copy runs while the next (or last) wave is on the network.
//!
//! The plan is a pure value: it keeps the batch's order, packs each wave until it holds a
//! wave's worth of bytes (small enough that the first wave's copy, which nothing overlaps,
//! is short; large enough that per-wave costs stay small) or the next value would not fit the
//! slab, aligns every value in its slab, and names the values that can never fit a slab,
//! which are refused alone rather than holding up the rest.

/// Where each value starts inside a slab is a multiple of this: device copy engines move
/// aligned buffers fastest, and no two values share a cache line.
pub const ALIGN: u64 = 256;

/// One wave: the batch's items that share a slab, with where each lies in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wave {
    /// `(index in the batch, offset in the slab)`, in batch order.
    pub items: Vec<(usize, u64)>,
    /// The bytes of the slab the wave uses (its last item's end).
    pub bytes: u64,
}

/// A batch cut into waves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingWaves {
    /// The waves, in batch order.
    pub waves: Vec<Wave>,
    /// Items larger than a slab: they cannot be staged at all.
    pub too_large: Vec<usize>,
}

impl StagingWaves {
    /// Cuts a batch whose items are `sizes` bytes into waves of at most `slab` bytes each,
    /// closing a wave once it holds `wave_bytes`.
    pub fn plan(sizes: &[u64], slab: u64, wave_bytes: u64) -> StagingWaves {
        let mut waves: Vec<Wave> = Vec::new();
        let mut too_large = Vec::new();
        let mut current = Wave {
            items: Vec::new(),
            bytes: 0,
        };
        for (index, &size) in sizes.iter().enumerate() {
            if size > slab {
                too_large.push(index);
                continue;
            }
            let offset = current.bytes.next_multiple_of(ALIGN);
            let full = !current.items.is_empty() && current.bytes >= wave_bytes;
            if full || offset.checked_add(size).is_none_or(|end| end > slab) {
                waves.push(std::mem::replace(
                    &mut current,
                    Wave {
                        items: Vec::new(),
                        bytes: 0,
                    },
                ));
                current.items.push((index, 0));
                current.bytes = size;
            } else {
                current.items.push((index, offset));
                current.bytes = offset + size;
            }
        }
        if !current.items.is_empty() {
            waves.push(current);
        }
        StagingWaves { waves, too_large }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_in_order_and_aligns() {
        let plan = StagingWaves::plan(&[100, 100, 600, 2000, 50], 1024, 1024);
        assert_eq!(plan.too_large, vec![3]);
        assert_eq!(
            plan.waves,
            vec![
                Wave {
                    items: vec![(0, 0), (1, 256)],
                    bytes: 356
                },
                Wave {
                    items: vec![(2, 0), (4, 768)],
                    bytes: 818
                },
            ]
        );
    }

    #[test]
    fn an_item_as_large_as_the_slab_has_a_wave_to_itself() {
        let plan = StagingWaves::plan(&[10, 1024, 10], 1024, 1024);
        assert!(plan.too_large.is_empty());
        let items: Vec<Vec<usize>> = plan
            .waves
            .iter()
            .map(|w| w.items.iter().map(|&(i, _)| i).collect())
            .collect();
        assert_eq!(items, vec![vec![0], vec![1], vec![2]]);
    }

    #[test]
    fn a_wave_closes_once_it_holds_a_waves_worth() {
        let plan = StagingWaves::plan(&[300, 300, 300, 300, 300], 4096, 500);
        let items: Vec<Vec<usize>> = plan
            .waves
            .iter()
            .map(|w| w.items.iter().map(|&(i, _)| i).collect())
            .collect();
        assert_eq!(items, vec![vec![0, 1], vec![2, 3], vec![4]]);
    }

    proptest! {
        /// Every item that fits is in exactly one wave, in batch order; an item is refused
        /// exactly when it is larger than a slab; within a wave items are aligned, inside the
        /// slab and disjoint; and a wave is cut only when it holds a wave's worth or the next
        /// item would not fit it, and never before it holds an item.
        #[test]
        fn every_item_is_placed_once_inside_its_slab(
            sizes in proptest::collection::vec(0u64..5000, 0..40),
            slab in 1u64..4096,
            wave_bytes in 1u64..8192,
        ) {
            let plan = StagingWaves::plan(&sizes, slab, wave_bytes);
            let placed: Vec<usize> =
                plan.waves.iter().flat_map(|w| w.items.iter().map(|&(i, _)| i)).collect();
            let fitting: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] <= slab).collect();
            prop_assert_eq!(&placed, &fitting);
            let refused: Vec<usize> = (0..sizes.len()).filter(|&i| sizes[i] > slab).collect();
            prop_assert_eq!(&plan.too_large, &refused);
            for (w, wave) in plan.waves.iter().enumerate() {
                prop_assert!(!wave.items.is_empty());
                let mut end = 0;
                for &(i, offset) in &wave.items {
                    prop_assert_eq!(offset % ALIGN, 0);
                    prop_assert!(offset >= end);
                    end = offset + sizes[i];
                    prop_assert!(end <= slab);
                }
                prop_assert_eq!(wave.bytes, end);
                if let Some(next) = plan.waves.get(w + 1) {
                    let first = sizes[next.items[0].0];
                    prop_assert!(
                        wave.bytes >= wave_bytes
                            || wave.bytes.next_multiple_of(ALIGN) + first > slab
                    );
                }
                // Below a wave's worth, a wave takes the next item whenever it fits.
                for &(i, offset) in &wave.items[..wave.items.len() - 1] {
                    prop_assert!(offset + sizes[i] < wave_bytes);
                }
            }
        }
    }
}
