//! `tether image build`, `push`, `pull` and `templates`: sandbox images with the static agent
//! baked in, built without Docker (see [`tether_oci`]); `build --template` is in [`template`].
//! Progress goes to stderr when it is a terminal; results go to stdout, as text or `--json`.

mod template;

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use super::output;
use tether_oci::config::{Overrides, StartMode};
use tether_oci::constants::{DEFAULT_CHUNK_BYTES, DEFAULT_TAG};
use tether_oci::reference::Reference;
use tether_oci::{self as image, agent, build, BuildOptions, PushOptions};
use tether_providers::image::{Builder, Event, RemoteBuild};

use crate::templates::{self, spec};

/// The spinner's redraw interval while a build runs.
const SPINNER_TICK: std::time::Duration = std::time::Duration::from_millis(120);

/// `tether image ...`.
#[derive(Debug, Subcommand)]
pub(super) enum ImageCommand {
    /// Build a sandbox image: a base plus the static tether-agent as its entrypoint.
    Build(Box<BuildArgs>),
    /// Push an image (an OCI layout directory or tarball) to a registry.
    Push(PushArgs),
    /// Pull an image (its linux/amd64 variant) from a registry into an OCI layout directory.
    Pull(PullArgs),
    /// List the templates `build --template` makes, and whether each is built here.
    Templates(TemplatesArgs),
}

/// Where a build goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Target {
    /// An OCI image on disk (layout directory, or tarball when --output ends in .tar).
    Oci,
    /// An E2B template.
    E2b,
    /// A Daytona snapshot.
    Daytona,
    /// A Modal image.
    Modal,
    /// An image loaded into the Docker or Podman engine at $DOCKER_HOST (else
    /// /var/run/docker.sock), for `--provider docker`.
    Docker,
    /// A Runloop blueprint.
    Runloop,
}

/// `--start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum Start {
    /// ENTRYPOINT = the agent with every argument.
    Entrypoint,
    /// CMD = the agent with every argument, no ENTRYPOINT.
    Cmd,
}

/// `tether image build`.
#[derive(Debug, Args)]
pub(super) struct BuildArgs {
    /// What to build.
    #[arg(long, value_enum, default_value_t = Target::Oci)]
    target: Target,
    /// The base: an OCI layout directory or tarball, a `docker save` tarball, or a root
    /// filesystem directory; the agent alone when absent.
    #[arg(long, value_name = "PATH")]
    base: Option<PathBuf>,
    /// Build a template instead of --base or --from: `base` (Python, Node, git, the user
    /// `user` in /home/user) or `data-science` (base with numpy, pandas, matplotlib, scipy,
    /// scikit-learn), from the Debian archive and PyPI; needs root. --target oci keeps it for
    /// `tether create --template NAME` (unless --output says where); a provider builds it
    /// under --name [default: tether-NAME] from the one built here (built first when missing
    /// or from an older spec).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["base", "from"],
          value_parser = |name: &str| templates::lookup(name).map(|_| name.to_string()))]
    template: Option<String>,
    /// The Debian archive a template is built from: the URL below which `debian` and
    /// `debian-security` are.
    #[arg(long, value_name = "URL", default_value = spec::DEFAULT_MIRROR, requires = "template")]
    mirror: String,
    /// Where to write the image: a layout directory, or a tarball when it ends in .tar.
    #[arg(long, short, value_name = "PATH")]
    output: Option<PathBuf>,
    /// The static agent binary [default: $TETHER_AGENT_BIN, else
    /// target/x86_64-unknown-linux-musl/release/tether-agent].
    #[arg(long, value_name = "PATH")]
    agent: Option<PathBuf>,
    /// The tag recorded in the layout (`oci:DIR:TAG`).
    #[arg(long, default_value = DEFAULT_TAG)]
    tag: String,
    /// An environment variable of the image; repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    env: Vec<(String, String)>,
    /// The working directory, instead of the base's.
    #[arg(long, value_name = "DIR")]
    workdir: Option<String>,
    /// The user the agent runs as, instead of the base's (`name`, `uid` or `uid:gid`).
    #[arg(long)]
    user: Option<String>,
    /// How the image starts the agent: `entrypoint` (Docker, podman, Daytona, which keeps
    /// only the ENTRYPOINT) or `cmd` (Modal, which appends its own arguments to any
    /// ENTRYPOINT: the agent becomes the CMD and the ENTRYPOINT is cleared). --target modal
    /// always does the latter, and --target e2b (through envd) and runloop (as the devbox's
    /// entrypoint) start the agent themselves.
    #[arg(long, value_enum, default_value_t = Start::Entrypoint)]
    start: Start,
    /// The name to build under on a provider (E2B template, Daytona snapshot, Modal image,
    /// Runloop blueprint); `--target e2b|daytona|modal|docker|runloop` only.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// A registry image to build on (e.g. python:3.12-slim-bookworm): e2b, modal and runloop
    /// pull it and add the agent; for daytona it must already hold the agent, unless --push is given
    /// (then it is pulled here, the agent added, and the result pushed).
    #[arg(long, value_name = "REFERENCE")]
    from: Option<String>,
    /// Build the image here (from --base or --from, plus the agent), push it to
    /// REGISTRY/NAME:TAG, and have the provider pull it from there; `--target daytona`, and
    /// with --template also e2b, modal and runloop.
    #[arg(long, value_name = "REFERENCE")]
    push: Option<String>,
    /// Speak plain HTTP to the --push registry (always so for localhost and 127.0.0.1).
    #[arg(long)]
    insecure: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `tether image push`.
#[derive(Debug, Args)]
pub(super) struct PushArgs {
    /// The image: an OCI layout directory or tarball (as `tether image build` writes).
    #[arg(value_name = "IMAGE")]
    image: PathBuf,
    /// Where to: REGISTRY/NAME:TAG, e.g. ghcr.io/acme/sandbox:v1 or localhost:5000/sandbox:v1.
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// Speak plain HTTP to the registry (always so for localhost and 127.0.0.1).
    #[arg(long)]
    insecure: bool,
    /// Blobs larger than this are uploaded in chunks of this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_CHUNK_BYTES, hide = true)]
    chunk_size: usize,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `tether image templates`.
#[derive(Debug, Args)]
pub(super) struct TemplatesArgs {
    /// Print the templates as JSON.
    #[arg(long)]
    json: bool,
}

/// `tether image pull`.
#[derive(Debug, Args)]
pub(super) struct PullArgs {
    /// What to pull: REGISTRY/NAME:TAG or REGISTRY/NAME@DIGEST.
    #[arg(value_name = "REFERENCE")]
    reference: String,
    /// A new (or empty) directory to write the OCI image layout to.
    #[arg(value_name = "DIR")]
    output: PathBuf,
    /// Speak plain HTTP to the registry (always so for localhost and 127.0.0.1).
    #[arg(long)]
    insecure: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

pub(super) async fn run(cmd: ImageCommand) -> anyhow::Result<()> {
    // Warnings of the image code (a docker config entry it cannot use, say) and of the
    // providers' image builds; nothing else.
    super::init_tracing(Some("tether_oci=warn,tether_providers=warn"));
    match cmd {
        ImageCommand::Build(args) => build_image(*args).await,
        ImageCommand::Push(args) => push_image(args).await,
        ImageCommand::Pull(args) => pull_image(args).await,
        ImageCommand::Templates(args) => template::list(args),
    }
}

/// The provider a target builds on; none for `oci`.
fn builder_of(target: Target) -> Option<Builder> {
    match target {
        Target::Oci => None,
        Target::E2b => Some(Builder::E2b),
        Target::Daytona => Some(Builder::Daytona),
        Target::Modal => Some(Builder::Modal),
        Target::Docker => Some(Builder::Docker),
        Target::Runloop => Some(Builder::Runloop),
    }
}

async fn build_image(args: BuildArgs) -> anyhow::Result<()> {
    if args.template.is_some() {
        return template::build(args).await;
    }
    if let Some(builder) = builder_of(args.target) {
        return build_remote(builder, args).await;
    }
    for (flag, given) in [
        ("--name", args.name.is_some()),
        ("--from", args.from.is_some()),
        ("--push", args.push.is_some()),
    ] {
        if given {
            bail!("{flag} is for --target e2b|daytona|modal|docker|runloop; --target oci writes --output");
        }
    }
    let Some(output) = args.output.clone() else {
        bail!("--output PATH is required for --target oci: a directory, or a file ending in .tar");
    };
    let opts = BuildOptions {
        base: args.base.clone(),
        agent: agent::locate(args.agent.as_deref())?,
        output,
        tag: args.tag.clone(),
        overrides: overrides(&args),
        epoch: build::source_date_epoch()?,
    };
    let spinner = spinner(args.json);
    let bar = spinner.clone();
    let built = tokio::task::spawn_blocking(move || {
        build(&opts, &|step| bar.set_message(step.to_string()))
    })
    .await
    .context("the build stopped unexpectedly")?;
    spinner.finish_and_clear();
    let built = built?;
    if args.json {
        return output::json(&built);
    }
    let path = std::fs::canonicalize(&built.output).unwrap_or(built.output.clone());
    let kind = if built.tarball { "tarball" } else { "layout" };
    println!("{}", built.digest);
    let layers = match built.layers.len() {
        1 => "1 layer".to_string(),
        n => format!("{n} layers"),
    };
    eprintln!(
        "built the OCI {kind} {} ({layers}, tag {})\n  run it:  tether create --image oci:{}\n  push it: tether image push {} REGISTRY/NAME:TAG",
        path.display(),
        built.tag,
        path.display(),
        path.display(),
    );
    Ok(())
}

/// The image settings given on the command line.
fn overrides(args: &BuildArgs) -> Overrides {
    Overrides {
        start: match args.start {
            Start::Entrypoint => StartMode::Entrypoint,
            Start::Cmd => StartMode::Cmd,
        },
        env: args.env.clone(),
        workdir: args.workdir.clone(),
        user: args.user.clone(),
    }
}

/// `--target e2b|daytona|modal|runloop`: the build runs on the provider; its log streams to
/// stderr.
async fn build_remote(builder: Builder, args: BuildArgs) -> anyhow::Result<()> {
    let provider = builder.name();
    if args.output.is_some() {
        bail!("--output is for --target oci; --target {provider} builds on {provider}");
    }
    let Some(name) = args.name.clone() else {
        bail!("--name NAME is required for --target {provider}: what `tether create --provider {provider} --image NAME` will take");
    };
    let push = args.push.as_deref().map(Reference::parse).transpose()?;
    let req = RemoteBuild {
        name,
        from: args.from.clone(),
        base: args.base.clone(),
        push,
        insecure: args.insecure,
        agent: agent::locate(args.agent.as_deref())?,
        overrides: overrides(&args),
        epoch: build::source_date_epoch()?,
    };
    run_remote(builder, &req, args.json, spinner(args.json)).await
}

/// Runs `req` on `builder` with its log above `spinner`, and prints what was built.
async fn run_remote(
    builder: Builder,
    req: &RemoteBuild,
    quiet: bool,
    spinner: ProgressBar,
) -> anyhow::Result<()> {
    let provider = builder.name();
    let bar = spinner.clone();
    let events = move |event: Event| match event {
        Event::Step(step) => bar.set_message(step),
        // The provider's log goes above the spinner (to stderr), never into --json output.
        Event::Log(line) if !quiet => bar.suspend(|| eprintln!("{line}")),
        Event::Log(_) => {}
    };
    let built = tether_providers::build_image(builder, req, &events).await;
    spinner.finish_and_clear();
    let built = built?;
    if quiet {
        return output::json(&built);
    }
    println!("{}", built.name);
    eprintln!(
        "built the {provider} image {} (id {})\n  run it: tether create --provider {provider} --image {}",
        built.name, built.id, built.name
    );
    Ok(())
}

/// A bar per blob on stderr while an image is pushed, hidden for `--json` (and by indicatif
/// when stderr is no terminal).
struct BlobBars {
    all: MultiProgress,
    bars: std::sync::Mutex<std::collections::HashMap<String, ProgressBar>>,
}

impl BlobBars {
    fn new(hidden: bool) -> BlobBars {
        let all = if hidden {
            MultiProgress::with_draw_target(ProgressDrawTarget::hidden())
        } else {
            MultiProgress::new()
        };
        BlobBars {
            all,
            bars: Default::default(),
        }
    }

    fn show(&self, event: image::PushProgress) {
        let mut bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            image::PushProgress::Started { digest, size } => {
                let bar = self.all.add(ProgressBar::new(size));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix} {bar:30} {bytes:>10}/{total_bytes:<10} {msg}",
                    )
                    .expect("the template is valid"),
                );
                bar.set_prefix(digest.short().to_string());
                bar.set_message("uploading");
                bars.insert(digest.to_string(), bar);
            }
            image::PushProgress::Sent { digest, bytes } => {
                if let Some(bar) = bars.get(digest.as_str()) {
                    bar.inc(bytes);
                }
            }
            image::PushProgress::Finished { digest, existed } => {
                if let Some(bar) = bars.get(digest.as_str()) {
                    if existed {
                        bar.set_position(bar.length().unwrap_or(0));
                        bar.finish_with_message("already there");
                    } else {
                        bar.finish_with_message("pushed");
                    }
                }
            }
        }
    }
}

/// A spinner on stderr, hidden for `--json` (and by indicatif when stderr is no terminal).
fn spinner(hidden: bool) -> ProgressBar {
    if hidden {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("the template is valid"),
    );
    bar.enable_steady_tick(SPINNER_TICK);
    bar
}

/// What `push --json` prints.
#[derive(Serialize)]
struct PushReport<'a> {
    #[serde(flatten)]
    pushed: &'a image::Pushed,
    /// `REGISTRY/NAME@DIGEST`: the pushed image, immutably.
    pinned: String,
}

async fn push_image(args: PushArgs) -> anyhow::Result<()> {
    let target = Reference::parse(&args.reference)?;
    let opts = PushOptions {
        insecure: args.insecure,
        chunk_bytes: args.chunk_size,
        ..PushOptions::default()
    };
    let bars = BlobBars::new(args.json);
    let pushed = image::push(&args.image, &target, &opts, &|event| bars.show(event)).await?;
    let pinned = format!(
        "{}/{}@{}",
        target.registry, target.repository, pushed.digest
    );
    if args.json {
        return output::json(&PushReport {
            pushed: &pushed,
            pinned,
        });
    }
    let sent = pushed.blobs.iter().filter(|b| !b.existed).count();
    eprintln!(
        "pushed {} ({} of {} blobs uploaded, the rest were already there)",
        pushed.reference,
        sent,
        pushed.blobs.len()
    );
    println!("{pinned}");
    Ok(())
}

/// What `pull --json` prints.
#[derive(Serialize)]
struct PullReport {
    /// The manifest's digest, as the registry has it.
    digest: String,
    /// The layout directory written.
    layout: PathBuf,
}

async fn pull_image(args: PullArgs) -> anyhow::Result<()> {
    let reference = Reference::parse(&args.reference)?;
    let out = &args.output;
    if out.exists() && std::fs::read_dir(out).map(|mut d| d.next().is_some())? {
        bail!(
            "{} is not empty: name a new or empty directory for the pulled image",
            out.display()
        );
    }
    let opts = image::PullOptions {
        insecure: args.insecure,
    };
    let spinner = spinner(args.json);
    spinner.set_message(format!("pulling {reference}"));
    let pulled = image::pull(&reference, out, &opts).await;
    spinner.finish_and_clear();
    let pulled = pulled?;
    if args.json {
        return output::json(&PullReport {
            digest: pulled.manifest.to_string(),
            layout: pulled.layout,
        });
    }
    println!("{}", pulled.manifest);
    eprintln!(
        "pulled {reference} into {}\n  run it: tether create --image oci:{}",
        out.display(),
        out.display()
    );
    Ok(())
}
