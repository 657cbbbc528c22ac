//! `tether image build --template NAME` and `tether image templates`: a template (see
//! [`crate::templates`]) built here and kept for local sandboxes, or handed to a provider's
//! builder; and the list of templates with where each is built.

use std::path::PathBuf;

use anyhow::{bail, Context};
use serde::Serialize;

use super::{builder_of, output, overrides, run_remote, spinner, BuildArgs, TemplatesArgs};
use crate::templates::{self, build::LocalBuild, spec};
use tether_oci::reference::Reference;
use tether_oci::{self as image, agent, PushOptions};
use tether_providers::image::{Builder, RemoteBuild};

/// `--template NAME`: the template's root filesystem built here from the Debian archive and
/// PyPI, made an image with the agent, and kept (`--target oci`) or handed to a provider:
/// loaded into Docker, or pushed to `--push` for the others to build from. Every argument is
/// checked before the minutes of building start.
pub(super) async fn build(args: BuildArgs) -> anyhow::Result<()> {
    let name = args
        .template
        .as_deref()
        .expect("build_image checked --template");
    let spec = templates::lookup(name).map_err(anyhow::Error::msg)?;
    let builder = builder_of(args.target);
    let push = args.push.as_deref().map(Reference::parse).transpose()?;
    match builder {
        None => {
            if args.name.is_some() || push.is_some() {
                bail!("--name and --push are for a provider's --target; --target oci keeps the template here (or writes --output)");
            }
        }
        Some(builder) => {
            let provider = builder.name();
            if args.output.is_some() {
                bail!("--output is for --target oci; --target {provider} builds on {provider}");
            }
            match (builder, &push) {
                (Builder::Docker, Some(_)) => {
                    bail!("--push is not for --target docker: the image is loaded into the engine directly")
                }
                (Builder::Docker, None) | (_, Some(_)) => {}
                (_, None) => bail!(
                    "--target {provider} --template {0} needs --push REGISTRY/NAME:TAG: the \
                     template is built here (from the Debian archive and PyPI, so every \
                     provider gets the same files), pushed there, and {provider} builds from \
                     it; {provider} must be able to pull from that registry",
                    spec.name
                ),
            }
        }
    }
    let agent = agent::locate(args.agent.as_deref())?;
    agent::check_static(&agent)?;
    let settings = templates::build::overrides(&spec, &overrides(&args));
    let epoch = templates::build::epoch()?;
    let spinner = spinner(args.json);
    let reused = builder.and_then(|_| templates::build::reusable(&spec));
    let (layout, local) = match reused {
        Some((layout, _)) => {
            spinner.suspend(|| {
                eprintln!(
                    "using the {} template built here ({}; `{}` rebuilds it)",
                    spec.name,
                    layout.display(),
                    templates::build_command(spec.name)
                )
            });
            (layout, None)
        }
        None => {
            let req = LocalBuild {
                spec: spec.clone(),
                mirror: args.mirror.clone(),
                agent: agent.clone(),
                tag: args.tag.clone(),
                overrides: settings.clone(),
                epoch,
                output: args.output.clone(),
            };
            let bar = spinner.clone();
            let built = tokio::task::spawn_blocking(move || {
                templates::build::local(req, &|line| bar.set_message(line.to_string()))
            })
            .await
            .context("the template build stopped unexpectedly");
            let built = match built {
                Ok(Ok(built)) => built,
                Ok(Err(e)) | Err(e) => {
                    spinner.finish_and_clear();
                    return Err(e);
                }
            };
            // Timings go to stderr always: they are how a slow mirror or PyPI shows.
            spinner.suspend(|| {
                eprintln!(
                    "built the {} template in {:.0}s (root file system {:.0}s, image {:.0}s)",
                    spec.name,
                    built.rootfs_seconds + built.image_seconds,
                    built.rootfs_seconds,
                    built.image_seconds
                )
            });
            (built.layout.clone(), Some(built))
        }
    };
    let Some(builder) = builder else {
        spinner.finish_and_clear();
        let built = local.expect("--target oci always builds");
        if args.json {
            return output::json(&built);
        }
        println!("{}", built.digest);
        let run = if built.registered {
            format!("tether create --template {}", spec.name)
        } else {
            format!("tether create --image oci:{}", built.layout.display())
        };
        eprintln!(
            "the {} template is the OCI layout {}\n  run it: {run}",
            spec.name,
            built.layout.display()
        );
        return Ok(());
    };
    let mut req = RemoteBuild {
        name: args
            .name
            .clone()
            .unwrap_or_else(|| templates::provider_name(spec.name)),
        from: None,
        base: None,
        push: None,
        insecure: args.insecure,
        agent,
        overrides: settings,
        epoch,
    };
    match (builder, push) {
        (Builder::Docker, _) => req.base = Some(layout),
        (Builder::Daytona, push) => {
            req.base = Some(layout);
            req.push = push;
        }
        (_, Some(target)) => {
            spinner.set_message(format!("pushing the {} template to {target}", spec.name));
            let opts = PushOptions {
                insecure: args.insecure,
                ..PushOptions::default()
            };
            let pushed = image::push(&layout, &target, &opts, &|_| {}).await?;
            // By digest: the provider builds from exactly what was pushed.
            req.from = Some(format!(
                "{}/{}@{}",
                target.registry, target.repository, pushed.digest
            ));
        }
        (_, None) => unreachable!("checked above: these targets need --push"),
    }
    run_remote(builder, &req, args.json, spinner).await
}

/// `tether image templates`: each template, its spec's digest, and where it is built here.
pub(super) fn list(args: TemplatesArgs) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Listed {
        name: &'static str,
        about: &'static str,
        /// The digest of its spec: what a built one records.
        spec: String,
        /// Its OCI layout here, when built (from any spec).
        built: Option<PathBuf>,
        /// Whether the one built here is from this spec.
        current: bool,
        /// Its name on a cloud provider.
        provider_name: String,
    }
    let listed: Vec<Listed> = spec::all()
        .into_iter()
        .map(|s| {
            let record = templates::built(s.name);
            let spec = s.digest();
            Listed {
                name: s.name,
                about: s.about,
                current: record.as_ref().is_some_and(|r| r.spec == spec),
                built: record.map(|_| templates::image_path(s.name)),
                spec,
                provider_name: templates::provider_name(s.name),
            }
        })
        .collect();
    if args.json {
        return output::json(&listed);
    }
    let mut table = output::Table::new(&["NAME", "BUILT HERE", "ABOUT"]);
    for l in &listed {
        let built = match (&l.built, l.current) {
            (Some(path), true) => path.display().to_string(),
            (Some(path), false) => format!("{} (older spec)", path.display()),
            (None, _) => format!("no: {}", templates::build_command(l.name)),
        };
        table.row(vec![l.name.to_string(), built, l.about.to_string()]);
    }
    table.print()
}
