//! Compiles the Modal provider's hand-written `.proto` (the part of Modal's API we use) with a
//! pure-Rust protobuf compiler, so building needs no `protoc`. Only with the `modal` feature.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "modal")]
    {
        println!("cargo:rerun-if-changed=src/modal/modal.proto");
        println!("cargo:rerun-if-changed=src/modal/messages.proto");
        let descriptors = protox::compile(["modal.proto"], ["src/modal"])?;
        tonic_prost_build::configure()
            .build_server(false)
            .compile_fds(descriptors)?;
    }
    Ok(())
}
