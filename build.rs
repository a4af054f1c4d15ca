//! The build script exists only for its build-dependency: `protoc-bin-vendored` ships the protoc that
//! etcd-client's build script runs (through `.cargo/protoc`, named by `.cargo/config.toml`), so that
//! building redcron needs no protoc package. Depending on it here makes Cargo fetch it with the rest.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Fails the build early, with a clear message, on a platform the crate has no binary for.
    if let Err(e) = protoc_bin_vendored::protoc_bin_path() {
        println!("cargo:warning=protoc-bin-vendored has no protoc for this platform ({e}); etcd-client needs PROTOC set or protoc on PATH");
    }
}
