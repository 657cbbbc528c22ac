//! The templates themselves, as data: for each name, the Debian packages, the pinned wheels
//! from PyPI, the user, the working directory and the environment. Everything a template build
//! does follows from its [`Spec`], and the spec's digest ([`Spec::digest`]) names the inputs
//! Tether controls: two builds of the same spec from the same archive state give the same
//! image.

use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// The Debian release every template is built from: Debian 12, which the wheels below are
/// built for (CPython 3.11, glibc 2.36).
pub(crate) const SUITE: &str = "bookworm";

/// The Debian archive templates are built from unless `--mirror` says otherwise: both archives
/// (`debian` and `debian-security`) are below it.
pub(crate) const DEFAULT_MIRROR: &str = "http://deb.debian.org";

/// Every timestamp a template build records (file times, the user's password change date, the
/// image's `created`) when `SOURCE_DATE_EPOCH` is not set: 2026-01-01T00:00:00Z. Not 0, which
/// shadow reads as "the password must be changed now".
pub(crate) const DEFAULT_EPOCH: u64 = 1_767_225_600;

/// The sandbox user, as E2B's templates have it.
const USER: &str = "user";
/// Its uid and gid (the first a Debian `useradd` gives).
const UID: u32 = 1000;
/// Its home, which is also the working directory.
const HOME: &str = "/home/user";

/// What `base` holds: E2B's `base` template's tools, from Debian.
const BASE_DEBIAN: &[&str] = &[
    // Python: `python` and `pip` as E2B users call them, and venvs.
    "python3",
    "python-is-python3",
    "python3-pip",
    "python3-venv",
    // Node.
    "nodejs",
    "npm",
    // The common tools.
    "bash",
    "bzip2",
    "ca-certificates",
    "curl",
    "file",
    "git",
    "jq",
    "less",
    "openssh-client",
    "procps",
    "unzip",
    "wget",
    "xz-utils",
    "zip",
];

/// A wheel from PyPI: pinned by version and by the SHA-256 of the one file pip may take
/// (CPython 3.11, manylinux x86_64, or pure Python).
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct Wheel {
    /// The project's name on PyPI.
    pub name: &'static str,
    /// The exact version.
    pub version: &'static str,
    /// The wheel's SHA-256, lowercase hex.
    pub sha256: &'static str,
}

const fn wheel(name: &'static str, version: &'static str, sha256: &'static str) -> Wheel {
    Wheel {
        name,
        version,
        sha256,
    }
}

/// What `data-science` adds: numpy, pandas, matplotlib, scipy and scikit-learn, and the whole
/// closure of their dependencies (installed with `--no-deps`, so nothing unpinned slips in).
#[rustfmt::skip]
const DATA_SCIENCE_WHEELS: &[Wheel] = &[
    wheel("cloudpickle", "3.1.3", "1654f4f18e416447210a63c5c25a135d65a292156aa5fa519dfa4baf7726dddb"),
    wheel("contourpy", "1.3.3", "51e79c1f7470158e838808d4a996fa9bac72c498e93d8ebe5119bc1e6becb0db"),
    wheel("cycler", "0.12.1", "85cef7cff222d8644161529808465972e51340599459b8ac3ccbac5a854e0d30"),
    wheel("fonttools", "4.68.0", "4b9c89b5876f1a74b1341632dfaf4c4c2be565d76c060445df401ebe7a4ceefa"),
    wheel("joblib", "1.6.0", "3dbbf9f6e4b592a2357b854608e980fe6390d131d7a82f011a377ef2ebef7aba"),
    wheel("kiwisolver", "1.5.1", "95a02752aa032eef4aed01cda6d9b687c669bd0396bf4519eef8bba22a286720"),
    wheel("matplotlib", "3.11.2", "07d9b9fa60cd4c393692f50d0bb03123242ddf61c99bb0e95e75feb354e7c1a8"),
    wheel("narwhals", "2.29.0", "1c69b3dc30240f6e848c5a673cafc86affa44184ecce721e25b7194663ad10dc"),
    wheel("numpy", "2.4.6", "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93"),
    wheel("packaging", "26.4", "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2"),
    wheel("pandas", "3.1.1", "4f1602f614bb83f443381dbcbb94c4ac764b2e50c8d6c965614c5cd83e328c47"),
    wheel("pillow", "13.0.0", "a625df9a2a5597fa5e5266e01aefc82604bb85d291e3547981e863560d75da6c"),
    wheel("pyparsing", "3.3.3", "ece8c00a69cf01b45d0b1dedabb469c90d8caf996d4fda40f147627a122849a4"),
    wheel("python-dateutil", "4.0.0", "a5e246f79eb80475e691bf93862cead98decd8a498cf53ba0516fcdc0f50dc1c"),
    wheel("scikit-learn", "1.9.1", "52a0703bbc07ad27f560fa63fa68e4c54dd735bfbbf65b4dd3c225dc7547b6df"),
    wheel("scipy", "1.17.1", "43af8d1f3bea642559019edfe64e9b11192a8978efbd1539d7bc2aaa23d92de4"),
    wheel("threadpoolctl", "3.8.0", "f1b49c82704d50f13ffae019c727b0fa4f6791a58f48f06a09c45face1be66da"),
    wheel("tzdata", "2026.6", "0a10eec6e13ef16b627fabed9a5f2ba61a62b1c67f327305f4e7e412a70b4aec"),
];

/// One template: everything its build installs and sets.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Spec {
    /// Its name, as `--template` takes it.
    pub name: &'static str,
    /// One line for listings.
    pub about: &'static str,
    /// The Debian release.
    pub suite: &'static str,
    /// Debian packages (recommended ones are not installed).
    pub debian: Vec<&'static str>,
    /// Wheels installed system-wide (under /usr/local) as root.
    pub wheels: Vec<Wheel>,
    /// The user commands run as, with its home.
    pub user: &'static str,
    /// The user's uid, which is also its group's gid.
    pub uid: u32,
    /// The working directory: the user's home.
    pub workdir: &'static str,
    /// The image's environment.
    pub env: Vec<(&'static str, &'static str)>,
}

/// Every template, in the order listings show them.
pub(crate) fn all() -> Vec<Spec> {
    let base = Spec {
        name: "base",
        about: "Debian 12 with Python 3 (python, pip, venv), Node (node, npm), git and the \
                common tools; user `user` in /home/user",
        suite: SUITE,
        debian: BASE_DEBIAN.to_vec(),
        wheels: Vec::new(),
        user: USER,
        uid: UID,
        workdir: HOME,
        env: vec![
            // pip's user installs (`pip install x` as `user`) land in ~/.local/bin.
            (
                "PATH",
                "/home/user/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
            ("LANG", "C.UTF-8"),
            ("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        ],
    };
    let data_science = Spec {
        name: "data-science",
        about: "base with numpy, pandas, matplotlib, scipy and scikit-learn (pinned wheels from \
                PyPI)",
        wheels: DATA_SCIENCE_WHEELS.to_vec(),
        ..base.clone()
    };
    vec![base, data_science]
}

/// The template called `name`.
pub(crate) fn find(name: &str) -> Option<Spec> {
    all().into_iter().find(|s| s.name == name)
}

/// The names of every template, for messages: `base, data-science`.
pub(crate) fn names() -> String {
    all().iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

impl Spec {
    /// `sha256:HEX` of the spec (its JSON form) and of the build's own script version: what a
    /// cache of built templates is keyed by.
    pub(crate) fn digest(&self) -> String {
        let json = serde_json::to_vec(&(self, super::rootfs::RECIPE_VERSION))
            .expect("plain data serializes");
        format!("sha256:{}", hex::encode(Sha256::digest(json)))
    }

    /// The wheels as a pip requirements file with hashes (`--require-hashes`).
    pub(crate) fn requirements(&self) -> String {
        self.wheels
            .iter()
            .map(|w| format!("{}=={} --hash=sha256:{}\n", w.name, w.version, w.sha256))
            .collect()
    }

    /// The image's settings: its environment, working directory and user.
    pub(crate) fn overrides(&self) -> tether_oci::config::Overrides {
        tether_oci::config::Overrides {
            env: self
                .env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            workdir: Some(self.workdir.to_string()),
            user: Some(self.user.to_string()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_digests_differ() {
        let all = all();
        let mut names: Vec<_> = all.iter().map(|s| s.name).collect();
        names.dedup();
        assert_eq!(names, ["base", "data-science"]);
        assert_ne!(all[0].digest(), all[1].digest());
        assert_eq!(all[0].digest(), find("base").unwrap().digest());
    }

    #[test]
    fn every_wheel_is_pinned_with_a_full_hash() {
        for spec in all() {
            for w in &spec.wheels {
                assert_eq!(w.sha256.len(), 64, "{}", w.name);
                assert!(
                    w.sha256.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{}",
                    w.name
                );
                assert!(!w.version.is_empty(), "{}", w.name);
            }
        }
        let req = find("data-science").unwrap().requirements();
        assert!(
            req.contains("pandas==3.1.1 --hash=sha256:4f1602f6"),
            "{req}"
        );
    }
}
