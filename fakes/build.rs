//! Compiles the fake Modal's service (`src/modal/service.proto`, on the relay's Modal messages,
//! so the fake and the provider cannot disagree on the wire), server side, with a pure-Rust
//! protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let messages = "../relay/providers/src/modal";
    println!("cargo:rerun-if-changed=src/modal/service.proto");
    println!("cargo:rerun-if-changed={messages}/messages.proto");
    let descriptors = protox::compile(["service.proto"], ["src/modal", messages])?;
    tonic_prost_build::configure()
        .build_client(false)
        .compile_fds(descriptors)?;
    Ok(())
}
