//! Test support: real redis-server nodes and worker processes.
