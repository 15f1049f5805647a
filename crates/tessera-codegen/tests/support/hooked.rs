//! Shared by the tests that watch an executable's collectives (`device_forks.rs`,
//! `reentry.rs`): one device alone, running a hook before each collective it is asked for.

use tessera_ir::{Literal, ReduceKind};
use tessera_transport::{Collectives, Group, SingleDevice, TransportError};

/// One device alone (`SingleDevice`) that calls `before` first at every collective.
pub struct Hooked<F: Fn()>(pub F);

impl<F: Fn()> Hooked<F> {
    fn hook(&self) -> &SingleDevice {
        (self.0)();
        &SingleDevice
    }
}

impl<F: Fn()> Collectives for Hooked<F> {
    fn position(&self) -> usize {
        0
    }

    fn all_reduce(
        &self,
        g: &Group,
        kind: ReduceKind,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.hook().all_reduce(g, kind, x)
    }

    fn all_gather(&self, g: &Group, dim: usize, x: &Literal) -> Result<Literal, TransportError> {
        self.hook().all_gather(g, dim, x)
    }

    fn reduce_scatter(
        &self,
        g: &Group,
        kind: ReduceKind,
        dim: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.hook().reduce_scatter(g, kind, dim, x)
    }

    fn all_to_all(
        &self,
        g: &Group,
        split: usize,
        concat: usize,
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.hook().all_to_all(g, split, concat, x)
    }

    fn collective_permute(
        &self,
        g: &Group,
        pairs: &[(usize, usize)],
        x: &Literal,
    ) -> Result<Literal, TransportError> {
        self.hook().collective_permute(g, pairs, x)
    }

    fn axis_index(&self, g: &Group) -> Result<usize, TransportError> {
        self.hook().axis_index(g)
    }
}
