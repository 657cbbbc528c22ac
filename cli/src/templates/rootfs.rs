//! A template's root filesystem, built from the Debian archive and PyPI by `mmdebstrap`
//! (Debian's reproducible bootstrapper, installed with apt when missing): the minbase
//! variant with the spec's packages (no recommends, no documentation but the copyright
//! files), then, inside the new root, the user, the wheels and the record of what was
//! installed ([`RECORD`]). `SOURCE_DATE_EPOCH` is set for every step, so dpkg, shadow and
//! Python's byte-compilation write no clock time, and mmdebstrap removes what differs between
//! runs (apt's lists and caches, logs, the machine id).
//!
//! mmdebstrap runs in a mount namespace of its own: the `/proc`, `/sys` and `/dev` it mounts
//! into the new root vanish with it even when it is killed, so removing a failed build's
//! directory can never reach into the host's devices.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use super::spec::Spec;

/// The version of the recipe below: part of every spec's digest, so a change to how templates
/// are built invalidates caches keyed by it.
pub(crate) const RECIPE_VERSION: u32 = 3;
/// Where an image built from a template records its name, spec digest, and every Debian
/// package and Python distribution in it with its version.
pub(crate) const RECORD: &str = "/etc/tether-template";
/// The bootstrapper, and the Debian package that holds it.
const MMDEBSTRAP: &str = "mmdebstrap";
/// How many of the build's last output lines a failure shows.
const TAIL_LINES: usize = 25;
/// Where the requirements file goes inside the new root while pip runs.
const REQUIREMENTS_IN_ROOT: &str = "/tmp/tether-requirements.txt";
/// Where the host's CA bundle goes inside the new root while pip runs: pip there trusts what
/// this machine trusts (a TLS-inspecting proxy's CA, say), and the image keeps its own.
const HOST_CA_IN_ROOT: &str = "/tmp/tether-host-ca.pem";
/// The CA bundle of a Debian host, when no variable names another.
const DEBIAN_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The variables that may name the host's CA bundle, in the order pip's own settings win.
const CA_VARS: &[&str] = &["PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"];
/// The only variables of this process the build sees: proxies, and PyPI's index (the wheels'
/// hashes hold whatever serves them). Nothing else of the host's environment (its pip
/// settings, say) may change what goes into a template.
const PASSED_VARS: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
];
/// The build's PATH.
const BUILD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why a template's root filesystem could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RootfsError {
    /// Installing packages into a new root needs root.
    #[error(
        "building a template needs root: it installs Debian packages into a new root file \
         system (run `sudo tether image build --template {0}`)"
    )]
    NotRoot(String),
    /// mmdebstrap is missing and could not be installed.
    #[error(
        "mmdebstrap is needed to build templates and could not be installed ({0}); install it \
         with `apt-get install mmdebstrap` (Debian and Ubuntu)"
    )]
    NoBootstrapper(String),
    /// The build ran and failed.
    #[error(
        "building the {template} template failed: mmdebstrap exited with {status} (is {mirror} \
         reachable, and PyPI for the wheels?); its last lines:\n{tail}"
    )]
    Failed {
        /// The template.
        template: String,
        /// The archive it was built from.
        mirror: String,
        /// How mmdebstrap ended.
        status: std::process::ExitStatus,
        /// Its last lines of output.
        tail: String,
    },
    /// A file of the build could not be written or a program not started.
    #[error("{what}: {error}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        error: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> RootfsError {
    let what = what.into();
    move |error| RootfsError::Io { what, error }
}

/// Builds `spec`'s root filesystem in `dir` (which must not exist yet) from the archives
/// below `mirror`, every time `epoch`. `scratch` holds the build's own files. Each line of
/// the build's output is passed to `progress`.
pub(crate) fn build(
    spec: &Spec,
    mirror: &str,
    epoch: u64,
    dir: &Path,
    scratch: &Path,
    progress: &dyn Fn(&str),
) -> Result<(), RootfsError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(RootfsError::NotRoot(spec.name.to_string()));
    }
    ensure_mmdebstrap(progress)?;
    let requirements = scratch.join("requirements.txt");
    std::fs::write(&requirements, spec.requirements())
        .map_err(io(format!("writing {}", requirements.display())))?;
    let ca = host_ca_bundle();
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", MMDEBSTRAP])
        .args(mmdebstrap_args(
            spec,
            mirror,
            &requirements,
            ca.as_deref(),
            dir,
        ))
        .env_clear()
        .envs(
            PASSED_VARS
                .iter()
                .filter_map(|v| Some((v, std::env::var_os(v)?))),
        )
        .env("PATH", BUILD_PATH)
        .env(tether_oci::constants::SOURCE_DATE_EPOCH, epoch.to_string())
        .env("DEBIAN_FRONTEND", "noninteractive")
        .env("LANG", "C.UTF-8")
        .env("HOME", "/root")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1");
    let (status, tail) = run_logged(cmd, progress)?;
    if !status.success() {
        return Err(RootfsError::Failed {
            template: spec.name.to_string(),
            mirror: mirror.to_string(),
            status,
            tail,
        });
    }
    Ok(())
}

/// The CA bundle this machine's TLS clients trust, if there is one.
fn host_ca_bundle() -> Option<std::path::PathBuf> {
    CA_VARS
        .iter()
        .filter_map(std::env::var_os)
        .map(std::path::PathBuf::from)
        .chain([std::path::PathBuf::from(DEBIAN_CA_BUNDLE)])
        .find(|p| p.is_file())
}

/// mmdebstrap's arguments for `spec`, in the order they apply; `ca` is the host's CA bundle
/// for pip.
fn mmdebstrap_args(
    spec: &Spec,
    mirror: &str,
    requirements: &Path,
    ca: Option<&Path>,
    dir: &Path,
) -> Vec<String> {
    let mirror = mirror.trim_end_matches('/');
    let suite = spec.suite;
    let mut args: Vec<String> = vec![
        "--mode=root".into(),
        "--variant=minbase".into(),
        "--format=directory".into(),
        format!("--include={}", spec.debian.join(",")),
        "--aptopt=APT::Install-Recommends \"false\"".into(),
        "--dpkgopt=path-exclude=/usr/share/man/*".into(),
        "--dpkgopt=path-exclude=/usr/share/doc/*".into(),
        "--dpkgopt=path-include=/usr/share/doc/*/copyright".into(),
        // A root thrown away on failure needs no fsync after every file.
        "--dpkgopt=force-unsafe-io".into(),
    ];
    let mut hook = |h: String| args.push(format!("--customize-hook={h}"));
    hook(format!(
        "chroot \"$1\" useradd --create-home --shell /bin/bash --uid {uid} --user-group {user}",
        uid = spec.uid,
        user = spec.user
    ));
    // pip as the sandbox user installs to ~/.local (site-packages is root's), as it does on
    // E2B; Debian's marker would refuse it with "externally-managed-environment".
    hook("rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED".into());
    if !spec.wheels.is_empty() {
        hook(format!(
            "upload {} {REQUIREMENTS_IN_ROOT}",
            requirements.display()
        ));
        let cert = match ca {
            Some(ca) => {
                hook(format!("upload {} {HOST_CA_IN_ROOT}", ca.display()));
                format!(" --cert {HOST_CA_IN_ROOT}")
            }
            None => String::new(),
        };
        hook(format!(
            "chroot \"$1\" python3 -m pip install --no-cache-dir --no-deps --only-binary=:all: \
             --require-hashes --root-user-action=ignore{cert} -r {REQUIREMENTS_IN_ROOT}"
        ));
    }
    hook(format!(
        "{{ echo '# What this image was built from: tether image build --template {name}'; \
         echo 'template {name}'; echo 'spec {digest}'; echo 'suite {suite} {mirror}'; \
         chroot \"$1\" dpkg-query -W -f='deb ${{Package}} ${{Version}}\\n'; \
         chroot \"$1\" python3 -m pip list --format=freeze | sed 's/^/pip /'; \
         }} > \"$1\"{RECORD}",
        name = spec.name,
        digest = spec.digest(),
    ));
    // mmdebstrap leaves the host's resolv.conf and hostname in the root: they are this
    // machine's, not the image's (a sandbox's runtime provides its own). apt's binary caches
    // are rebuilt on demand and differ from build to build (two builds of base an hour apart
    // differed in these two files only).
    hook(
        "rm -rf \"$1\"/root/.cache \"$1\"/tmp/* \"$1\"/var/tmp/* \"$1\"/etc/resolv.conf \
         \"$1\"/etc/hostname \"$1\"/var/cache/apt/pkgcache.bin \"$1\"/var/cache/apt/srcpkgcache.bin"
            .into(),
    );
    args.push(suite.into());
    args.push(dir.display().to_string());
    args.push(format!("deb {mirror}/debian {suite} main"));
    args.push(format!("deb {mirror}/debian {suite}-updates main"));
    args.push(format!(
        "deb {mirror}/debian-security {suite}-security main"
    ));
    args
}

/// Installs mmdebstrap with apt when it is missing.
fn ensure_mmdebstrap(progress: &dyn Fn(&str)) -> Result<(), RootfsError> {
    let found = Command::new(MMDEBSTRAP)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Ok(());
    }
    progress("installing mmdebstrap (apt-get install mmdebstrap)");
    let mut cmd = Command::new("apt-get");
    cmd.args(["install", "-y", "-q", "--no-install-recommends", MMDEBSTRAP])
        .env("DEBIAN_FRONTEND", "noninteractive");
    let (status, tail) =
        run_logged(cmd, progress).map_err(|e| RootfsError::NoBootstrapper(e.to_string()))?;
    if !status.success() {
        return Err(RootfsError::NoBootstrapper(format!(
            "apt-get exited with {status}: {}",
            tail.lines().last().unwrap_or_default()
        )));
    }
    Ok(())
}

/// Runs `cmd` with its stdout and stderr in one pipe, each line passed to `progress`; its exit
/// status and its last [`TAIL_LINES`] lines.
fn run_logged(
    mut cmd: Command,
    progress: &dyn Fn(&str),
) -> Result<(std::process::ExitStatus, String), RootfsError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (reader, writer) = std::io::pipe().map_err(io("creating a pipe"))?;
    let writer2 = writer.try_clone().map_err(io("creating a pipe"))?;
    cmd.stdin(Stdio::null()).stdout(writer).stderr(writer2);
    let mut child = cmd.spawn().map_err(io(format!("starting {program}")))?;
    // The parent's copies of the write end went into `cmd`: drop it so the pipe ends with
    // the child.
    drop(cmd);
    let mut tail = VecDeque::with_capacity(TAIL_LINES);
    for line in BufReader::new(reader).lines() {
        let Ok(line) = line else { break };
        progress(line.trim_end());
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    let status = child.wait().map_err(io(format!("waiting for {program}")))?;
    Ok((status, Vec::from(tail).join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arguments_install_the_spec() {
        let spec = super::super::spec::find("data-science").unwrap();
        let args = mmdebstrap_args(
            &spec,
            "http://mirror.example/",
            Path::new("/s/req.txt"),
            Some(Path::new("/etc/ca.pem")),
            Path::new("/s/root"),
        );
        let inc = args.iter().find(|a| a.starts_with("--include=")).unwrap();
        assert!(
            inc.contains("python-is-python3") && inc.contains(",npm"),
            "{inc}"
        );
        let hooks: Vec<_> = args
            .iter()
            .filter(|a| a.starts_with("--customize-hook="))
            .collect();
        assert!(hooks[0].contains("useradd") && hooks[0].contains("--uid 1000"));
        assert!(hooks
            .iter()
            .any(|h| h.contains("upload /s/req.txt /tmp/tether-requirements.txt")));
        assert!(hooks
            .iter()
            .any(|h| h.contains("upload /etc/ca.pem /tmp/tether-host-ca.pem")));
        assert!(hooks.iter().any(
            |h| h.contains("--require-hashes") && h.contains("--cert /tmp/tether-host-ca.pem")
        ));
        assert!(hooks
            .iter()
            .any(|h| h.contains("> \"$1\"/etc/tether-template")));
        let tail = &args[args.len() - 5..];
        assert_eq!(tail[0], "bookworm");
        assert_eq!(tail[1], "/s/root");
        assert_eq!(tail[2], "deb http://mirror.example/debian bookworm main");
        assert_eq!(
            tail[4],
            "deb http://mirror.example/debian-security bookworm-security main"
        );
        let base = super::super::spec::find("base").unwrap();
        let args = mmdebstrap_args(&base, "http://m", Path::new("/r"), None, Path::new("/d"));
        assert!(!args.iter().any(|a| a.contains("pip install")));
    }
}
