//! Integration tests for the process tier. Each run happens in a child process tree the tier
//! creates, so nothing here restricts the test process itself.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly on broken invariants")]

#[macro_use]
mod support;
mod confinement;
mod forkserver;
mod launch;
mod limits;
mod netns;
mod one_path;
mod pool;
mod session;
mod workspace;
