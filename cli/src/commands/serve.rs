//! `tether serve`: the relay, in the foreground until SIGINT or SIGTERM; and where the
//! `tether-agent` binary it runs in sandboxes is found.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use tether_client::local::data_dir as default_data_dir;
use tether_relay::{
    self as server, ConnectionLimits, Database, EgressConfig, PolicyConfig, RelayConfig, TlsFiles,
    DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_LISTEN, DEFAULT_PEER_TIMEOUT,
    DEFAULT_REAP_INTERVAL,
};

/// The variable naming the agent binary.
const AGENT_BIN_VAR: &str = "TETHER_AGENT_BIN";
/// The agent binary's file name, looked for beside `tether`.
const AGENT_BIN_NAME: &str = "tether-agent";

/// `tether serve`.
#[derive(Debug, Args)]
pub(super) struct ServeArgs {
    /// The address to listen on; port 0 picks a free one.
    #[arg(long, value_name = "ADDR", default_value_t = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Where the database, the admin token and the sandboxes' files live
    /// [default: $TETHER_HOME, else ~/.local/share/tether].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The policy file: what each tenant may use (providers, the host's network, sizes,
    /// lifetimes, sandbox counts); docs/policy.md lists its keys. Built-in defaults
    /// when absent.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A directory under which admin tokens may use host directories as images
    /// (`tether create --image DIR`); repeatable. None by default: only `oci:` images.
    #[arg(long = "image-root", value_name = "DIR")]
    image_roots: Vec<PathBuf>,
    /// Serve HTTPS and WSS only, with this certificate chain (PEM, leaf first); needs
    /// --tls-key. Clients of a private CA or a self-signed certificate set TETHER_CA_CERT.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1, unencrypted).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// A hosts(5) file (`ADDRESS NAME...` per line) the egress proxy of allowlisted sandboxes
    /// resolves names with before the system's resolver.
    #[arg(long, value_name = "FILE")]
    egress_hosts: Option<PathBuf>,
    /// CA certificates (PEM) the egress proxy trusts for upstreams it intercepts (hosts that
    /// carry secrets), besides the system's and the webpki roots.
    #[arg(long, value_name = "PEM")]
    egress_ca_file: Option<PathBuf>,
    /// The address at which sandboxes that do not run on this host (E2B, Daytona, Modal)
    /// reach this relay's egress proxy, `http://HOST:PORT` or `https://HOST:PORT` (TLS with
    /// --tls-cert): with it, such sandboxes may have secrets (--secret), which their HTTP
    /// clients' requests pick up there. The listener authenticates every request with the
    /// sandbox's own credential.
    #[arg(long, value_name = "URL")]
    egress_url: Option<String>,
    /// Where the egress listener listens [default: 0.0.0.0 on the port of --egress-url].
    #[arg(long, value_name = "ADDR", requires = "egress_url")]
    egress_listen: Option<SocketAddr>,
    /// The Docker or Podman engine's socket for `--provider docker` (`unix:///PATH`)
    /// [default: $DOCKER_HOST, else unix:///var/run/docker.sock].
    #[arg(long, value_name = "URL")]
    docker_host: Option<String>,
    /// How long a connected client or a sandbox's agent may be silent (not even answering
    /// the relay's pings) before it is taken for dead: a client's session then ends as if it
    /// had disconnected (its foreground processes are killed) [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    peer_timeout: Option<std::time::Duration>,
    /// How long a client may take to send a request's headers (or an idle keep-alive
    /// connection to start its next request), and to finish a TLS handshake [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    header_timeout: Option<std::time::Duration>,
    /// How long an API request's body may take to arrive once its headers have; a body
    /// still incomplete then is answered 408 and its connection closed [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    body_timeout: Option<std::time::Duration>,
    /// HTTP connections served at once; at the cap the oldest one that has not sent a
    /// complete request is closed for a new one [default: half the descriptors the relay may
    /// open, less a reserve].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_connections: Option<u64>,
    /// Keep the registry in this PostgreSQL database (postgres://USER:PASSWORD@HOST:PORT/DB),
    /// shared with other relays as replicas, instead of SQLite in the data directory; better
    /// given in the environment, which `ps` does not show.
    #[arg(
        long,
        value_name = "URL",
        env = "TETHER_DATABASE",
        hide_env_values = true
    )]
    database: Option<String>,
    /// With --database: the key file every relay of the database shares (it seals tokens and
    /// secrets, and authenticates relays to each other) [default: DATA_DIR/relay.key].
    #[arg(long, value_name = "FILE", requires = "database")]
    key_file: Option<PathBuf>,
    /// The URL other relays of the database reach this one at, e.g. http://10.0.0.5:7420
    /// [default: the address it listens on].
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// Serve previews by host name under this domain too, `{port}-{id}.DOMAIN`, for clients
    /// on other machines (`*.localhost` resolves only on the relay's own): give it a wildcard
    /// DNS record (`*.DOMAIN`) pointing at this relay and, with --tls-cert, a certificate
    /// that names `*.DOMAIN` [default: *.localhost only].
    #[arg(long, value_name = "DOMAIN")]
    preview_domain: Option<tether_relay::PreviewDomain>,
}

pub(super) fn run(args: ServeArgs) -> anyhow::Result<()> {
    super::init_tracing(Some("info"));
    let policy = PolicyConfig::load(args.config.as_deref(), args.image_roots)?;
    let config = RelayConfig {
        listen: args.listen,
        data_dir: args.data_dir.unwrap_or_else(default_data_dir),
        agent_binary: agent_binary()?,
        reap_interval: DEFAULT_REAP_INTERVAL,
        policy,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            // clap has refused one without the other.
            _ => None,
        },
        egress: EgressConfig {
            hosts_file: args.egress_hosts,
            ca_file: args.egress_ca_file,
            url: args.egress_url,
            listen: args.egress_listen,
            // The relay sets it from its TLS files.
            listener_cert: None,
        },
        docker_host: args.docker_host,
        connections: ConnectionLimits {
            peer_timeout: args.peer_timeout.unwrap_or(DEFAULT_PEER_TIMEOUT),
            header_timeout: args.header_timeout.unwrap_or(DEFAULT_HEADER_TIMEOUT),
            body_timeout: args.body_timeout.unwrap_or(DEFAULT_BODY_TIMEOUT),
            max_connections: args
                .max_connections
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
        },
        database: match args.database {
            Some(url) => Database::Postgres {
                url,
                key_file: args.key_file,
            },
            None => Database::Sqlite,
        },
        advertise: args.advertise,
        preview_domain: args.preview_domain,
    };
    let rt = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    rt.block_on(async {
        let relay = server::start(config).await?;
        // The one machine-readable line: scripts and tests wait for it.
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening {}", relay.url())?;
        stdout.flush()?;
        drop(stdout);
        eprintln!(
            "tether: relay ready; clients on this machine use the admin token in {}",
            relay.admin_token_file.display()
        );
        relay.wait().await
    })
}

/// The agent binary: `TETHER_AGENT_BIN`, else `tether-agent` beside this executable.
pub(super) fn agent_binary() -> anyhow::Result<PathBuf> {
    const HOW: &str =
        "build it with `cargo build --release -p tether-agent` or set TETHER_AGENT_BIN";
    if let Some(path) = std::env::var_os(AGENT_BIN_VAR) {
        let path = PathBuf::from(path);
        anyhow::ensure!(
            path.is_file(),
            "{AGENT_BIN_VAR} is {}, which is not a file: {HOW}",
            path.display()
        );
        return Ok(path);
    }
    let exe = std::env::current_exe().context("cannot find the tether executable's path")?;
    let beside = exe.with_file_name(AGENT_BIN_NAME);
    anyhow::ensure!(
        beside.is_file(),
        "the sandbox agent binary {} does not exist: {HOW}",
        beside.display()
    );
    Ok(beside)
}
