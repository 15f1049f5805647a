//! An executable's output pool: buffers given back by the caller (an argument it gave up, or
//! an output it dropped), written by the next runs' outputs instead of new vectors.
//!
//! The outputs' types are sorted once into classes (dtype, element count), so giving a buffer
//! back and taking one for an output are each a binary search or an index, not a scan of every
//! output: a program of `n` outputs spends O(n log n) a run on its pool, where the scans it
//! replaces spent O(n^2) (4,000 outputs: 7.9-16.3 ms a step before, 1.0-1.7 after,
//! docs/PERFORMANCE.md, twenty-third pass). Nothing here allocates in steady state: each
//! class's list keeps its capacity.

use tessera_ir::{DType, Data, TensorType};

/// Whether a pooled buffer `d` can hold an output of `numel` elements of `dtype`: the same
/// dtype, room for its elements, and at most twice as many (a larger one is left for a larger
/// output).
pub(crate) fn fits(d: &Data, dtype: DType, numel: usize) -> bool {
    d.dtype() == dtype && d.capacity() >= numel && d.capacity() <= numel.max(1).saturating_mul(2)
}

/// The buffers given back, by the class of output each will hold.
#[derive(Clone, Debug, Default)]
pub(crate) struct Pool {
    /// The outputs' distinct (dtype, element count), ascending, each with how many outputs
    /// have it: a class holds at most that many buffers.
    classes: Vec<(DType, usize, usize)>,
    /// The class of each output, by its position in the program's outputs.
    class_of: Vec<usize>,
    /// Each class's buffers, emptied.
    held: Vec<Vec<Data>>,
}

impl Pool {
    /// An empty pool for outputs of these types, in the program's order.
    pub(crate) fn new<'a>(outputs: impl IntoIterator<Item = &'a TensorType>) -> Pool {
        let keys: Vec<(DType, usize)> = outputs.into_iter().map(|t| (t.dtype, t.numel())).collect();
        let mut classes: Vec<(DType, usize, usize)> = Vec::with_capacity(keys.len());
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        for (dtype, numel) in sorted {
            match classes.last_mut() {
                Some(last) if (last.0, last.1) == (dtype, numel) => last.2 += 1,
                _ => classes.push((dtype, numel, 1)),
            }
        }
        let class_of = keys
            .iter()
            .map(|&(d, n)| {
                classes
                    .binary_search_by(|c| (c.0, c.1).cmp(&(d, n)))
                    .expect("every output's type is a class")
            })
            .collect();
        Pool {
            held: vec![Vec::new(); classes.len()],
            classes,
            class_of,
        }
    }

    /// The same classes, holding nothing (a fork's pool).
    pub(crate) fn emptied(&self) -> Pool {
        Pool {
            classes: self.classes.clone(),
            class_of: self.class_of.clone(),
            held: vec![Vec::new(); self.classes.len()],
        }
    }

    /// Keeps `data` for the largest outputs of its dtype it fits (`fits`) whose class holds
    /// fewer buffers than it has outputs; frees it when there are none (a large argument no
    /// output takes is not held for the executable's lifetime). The classes it fits are
    /// those of its dtype with between half its capacity and its capacity elements: the walk
    /// down from the largest stops at the first it does not fit.
    pub(crate) fn give(&mut self, mut data: Data) {
        let (dtype, capacity) = (data.dtype(), data.capacity());
        let above = self
            .classes
            .partition_point(|c| (c.0, c.1) <= (dtype, capacity));
        for c in (0..above).rev() {
            let (d, numel, count) = self.classes[c];
            if d != dtype || !fits(&data, d, numel) {
                return;
            }
            if self.held[c].len() < count {
                data.clear();
                self.held[c].push(data);
                return;
            }
        }
    }

    /// A kept buffer for output `k` (by its position in the program's outputs), emptied.
    pub(crate) fn take(&mut self, k: usize) -> Option<Data> {
        self.held.get_mut(*self.class_of.get(k)?)?.pop()
    }

    /// How many buffers the pool keeps.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.iter().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims.to_vec())
    }

    /// A buffer is kept for the largest outputs it fits, at most one per output of that
    /// class, and taken by an output of that class only.
    #[test]
    fn buffers_are_kept_by_the_class_they_fit() {
        let types = [
            f32s(&[8]),
            f32s(&[8]),
            f32s(&[100]),
            TensorType::new(DType::I32, vec![8]),
        ];
        let mut pool = Pool::new(&types);
        pool.give(Data::F32(Vec::with_capacity(1 << 20)));
        pool.give(Data::F32(Vec::with_capacity(4)));
        pool.give(Data::F64(Vec::with_capacity(8)));
        pool.give(Data::F32(Vec::with_capacity(60)));
        assert_eq!(
            pool.len(),
            0,
            "too large, too small, another dtype, between classes"
        );
        for _ in 0..3 {
            pool.give(Data::F32(Vec::with_capacity(16)));
        }
        assert_eq!(pool.len(), 2, "one for each [8] output");
        pool.give(Data::F32(vec![1.0; 150]));
        assert_eq!(pool.len(), 3);
        let big = pool.take(2).expect("the [100] output's buffer");
        assert!(big.capacity() >= 150 && big.is_empty());
        assert!(pool.take(2).is_none());
        assert!(pool.take(3).is_none(), "no i32 buffer was given");
        assert!(pool.take(0).is_some() && pool.take(1).is_some());
        assert!(pool.take(0).is_none());
        assert!(pool.take(4).is_none(), "no such output");
    }

    /// A buffer that fits two classes goes to the larger while it has room, then to the
    /// smaller.
    #[test]
    fn a_full_class_leaves_a_buffer_to_a_smaller_one_it_fits() {
        let mut pool = Pool::new(&[f32s(&[10]), f32s(&[8])]);
        pool.give(Data::F32(Vec::with_capacity(10)));
        pool.give(Data::F32(Vec::with_capacity(10)));
        pool.give(Data::F32(Vec::with_capacity(10)));
        assert_eq!(pool.len(), 2);
        assert!(pool.take(1).is_some_and(|d| d.capacity() == 10));
        assert!(pool.take(0).is_some_and(|d| d.capacity() == 10));
    }

    /// Empty outputs take a buffer of capacity up to two; an output-less program keeps none.
    #[test]
    fn empty_outputs_and_no_outputs() {
        let mut pool = Pool::new(&[f32s(&[0])]);
        pool.give(Data::F32(Vec::new()));
        pool.give(Data::F32(Vec::with_capacity(3)));
        assert_eq!(pool.len(), 1);
        let mut none = Pool::new(&[]);
        none.give(Data::F32(Vec::with_capacity(8)));
        assert_eq!(none.len(), 0);
        assert!(none.take(0).is_none());
    }
}
