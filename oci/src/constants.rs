//! Every fixed name and tunable of the image module, with its unit: where the agent lives in
//! an image and how it starts (the contract with the providers and `images/`), and the sizes
//! and limits of building, pushing and unpacking.

/// Where the static agent is put in every image.
pub const AGENT_PATH: &str = "/usr/local/bin/tether-agent";
/// The port the agent listens on in an image; the cloud providers open this port.
pub(crate) const AGENT_PORT: u16 = 7421;
/// The image's entrypoint: the agent on all interfaces. The token comes from the
/// `TETHER_AGENT_TOKEN` variable, which each provider sets per sandbox (and the agent removes
/// from its environment at once), so no secret is baked into an image.
pub const ENTRYPOINT: [&str; 4] = [AGENT_PATH, "serve", "--listen", "0.0.0.0:7421"];
/// The label that marks an image built by Tether and says where its agent is.
pub const AGENT_LABEL: &str = "dev.tether.agent";
/// `PATH` for images whose base sets none (Docker's default).
pub(crate) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The platform of every image: the agent is an x86_64 Linux binary.
pub(crate) const OS: &str = "linux";
/// See [`OS`].
pub(crate) const ARCHITECTURE: &str = "amd64";

/// The tag written in a layout's index when none is given (what `oci:DIR` tools look up).
pub const DEFAULT_TAG: &str = "latest";
/// The variable that fixes every timestamp in a build (<https://reproducible-builds.org>).
pub const SOURCE_DATE_EPOCH: &str = "SOURCE_DATE_EPOCH";
/// gzip level for layers: the default trade of size against time. Changing it changes digests.
pub const GZIP_LEVEL: u32 = 6;

/// The largest JSON document (index, manifest, config) we read; real ones are kilobytes.
pub const MAX_JSON_BYTES: u64 = 4 << 20; // 4 MiB
/// Blobs up to this size are uploaded in one PUT; larger ones in PATCH chunks of this size.
pub const DEFAULT_CHUNK_BYTES: usize = 8 << 20; // 8 MiB
/// Blobs uploaded at once.
pub(crate) const PARALLEL_UPLOADS: usize = 3;
/// How long connecting to a registry may take.
pub(crate) const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long one registry request (one chunk) may take.
pub(crate) const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// The most of a registry's error body quoted in a message.
pub(crate) const MAX_QUOTED_BODY: usize = 300; // bytes

/// Symbolic links followed while resolving one path inside a root filesystem (as Linux's
/// `MAXSYMLINKS`).
pub(crate) const MAX_SYMLINK_HOPS: u32 = 40;
