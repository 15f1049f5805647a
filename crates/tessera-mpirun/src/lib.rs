//! The programs the `mpirun` tests launch (`src/bin`): the seed examples, unchanged, built
//! with `tessera`'s `mpi` feature, a probe of the distributed API's errors and faults, and
//! the scaling bench (`docs/DISTRIBUTED.md`, `docs/PERFORMANCE.md`). The tests are in
//! `tests/mpirun.rs`.
