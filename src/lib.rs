//! Examples and benches live beside this package.
