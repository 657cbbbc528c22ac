//! Checking a create request against what the local provider can do, and turning it into a
//! plan: a valid id, the root file system to use, cgroup limits and the agent's environment.
//! Everything a user can get wrong is refused here, before anything is made on the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::constants::{
    AGENT_TOKEN_ENV, CPU_PERIOD, DEFAULT_PIDS_MAX, MAX_ID_LEN, MIN_CPU_QUOTA, MIN_MEMORY_BYTES,
    PID_MAX_FILE, SANDBOX_PATH,
};
use super::error::LocalError;
use tether_oci::PreparedImage;
use tether_relay_core::provider::SandboxSpec;

/// What a sandbox's `/` is made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Rootfs {
    /// A fresh tmpfs with the host's system directories bound read-only.
    Host,
    /// An overlay whose read-only lower layer is this directory (canonical path).
    Image(PathBuf),
}

/// A sandbox's cgroup limits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Limits {
    /// Memory (swap is held to zero on top of it), or unlimited.
    pub memory_bytes: Option<u64>,
    /// CPU time per [`CPU_PERIOD`], or unlimited.
    pub cpu_quota: Option<Duration>,
    /// Processes and threads.
    pub pids_max: u64,
}

/// Refuses ids that cannot be a directory name, a cgroup name and a hostname at once.
pub(super) fn check_id(id: &str) -> Result<(), LocalError> {
    let charset = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && charset
        && !id.starts_with('.')
        && !id.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(LocalError::BadId(id.to_string()))
    }
}

/// The root file system the spec asks for. A host directory must come resolved (the relay's
/// policy resolves it once, checks it and passes the result on): a path that no longer
/// resolves to itself had a symlink planted in it since, and is refused rather than followed.
pub(super) fn rootfs(spec: &SandboxSpec) -> Result<Rootfs, LocalError> {
    let Some(image) = spec.image.as_deref() else {
        return Ok(Rootfs::Host);
    };
    let bad = |why: &str| LocalError::BadSpec(format!("image {image:?} {why}"));
    if !image.starts_with('/') {
        return Err(bad(
            "must be an absolute path to a root file system directory, or oci:PATH",
        ));
    }
    let rootfs = image_dir(image, Path::new(image))?;
    // Compared as text: `Path` equality would let a trailing `/` or `.` through.
    if !matches!(&rootfs, Rootfs::Image(dir) if dir.as_os_str() == std::ffi::OsStr::new(image)) {
        return Err(bad(
            "is not a resolved path (it has a symlink, `.` or `..` in it); pass the directory's \
             real path",
        ));
    }
    Ok(rootfs)
}

/// The root file system directory `dir` of the image `image` (a directory, or an unpacked
/// OCI image), checked for use as an overlay's lower layer.
pub(super) fn image_dir(image: &str, dir: &Path) -> Result<Rootfs, LocalError> {
    let bad = |why: &str| LocalError::BadSpec(format!("image {image:?} {why}"));
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| bad(&format!("cannot be used as a root file system: {e}")))?;
    if !dir.is_dir() {
        return Err(bad("is not a directory; pass a root file system directory"));
    }
    // overlayfs takes its layers as a comma- and colon-separated option string.
    if dir.to_string_lossy().contains([',', ':', '\\']) {
        return Err(bad(
            "has ',', ':' or '\\' in its path, which overlayfs cannot take; move or \
                        link it to a plain path",
        ));
    }
    Ok(Rootfs::Image(dir))
}

/// The cgroup limits the spec asks for, with defaults filled in.
pub(super) fn limits(spec: &SandboxSpec) -> Result<Limits, LocalError> {
    let memory_bytes = match spec.memory_bytes {
        Some(m) if m < MIN_MEMORY_BYTES => {
            return Err(LocalError::BadSpec(format!(
                "memory limit {m} bytes is below the local provider's minimum of {} MiB",
                MIN_MEMORY_BYTES >> 20
            )))
        }
        m => m,
    };
    let cpu_quota = match spec.cpus {
        None => None,
        Some(c) if c.is_finite() && c > 0.0 && c <= 1e6 => {
            Some(CPU_PERIOD.mul_f64(c).max(MIN_CPU_QUOTA))
        }
        Some(c) => {
            return Err(LocalError::BadSpec(format!(
                "cpu limit {c} is not a positive number of cores"
            )))
        }
    };
    let pids_max = match spec.pids {
        None => DEFAULT_PIDS_MAX,
        Some(0) => {
            return Err(LocalError::BadSpec(
                "process limit 0 leaves no room for the agent; ask for at least 1".into(),
            ))
        }
        Some(p) => match host_pid_max() {
            Some(max) if p > max => {
                return Err(LocalError::BadSpec(format!(
                    "process limit {p} is above this host's maximum number of processes \
                     ({PID_MAX_FILE}); ask for 1 to {max}"
                )))
            }
            _ => p,
        },
    };
    Ok(Limits {
        memory_bytes,
        cpu_quota,
        pids_max,
    })
}

/// The host's largest process id, the most processes a sandbox could ever have.
fn host_pid_max() -> Option<u64> {
    std::fs::read_to_string(PID_MAX_FILE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The agent's environment as `KEY=VALUE` strings: a clean base (HOME is `home`), then the
/// image's variables (`KEY=VALUE` entries of an OCI image's config), then the spec's, then
/// the agent token (which neither may set).
pub(super) fn environment(
    id: &str,
    agent_token: &str,
    spec: &SandboxSpec,
    image_env: &[String],
    home: &str,
) -> Result<Vec<String>, LocalError> {
    let mut env: BTreeMap<&str, &str> = BTreeMap::from([
        ("PATH", SANDBOX_PATH),
        ("HOME", home),
        ("LANG", "C.UTF-8"),
        ("TERM", "xterm-256color"),
        ("HOSTNAME", id),
    ]);
    for (key, value) in image_env.iter().filter_map(|e| e.split_once('=')) {
        if !key.is_empty() && key != AGENT_TOKEN_ENV && !key.contains('\0') && !value.contains('\0')
        {
            env.insert(key, value);
        }
    }
    for (key, value) in &spec.env {
        if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
            return Err(LocalError::BadSpec(format!(
                "environment variable {key:?} is invalid: names must be non-empty without '=' \
                 or NUL, and values without NUL"
            )));
        }
        if key == AGENT_TOKEN_ENV {
            return Err(LocalError::BadSpec(format!(
                "environment variable {AGENT_TOKEN_ENV} is reserved for the relay"
            )));
        }
        env.insert(key, value);
    }
    env.insert(AGENT_TOKEN_ENV, agent_token);
    Ok(env.into_iter().map(|(k, v)| format!("{k}={v}")).collect())
}

/// The agent arguments that apply an image's run settings: its working directory (absolute
/// ones only: a relative one has nothing to be relative to) and its user, whom commands run
/// as unless they name another (the agent itself stays root, as PID 1 must).
pub(super) fn image_agent_args(image: &PreparedImage) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(dir) = image.config.working_dir.as_deref() {
        if dir.starts_with('/') {
            args.extend(["--workdir".to_string(), dir.to_string()]);
        }
    }
    if let Some(user) = image.config.user.as_deref() {
        if !user.is_empty() && !matches!(user, "root" | "0" | "0:0" | "root:root") {
            args.extend(["--user".to_string(), user.to_string()]);
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_hostname_and_path_safe() {
        for good in ["sb-3f9a2c", "a", "A_b.c-9", &"x".repeat(63)] {
            assert!(check_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            ".",
            "..",
            "-x",
            ".hidden",
            "a/b",
            "a b",
            "é",
            &"x".repeat(64),
        ] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn image_work_dirs_and_users_become_agent_arguments() {
        let mut image = PreparedImage {
            digest: tether_oci::digest::Digest::of(b""),
            rootfs: PathBuf::from("/cache/rootfs"),
            config: Default::default(),
            unpacked: false,
        };
        assert!(image_agent_args(&image).is_empty());
        image.config.working_dir = Some("/srv/app".into());
        image.config.user = Some("1000:1000".into());
        assert_eq!(
            image_agent_args(&image),
            ["--workdir", "/srv/app", "--user", "1000:1000"]
        );
        image.config.working_dir = Some("relative".into());
        image.config.user = Some("root".into());
        assert!(image_agent_args(&image).is_empty());
    }

    #[test]
    fn image_environments_sit_under_the_specs() {
        let mut spec = SandboxSpec::default();
        spec.env.insert("FOO".into(), "spec".into());
        let image = [
            "PATH=/opt/bin".to_string(),
            "FOO=image".into(),
            "TETHER_AGENT_TOKEN=x".into(),
        ];
        let env = environment("sb-1", "tok", &spec, &image, "/root").unwrap();
        assert!(env.contains(&"PATH=/opt/bin".to_string()));
        assert!(env.contains(&"FOO=spec".to_string()));
        assert!(env.contains(&"TETHER_AGENT_TOKEN=tok".to_string()));
    }

    #[test]
    fn images_must_be_existing_directories() {
        let spec = |s: &str| SandboxSpec {
            image: Some(s.into()),
            ..Default::default()
        };
        assert!(rootfs(&spec("relative/dir")).is_err());
        assert!(rootfs(&spec("/nonexistent/tether-image")).is_err());
        assert!(rootfs(&spec("/proc/self/status")).is_err());
        assert_eq!(rootfs(&spec("/")).unwrap(), Rootfs::Image("/".into()));
        // Paths that are not their own resolution are refused, not followed.
        let tmp = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(real.join("dir")).unwrap();
        std::os::unix::fs::symlink(real.join("dir"), real.join("link")).unwrap();
        let ok = real.join("dir").display().to_string();
        assert_eq!(
            rootfs(&spec(&ok)).unwrap(),
            Rootfs::Image(ok.clone().into())
        );
        for bad in [
            real.join("link").display().to_string(),
            format!("{}/dir/../dir", real.display()),
            format!("{ok}/"),
        ] {
            let err = rootfs(&spec(&bad)).unwrap_err().to_string();
            assert!(err.contains("not a resolved path"), "{bad}: {err}");
        }
        assert_eq!(rootfs(&SandboxSpec::default()).unwrap(), Rootfs::Host);
    }

    #[test]
    fn limits_have_defaults_and_bounds() {
        let l = limits(&SandboxSpec::default()).unwrap();
        assert_eq!(
            l,
            Limits {
                memory_bytes: None,
                cpu_quota: None,
                pids_max: DEFAULT_PIDS_MAX
            }
        );

        let spec = SandboxSpec {
            cpus: Some(1.5),
            memory_bytes: Some(1 << 30),
            pids: Some(64),
            ..Default::default()
        };
        let l = limits(&spec).unwrap();
        assert_eq!(l.cpu_quota, Some(Duration::from_millis(150)));
        assert_eq!(l.memory_bytes, Some(1 << 30));
        assert_eq!(l.pids_max, 64);

        let tiny = SandboxSpec {
            cpus: Some(0.0001),
            ..Default::default()
        };
        assert_eq!(limits(&tiny).unwrap().cpu_quota, Some(MIN_CPU_QUOTA));

        for bad in [
            SandboxSpec {
                cpus: Some(0.0),
                ..Default::default()
            },
            SandboxSpec {
                cpus: Some(f64::NAN),
                ..Default::default()
            },
            SandboxSpec {
                memory_bytes: Some(1024),
                ..Default::default()
            },
            SandboxSpec {
                pids: Some(0),
                ..Default::default()
            },
            SandboxSpec {
                pids: Some(host_pid_max().unwrap() + 1),
                ..Default::default()
            },
        ] {
            assert!(limits(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn environment_is_clean_overridable_and_keeps_the_token_last() {
        let mut spec = SandboxSpec::default();
        spec.env.insert("PATH".into(), "/opt/bin".into());
        spec.env.insert("FOO".into(), "bar=baz".into());
        let env = environment("sb-1", "tok", &spec, &[], "/tmp/home").unwrap();
        assert!(env.contains(&"PATH=/opt/bin".to_string()));
        assert!(env.contains(&"FOO=bar=baz".to_string()));
        assert!(env.contains(&"HOSTNAME=sb-1".to_string()));
        assert!(env.contains(&"TETHER_AGENT_TOKEN=tok".to_string()));
        assert!(env.contains(&"HOME=/tmp/home".to_string()));
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);

        spec.env.insert(AGENT_TOKEN_ENV.into(), "mine".into());
        assert!(environment("sb-1", "tok", &spec, &[], "/tmp/home").is_err());
        let mut spec = SandboxSpec::default();
        spec.env.insert("A=B".into(), "x".into());
        assert!(environment("sb-1", "tok", &spec, &[], "/tmp/home").is_err());
    }
}
