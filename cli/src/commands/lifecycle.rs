//! `tether create`, `ls`, `rm` and `info`: sandboxes over the relay's REST API. The create
//! flags are shared with `tether run`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use futures_util::future::join_all;
use serde::Serialize;
use tether_proto::op::{AgentInfo, ListeningPort};

use super::output::{self, Table};
use super::remote::Remote;
use tether_client::api::{
    CreateRequest, EgressSpec, NetworkInfo, PreviewInfo, SandboxInfo, SecretSpec, SecretValue,
};
use tether_client::api::{IdleAction, NetworkPolicy, SandboxSpec};
use tether_client::escape::escape_str;
use tether_client::size::parse_size;
use tether_client::ClientError;

/// What a new sandbox should be (`tether create` and `tether run`).
#[derive(Debug, Clone, Args)]
pub(super) struct CreateArgs {
    /// A label for lookups (`tether ls --label`, `--get-or-create`); repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::key_value)]
    labels: Vec<(String, String)>,
    /// Delete the sandbox this long after creation, e.g. 30m or 2h.
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    ttl: Option<Duration>,
    /// Delete the sandbox (or pause it: --on-idle pause) after this long without a client,
    /// e.g. 10m.
    #[arg(long, value_name = "DURATION", value_parser = super::duration)]
    idle_timeout: Option<Duration>,
    /// What --idle-timeout does: `delete` (the default), `pause` (processes and memory
    /// kept) or `stop` (processes ended, disk kept); the next session resumes or starts it.
    #[arg(long, value_name = "ACTION", requires = "idle_timeout")]
    on_idle: Option<IdleAction>,
    /// Refuse sessions and previews while the sandbox is paused or stopped, instead of
    /// waking it; `tether resume ID` or `tether start ID` then wakes it.
    #[arg(long)]
    no_auto_resume: bool,
    /// The image: for the local provider a root filesystem directory (or `oci:PATH`);
    /// the host's own filesystem, read-only, when absent.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// A template instead of --image (`tether image templates` lists them): for the local
    /// provider the one `tether image build --template NAME` built on this machine, on a
    /// cloud provider the image built under tether-NAME.
    #[arg(long, value_name = "NAME", conflicts_with = "image",
          value_parser = |name: &str| crate::templates::lookup(name).map(|_| name.to_string()))]
    template: Option<String>,
    /// Memory limit, e.g. 512M or 2G (binary units).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// CPU limit in cores; may be fractional, e.g. 0.5.
    #[arg(long, value_name = "CORES")]
    cpus: Option<f64>,
    /// Limit on the number of processes.
    #[arg(long, value_name = "N")]
    pids: Option<u64>,
    /// Disk quota for everything the sandbox writes (workspace, /tmp, an image's changes),
    /// e.g. 2G (binary units); its file count grows with it. The relay's default when absent.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    disk: Option<u64>,
    /// Network access: `none` (loopback only, the default), `host` (the host's network,
    /// shared) or `allowlist` (only what --allow-host, --allow-cidr and --secret name, through
    /// the relay's egress proxy; implied by those flags).
    #[arg(long, value_enum, value_name = "MODE")]
    network: Option<Network>,
    /// A host the sandbox may reach by name: exact (`api.openai.com`), every name below a
    /// domain (`*.pypi.org`), or a preset of hosts (`@package-registries`: PyPI, npm, Debian
    /// and crates.io; `tether info` shows its hosts); repeatable. Implies --network allowlist.
    #[arg(long = "allow-host", value_name = "PATTERN")]
    allow_hosts: Vec<String>,
    /// A network the sandbox may reach by address (TCP), e.g. 10.1.0.0/16 or 192.0.2.7;
    /// repeatable. Implies --network allowlist.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    allow_cidrs: Vec<String>,
    /// A secret the sandbox sees only as a placeholder in $NAME, replaced by its value in
    /// requests to HOST (and only there): the value is this shell's $NAME when set, else the
    /// relay's secret store (`tether secret set NAME`); repeatable. Implies --network allowlist.
    #[arg(long = "secret", value_name = "NAME@HOST[,HOST...]", value_parser = secret_binding)]
    secrets: Vec<(String, Vec<String>)>,
    /// Run the sandbox without its system call filter, for code that needs a call the filter
    /// refuses (nested containers, io_uring). Admin tokens only.
    #[arg(long)]
    no_seccomp: bool,
    /// An environment variable for every process in the sandbox; repeatable.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = super::key_value)]
    env: Vec<(String, String)>,
    /// The provider to create it with; the relay's default (`local`) when absent.
    #[arg(long, value_name = "NAME")]
    provider: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Network {
    None,
    Host,
    Allowlist,
}

/// `NAME@HOST[,HOST...]`.
fn secret_binding(text: &str) -> Result<(String, Vec<String>), String> {
    let usage = || {
        format!("`{text}` is not NAME@HOST[,HOST...]; e.g. --secret OPENAI_API_KEY@api.openai.com")
    };
    let (name, hosts) = text.split_once('@').ok_or_else(usage)?;
    let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
    if name.is_empty() || hosts.iter().any(String::is_empty) {
        return Err(usage());
    }
    Ok((name.to_string(), hosts))
}

impl CreateArgs {
    /// The REST request these flags describe.
    pub(super) fn request(&self) -> anyhow::Result<CreateRequest> {
        let allowing = !self.allow_hosts.is_empty()
            || !self.allow_cidrs.is_empty()
            || !self.secrets.is_empty();
        let network =
            match (self.network, allowing) {
                (None | Some(Network::None), false) => NetworkPolicy::None,
                (Some(Network::Host), false) => NetworkPolicy::Host,
                (None | Some(Network::Allowlist), _) => NetworkPolicy::Allowlist,
                (Some(other), true) => {
                    anyhow::bail!(
                "--allow-host, --allow-cidr and --secret need --network allowlist (which they \
                 imply), not --network {}; drop --network",
                if other == Network::Host { "host" } else { "none" }
            )
                }
            };
        let secrets = self
            .secrets
            .iter()
            .map(|(name, hosts)| SecretSpec {
                name: name.clone(),
                hosts: hosts.clone(),
                // The caller's own value, if exported; else the relay's store has it.
                value: std::env::var(name).ok().map(SecretValue::new),
            })
            .collect();
        let spec = SandboxSpec {
            image: match (&self.template, &self.image) {
                (Some(name), _) => {
                    Some(crate::templates::image_for(name, self.provider.as_deref())?)
                }
                (None, image_name) => image_name.as_deref().map(image).transpose()?,
            },
            labels: self.labels.iter().cloned().collect(),
            env: self.env.iter().cloned().collect(),
            ttl: self.ttl,
            idle_timeout: self.idle_timeout,
            on_idle: self.on_idle.unwrap_or_default(),
            auto_resume: self.no_auto_resume.then_some(false),
            cpus: self.cpus,
            memory_bytes: self.memory,
            pids: self.pids,
            network,
            egress: EgressSpec {
                allow_hosts: self.allow_hosts.clone(),
                allow_cidrs: self.allow_cidrs.clone(),
            },
            secrets,
            disk_bytes: self.disk,
            seccomp_unconfined: self.no_seccomp,
        };
        Ok(CreateRequest {
            provider: self.provider.clone(),
            spec,
            get_or_create: false,
        })
    }
}

/// An image that names a directory on this machine is sent as an absolute path: the relay
/// does not share the CLI's working directory.
fn image(name: &str) -> anyhow::Result<String> {
    let (prefix, path) = match name.strip_prefix("oci:") {
        Some(path) => ("oci:", path),
        None => ("", name),
    };
    if Path::new(path).exists() {
        let abs = std::fs::canonicalize(path)
            .with_context(|| format!("cannot resolve the image path {path}"))?;
        return Ok(format!("{prefix}{}", abs.display()));
    }
    Ok(name.to_string())
}

/// `tether create`.
#[derive(Debug, Args)]
pub(super) struct CreateCommand {
    #[command(flatten)]
    spec: CreateArgs,
    /// Return the existing sandbox with exactly these labels, if there is one.
    #[arg(long)]
    get_or_create: bool,
    /// Print the sandbox as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

pub(super) async fn create(remote: Remote, args: CreateCommand) -> anyhow::Result<()> {
    let mut req = args.spec.request()?;
    req.get_or_create = args.get_or_create;
    let rest = remote.rest()?;
    let sandbox = rest
        .create(&req)
        .await
        .map_err(|e| remote.explain(e, None))?;
    if args.json {
        output::json(&sandbox)
    } else {
        println!("{}", sandbox.id);
        Ok(())
    }
}

/// `tether ls`.
#[derive(Debug, Args)]
pub(super) struct LsArgs {
    /// Only sandboxes with this label; repeatable (all must match).
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = super::key_value)]
    labels: Vec<(String, String)>,
    /// Print only the ids.
    #[arg(long, short, conflicts_with = "json")]
    quiet: bool,
    /// Print the sandboxes as a JSON array.
    #[arg(long)]
    json: bool,
    /// List orphans instead: sandboxes at the relay's providers labelled as Tether's but
    /// unknown to its registry (left by a relay that crashed or lost its data directory).
    /// Relay admin only.
    #[arg(long, conflicts_with = "labels")]
    orphans: bool,
    /// With --orphans: remove each orphan at its provider.
    #[arg(long, requires = "orphans")]
    rm: bool,
}

pub(super) async fn ls(remote: Remote, args: LsArgs) -> anyhow::Result<()> {
    if args.orphans {
        return ls_orphans(remote, args).await;
    }
    let labels: BTreeMap<String, String> = args.labels.into_iter().collect();
    let rest = remote.rest()?;
    let sandboxes = rest
        .list(&labels)
        .await
        .map_err(|e| remote.explain(e, None))?;
    if args.json {
        return output::json(&sandboxes);
    }
    if args.quiet {
        sandboxes.iter().for_each(|s| println!("{}", s.id));
        return Ok(());
    }
    let now = output::now_ms();
    let mut table = Table::new(&["ID", "PROVIDER", "STATE", "AGE", "LABELS"]);
    for s in &sandboxes {
        table.row(vec![
            s.id.clone(),
            s.provider.clone(),
            s.state.clone(),
            output::age(s.created_ms, now),
            output::labels(&s.labels),
        ]);
    }
    table.print()
}

/// `tether ls --orphans [--rm]`.
async fn ls_orphans(remote: Remote, args: LsArgs) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    let found = rest.orphans().await.map_err(|e| remote.explain(e, None))?;
    for problem in &found.unreachable {
        eprintln!(
            "warning: cannot list provider `{}`: {}",
            problem.provider, problem.error
        );
    }
    if args.rm {
        for orphan in &found.orphans {
            rest.delete(&orphan.provider_ref)
                .await
                .map_err(|e| remote.explain(e, Some(&orphan.id)))?;
        }
    }
    if args.json {
        return output::json(&found.orphans);
    }
    if args.quiet {
        found.orphans.iter().for_each(|o| println!("{}", o.id));
        return Ok(());
    }
    let mut table = Table::new(&["ID", "PROVIDER", "PROVIDER ID"]);
    for o in &found.orphans {
        table.row(vec![
            o.id.clone(),
            o.provider.clone(),
            o.provider_ref.clone(),
        ]);
    }
    table.print()?;
    if args.rm && !found.orphans.is_empty() {
        eprintln!("removed {} orphan(s)", found.orphans.len());
    }
    Ok(())
}

/// `tether rm`.
#[derive(Debug, Args)]
pub(super) struct RmArgs {
    /// The sandboxes to delete.
    #[arg(value_name = "ID", required_unless_present = "all")]
    ids: Vec<String>,
    /// Delete every sandbox of the token's tenant.
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// Print what was deleted as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Removed {
    deleted: Vec<String>,
    /// Sandboxes the relay had already deleted on its own (TTL, idle, gone).
    already_deleted: Vec<AlreadyDeleted>,
    failed: Vec<RemoveFailure>,
}

#[derive(Serialize)]
struct AlreadyDeleted {
    id: String,
    reason: String,
}

#[derive(Serialize)]
struct RemoveFailure {
    id: String,
    error: String,
}

pub(super) async fn rm(remote: Remote, args: RmArgs) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    let ids = if args.all {
        let all = rest.list(&BTreeMap::new()).await;
        all.map_err(|e| remote.explain(e, None))?
            .into_iter()
            .map(|s| s.id)
            .collect()
    } else {
        args.ids
    };
    // The relay's delete is idempotent; a named sandbox that does not exist (a typo) is
    // still an error here, so it is looked up first. One the relay deleted itself (410) is
    // what the user wanted anyway: it is reported, not an error.
    let check = !args.all;
    let delete = |id: &str| {
        let rest = &rest;
        let id = id.to_string();
        async move {
            if check {
                match rest.get(&id).await {
                    Err(ClientError::Http {
                        status: 410,
                        message,
                        ..
                    }) => return Ok(Some(message)),
                    // Not in the registry: perhaps an orphan, which the relay admin removes.
                    Err(e @ ClientError::Http { status: 404, .. }) => {
                        let orphan = rest.orphans().await.ok().is_some_and(|found| {
                            found
                                .orphans
                                .iter()
                                .any(|o| o.id == id || o.provider_ref == id)
                        });
                        if !orphan {
                            return Err(e);
                        }
                    }
                    Err(e) => return Err(e),
                    Ok(_) => {}
                }
            }
            rest.delete(&id).await.map(|()| None)
        }
    };
    // Deleting tears a sandbox down; doing them at once makes `rm --all` as slow as one.
    let results = join_all(ids.iter().map(|id| delete(id))).await;
    let mut report = Removed {
        deleted: Vec::new(),
        already_deleted: Vec::new(),
        failed: Vec::new(),
    };
    for (id, result) in ids.into_iter().zip(results) {
        match result {
            Ok(None) => report.deleted.push(id),
            Ok(Some(reason)) => report.already_deleted.push(AlreadyDeleted { id, reason }),
            Err(e) => {
                let error = format!("{:#}", remote.explain(e, Some(&id)));
                report.failed.push(RemoveFailure { id, error });
            }
        }
    }
    if args.json {
        output::json(&report)?;
    } else {
        report.deleted.iter().for_each(|id| println!("{id}"));
        for gone in &report.already_deleted {
            eprintln!("{}", gone.reason);
        }
    }
    match report.failed.as_slice() {
        [] => Ok(()),
        [one] => Err(anyhow::anyhow!("{}", one.error)),
        many => {
            let lines: Vec<String> = many.iter().map(|f| format!("\n  {}", f.error)).collect();
            anyhow::bail!(
                "{} sandboxes were not deleted:{}",
                many.len(),
                lines.concat()
            )
        }
    }
}

/// `tether info`.
#[derive(Debug, Args)]
pub(super) struct InfoArgs {
    /// The sandbox.
    #[arg(value_name = "ID")]
    id: String,
    /// Print as JSON: the sandbox's fields, plus `agent` (null when it did not answer).
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Info<'a> {
    #[serde(flatten)]
    sandbox: &'a SandboxInfo,
    agent: Option<&'a AgentInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_error: Option<String>,
    /// The preview URLs of the ports listening in the sandbox (absent when the agent did
    /// not answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    previews: Option<Previews>,
}

/// How a browser reaches the sandbox's listening ports through the relay.
#[derive(Serialize)]
struct Previews {
    /// The preview token: the `X-Tether-Preview-Token` header, the `tether_preview_token`
    /// query parameter, or the cookie a first visit with the parameter sets.
    token: String,
    /// The URL templates, `{port}` to fill in.
    host_url: String,
    path_url: String,
    /// One per listening port: the host-form and path-form URLs, carrying the token.
    ports: Vec<PortPreview>,
}

#[derive(Serialize)]
struct PortPreview {
    port: u16,
    address: String,
    url: String,
    path_url: String,
}

impl Previews {
    fn new(preview: PreviewInfo, mut listening: Vec<ListeningPort>) -> Previews {
        // A server bound to both IPv4 and IPv6 is listed twice.
        listening.sort_by_key(|p| p.port);
        listening.dedup_by_key(|p| p.port);
        Previews {
            ports: listening
                .into_iter()
                .map(|p| PortPreview {
                    url: preview.url(p.port),
                    path_url: preview.path(p.port),
                    port: p.port,
                    address: p.address,
                })
                .collect(),
            token: preview.token,
            host_url: preview.host_url,
            path_url: preview.path_url,
        }
    }
}

pub(super) async fn info(remote: Remote, args: InfoArgs) -> anyhow::Result<()> {
    let rest = remote.rest()?;
    let agent = async {
        let session = remote.connect(&args.id).await?;
        let (info, ports) = tokio::join!(session.info(), session.ports());
        let explain = |e| remote.explain(e, Some(&args.id));
        anyhow::Ok((info.map_err(explain)?, ports.map_err(explain)?))
    };
    let (sandbox, preview) = tokio::join!(rest.get(&args.id), rest.preview(&args.id));
    let sandbox = sandbox.map_err(|e| remote.explain(e, Some(&args.id)))?;
    // A session would wake a paused or stopped sandbox: looking at it must not.
    let (agent, ports, agent_error) = match sandbox.state.as_str() {
        "paused" | "stopped" => (None, None, None),
        _ => match agent.await {
            Ok((a, ports)) => (Some(a), Some(ports), None),
            Err(e) => (None, None, Some(format!("{e:#}"))),
        },
    };
    let preview = preview.map_err(|e| remote.explain(e, Some(&args.id)))?;
    let info = Info {
        sandbox: &sandbox,
        agent: agent.as_ref(),
        agent_error: agent_error.clone(),
        previews: ports.map(|ports| Previews::new(preview, ports)),
    };
    if args.json {
        output::json(&info)?;
    } else {
        print!("{}", describe(&info, output::now_ms()));
    }
    match agent_error {
        None => Ok(()),
        Some(e) => Err(anyhow::anyhow!("the sandbox's agent did not answer: {e}")),
    }
}

fn describe(info: &Info<'_>, now: i64) -> String {
    let s = info.sandbox;
    let mut rows: Vec<(&str, String)> = vec![
        ("id", s.id.clone()),
        ("provider", format!("{} ({})", s.provider, s.provider_ref)),
        ("state", s.state.clone()),
        ("labels", output::labels(&s.labels)),
        ("image", s.image.clone().unwrap_or_else(|| "-".into())),
        ("created", format!("{} ago", output::age(s.created_ms, now))),
        (
            "last active",
            format!("{} ago", output::age(s.last_active_ms, now)),
        ),
        (
            "expires",
            match s.expires_ms {
                Some(ms) => format!("in {}", output::age(now, ms)),
                None => "never".into(),
            },
        ),
        (
            "idle timeout",
            match s.idle_timeout_secs {
                Some(secs) => humantime::format_duration(Duration::from_secs(secs)).to_string(),
                None => "none".into(),
            },
        ),
    ];
    if let Some(a) = info.agent {
        rows.extend([
            ("agent", a.agent_version.clone()),
            ("os", format!("{} ({})", a.os, a.arch)),
            (
                "user",
                format!("{} (home {}, cwd {})", a.user, a.home, a.cwd),
            ),
            ("hostname", a.hostname.clone()),
            ("cpus", a.cpus.to_string()),
            ("memory", output::bytes(a.memory_bytes)),
        ]);
    }
    rows.push((
        "on idle",
        match s.idle_timeout_secs {
            Some(_) => s.on_idle.as_str().to_string(),
            None => "-".into(),
        },
    ));
    rows.push((
        "auto-resume",
        match s.auto_resume {
            true => "yes: a session or preview resumes or starts it".into(),
            false => "no: `tether resume` or `tether start` only".into(),
        },
    ));
    if let Some(c) = &s.capabilities {
        rows.push((
            "can",
            match (c.pause, c.stop) {
                (true, true) => "pause, resume, stop, start".into(),
                (true, false) => "pause, resume".into(),
                (false, true) => "stop, start".into(),
                (false, false) => "- (its provider can neither pause nor stop)".into(),
            },
        ));
    }
    if let Some(n) = &s.network {
        rows.extend(network_rows(n));
    }
    let longest = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let width = longest.max("preview token".len()) + 2;
    let mut out: String = rows
        .iter()
        .map(|(k, v)| format!("{:<width$}{}\n", format!("{k}:"), escape_str(v)))
        .collect();
    if let Some(p) = &info.previews {
        out.push_str(&format!("{:<width$}", "previews:"));
        if p.ports.is_empty() {
            let example = p.host_url.replace("{port}", "PORT");
            out.push_str(&format!(
                "no port is listening yet; a server on PORT will be at {example}\n"
            ));
        }
        for (i, port) in p.ports.iter().enumerate() {
            let pad = if i == 0 { 0 } else { width };
            out.push_str(&format!(
                "{:pad$}port {} ({})\n",
                "",
                port.port,
                escape_str(&port.address)
            ));
            out.push_str(&format!("{:width$}  {}\n", "", port.url));
            out.push_str(&format!("{:width$}  {}\n", "", port.path_url));
        }
        out.push_str(&format!(
            "{:<width$}{} (the URLs carry it; or send header X-Tether-Preview-Token)\n",
            "preview token:", p.token
        ));
    }
    out
}

/// The sandbox's network, what enforces it and which guarantees hold, one row each.
fn network_rows(n: &NetworkInfo) -> Vec<(&'static str, String)> {
    let mode = serde_json::to_value(n.mode)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut rows = vec![("network", format!("{mode} (enforced by {})", n.enforced_by))];
    let allowed: Vec<&str> = n
        .egress
        .allow_hosts
        .iter()
        .chain(&n.egress.allow_cidrs)
        .map(String::as_str)
        .collect();
    if !allowed.is_empty() {
        rows.push(("allowed", allowed.join(", ")));
    }
    if n.mode == NetworkPolicy::None {
        // What a program inside sees is a failed lookup or an unreachable network, which
        // names nothing: this row is where the reason is written down.
        rows.push((
            "to reach hosts",
            "create the sandbox with --allow-host HOST (or --allow-host @package-registries \
             for PyPI, npm, Debian and crates.io)"
                .into(),
        ));
    }
    for s in &n.secrets {
        rows.push((
            "secret",
            format!("{} (sent to {})", s.name, s.hosts.join(", ")),
        ));
    }
    for (i, g) in n.guarantees.iter().enumerate() {
        rows.push((if i == 0 { "guaranteed" } else { "" }, g.clone()));
    }
    for (i, g) in n.not_guaranteed.iter().enumerate() {
        rows.push((if i == 0 { "not guaranteed" } else { "" }, g.clone()));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_guarantees_are_listed_and_secret_values_are_not_there_to_list() {
        let n: NetworkInfo = serde_json::from_value(serde_json::json!({
            "mode": "allowlist",
            "egress": {"allow_hosts": ["*.pypi.org"], "allow_cidrs": ["10.1.0.0/16"]},
            "secrets": [{"name": "OPENAI_API_KEY", "hosts": ["api.openai.com"]}],
            "enforced_by": "e2b",
            "guarantees": ["one", "two"],
            "not_guaranteed": ["three"],
        }))
        .unwrap();
        let rows = network_rows(&n);
        assert_eq!(rows[0], ("network", "allowlist (enforced by e2b)".into()));
        assert!(rows.contains(&("allowed", "*.pypi.org, 10.1.0.0/16".into())));
        assert!(rows.contains(&("secret", "OPENAI_API_KEY (sent to api.openai.com)".into())));
        assert!(rows.contains(&("guaranteed", "one".into())));
        assert!(rows.contains(&("", "two".into())));
        assert!(rows.contains(&("not guaranteed", "three".into())));
    }

    #[test]
    fn a_sandbox_without_network_says_how_to_get_some() {
        let n: NetworkInfo = serde_json::from_value(serde_json::json!({
            "mode": "none", "enforced_by": "relay", "guarantees": ["loopback only"],
        }))
        .unwrap();
        let rows = network_rows(&n);
        let hint = rows.iter().find(|(k, _)| *k == "to reach hosts").unwrap();
        assert!(
            hint.1.contains("--allow-host @package-registries"),
            "{hint:?}"
        );
    }

    #[derive(clap::Parser)]
    struct Create {
        #[command(flatten)]
        spec: CreateArgs,
    }

    #[test]
    fn disk_quotas_reach_the_request() {
        use clap::Parser;
        let req = |args: &[&str]| {
            let all = std::iter::once("create").chain(args.iter().copied());
            Create::try_parse_from(all).map(|c| c.spec.request().unwrap().spec.disk_bytes)
        };
        assert_eq!(req(&["--disk", "2G"]).unwrap(), Some(2 << 30));
        assert_eq!(req(&[]).unwrap(), None);
        assert!(req(&["--disk", "lots"]).is_err());
    }

    #[test]
    fn local_images_become_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let abs = dir.path().canonicalize().unwrap();
        assert_eq!(
            image(dir.path().to_str().unwrap()).unwrap(),
            abs.display().to_string()
        );
        let oci = format!("oci:{}", dir.path().display());
        assert_eq!(image(&oci).unwrap(), format!("oci:{}", abs.display()));
        assert_eq!(image("ubuntu:24.04").unwrap(), "ubuntu:24.04");
    }
}
