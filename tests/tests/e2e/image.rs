//! `tether image`: images built from Debian's static busybox plus the static agent, checked
//! with real tools. skopeo and umoci read the layout; a real registry (Debian's
//! docker-registry) takes the push and skopeo pulls back the same digest; podman runs the
//! image and the agent inside answers a client; the local provider runs it as a sandbox.
//! Builds are reproducible, and broken bases fail before anything is written.
//!
//! Needs the Debian packages skopeo, umoci, podman, runc, docker-registry and busybox-static,
//! and the static agent (`cargo build --release --target x86_64-unknown-linux-musl -p
//! tether-agent`, which these tests run when it is missing).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use tether_client::Session;
use tether_e2e::images::{
    build, busybox_image, image_cmd, run_ok, static_agent, tool, RegistryServer, READY_TIMEOUT,
};
use tether_e2e::{bin, token, Relay};
use tether_proto::op::ExecSpec;

#[test]
fn building_twice_gives_the_same_digest() {
    let built = busybox_image();
    assert!(built.digest.starts_with("sha256:"), "{}", built.digest);
    let root = built.dir.path().join("busybox-root");
    let again = built.dir.path().join("again");
    assert_eq!(build(&root, &again, &[]), built.digest);

    // A tarball holds the same image, and its bytes are reproducible too.
    let tar_a = built.dir.path().join("a.tar");
    let tar_b = built.dir.path().join("b.tar");
    assert_eq!(build(&root, &tar_a, &[]), built.digest);
    assert_eq!(build(&root, &tar_b, &[]), built.digest);
    assert_eq!(
        std::fs::read(&tar_a).unwrap(),
        std::fs::read(&tar_b).unwrap()
    );

    // Built on the image (not the directory), the base's layers are kept as they are.
    let on_image = built.dir.path().join("on-image");
    let layered = build(&built.layout, &on_image, &[]);
    assert_eq!(
        build(&tar_a, &built.dir.path().join("on-tar"), &[]),
        layered
    );

    // Settings and SOURCE_DATE_EPOCH are inputs: they change the digest, reproducibly.
    let with_env = build(&root, &built.dir.path().join("env"), &["--env", "FOO=bar"]);
    assert_ne!(with_env, built.digest);
    let dated = |name: &str| {
        let out = Command::new(bin("tether"))
            .args([
                "image",
                "build",
                "--base",
                root.to_str().unwrap(),
                "--agent",
            ])
            .arg(static_agent())
            .arg("--output")
            .arg(built.dir.path().join(name))
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let first = dated("dated-1");
    assert_ne!(first, built.digest);
    assert_eq!(dated("dated-2"), first);
}

#[test]
fn skopeo_and_umoci_accept_the_layout() {
    let built = busybox_image();
    let layout = built.layout.to_str().unwrap();

    let inspect: Value = serde_json::from_str(&run_ok(
        tool("skopeo").args(["inspect", &format!("oci:{layout}")]),
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], built.digest.as_str());
    assert_eq!(inspect["Architecture"], "amd64");
    assert_eq!(inspect["Os"], "linux");
    let config: Value = serde_json::from_str(&run_ok(tool("skopeo").args([
        "inspect",
        "--config",
        &format!("oci:{layout}:latest"),
    ])))
    .unwrap();
    let entrypoint = &config["config"]["Entrypoint"];
    assert_eq!(entrypoint[0], "/usr/local/bin/tether-agent", "{config}");
    assert_eq!(entrypoint[1], "serve");
    assert!(
        config["config"]["ExposedPorts"].get("7421/tcp").is_some(),
        "{config}"
    );

    let tags = run_ok(tool("umoci").args(["ls", "--layout", layout]));
    assert_eq!(tags.trim(), "latest");
    let bundle = built.dir.path().join("bundle");
    run_ok(
        tool("umoci")
            .args(["unpack", "--image", &format!("{layout}:latest")])
            .arg(&bundle),
    );
    let rootfs = bundle.join("rootfs");
    assert!(rootfs.join("bin/busybox").is_file());
    assert_eq!(
        std::fs::read_link(rootfs.join("bin/sh")).unwrap(),
        Path::new("busybox")
    );
    assert_eq!(
        std::fs::read(rootfs.join("usr/local/bin/tether-agent")).unwrap(),
        std::fs::read(static_agent()).unwrap()
    );
    let runtime: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(runtime["process"]["args"][0], "/usr/local/bin/tether-agent");

    // A `docker save` tarball (written by skopeo) is a base too.
    let saved = built.dir.path().join("saved.tar");
    run_ok(
        tool("skopeo")
            .arg("copy")
            .arg(format!("oci:{layout}"))
            .arg(format!("docker-archive:{}:tether/saved:1", saved.display())),
    );
    let on_saved = built.dir.path().join("on-saved");
    build(&saved, &on_saved, &[]);
    let bundle = built.dir.path().join("bundle-saved");
    run_ok(
        tool("umoci")
            .args([
                "unpack",
                "--image",
                &format!("{}:latest", on_saved.display()),
            ])
            .arg(&bundle),
    );
    assert!(bundle.join("rootfs/bin/busybox").is_file());

    let tarball = built.dir.path().join("image.tar");
    build(&built.dir.path().join("busybox-root"), &tarball, &[]);
    let archived: Value = serde_json::from_str(&run_ok(
        tool("skopeo").args(["inspect", &format!("oci-archive:{}", tarball.display())]),
    ))
    .unwrap();
    assert_eq!(archived["Digest"], built.digest.as_str());
}

#[test]
fn pushes_to_a_registry_and_pulls_back_with_the_same_digest() {
    let built = busybox_image();
    let registry = RegistryServer::start();
    let reference = format!("{}/tether/busybox:v1", registry.addr);

    let out = image_cmd(&["push", built.layout.to_str().unwrap(), &reference, "--json"]);
    assert!(
        out.status.success(),
        "push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["digest"], built.digest.as_str());
    assert_eq!(
        report["pinned"],
        format!("{}/tether/busybox@{}", registry.addr, built.digest).as_str()
    );
    let blobs = report["blobs"].as_array().unwrap();
    assert_eq!(blobs.len(), 3, "two layers and the config: {report}");
    assert!(blobs.iter().all(|b| b["existed"] == false), "{report}");

    // Pushing again uploads nothing.
    let again: Value = serde_json::from_slice(
        &image_cmd(&["push", built.layout.to_str().unwrap(), &reference, "--json"]).stdout,
    )
    .unwrap();
    assert!(
        again["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["existed"] == true),
        "{again}"
    );

    // A tarball to another repository, in small chunks (PATCH uploads).
    let tarball = built.dir.path().join("image.tar");
    build(&built.dir.path().join("busybox-root"), &tarball, &[]);
    let chunked = format!("{}/tether/chunked:v1", registry.addr);
    let out = image_cmd(&[
        "push",
        tarball.to_str().unwrap(),
        &chunked,
        "--chunk-size",
        "300000",
    ]);
    assert!(
        out.status.success(),
        "chunked push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{}/tether/chunked@{}", registry.addr, built.digest)
    );

    for (name, repo) in [("pulled", &reference), ("pulled-chunked", &chunked)] {
        let dst = built.dir.path().join(name);
        run_ok(
            tool("skopeo")
                .args([
                    "copy",
                    "--src-tls-verify=false",
                    &format!("docker://{repo}"),
                ])
                .arg(format!("oci:{}:v1", dst.display())),
        );
        let inspect: Value = serde_json::from_str(&run_ok(
            tool("skopeo")
                .arg("inspect")
                .arg(format!("oci:{}:v1", dst.display())),
        ))
        .unwrap();
        assert_eq!(inspect["Digest"], built.digest.as_str(), "{repo}");
    }
    let remote: Value = serde_json::from_str(&run_ok(tool("skopeo").args([
        "inspect",
        "--tls-verify=false",
        &format!("docker://{reference}"),
    ])))
    .unwrap();
    assert_eq!(remote["Digest"], built.digest.as_str());

    // `tether image pull` brings back the same manifest, byte for byte, as a layout that
    // skopeo reads; an image skopeo pushed (with its own manifest) pulls too.
    let pulled = built.dir.path().join("tether-pulled");
    let out = image_cmd(&["pull", &reference, pulled.to_str().unwrap(), "--json"]);
    assert!(
        out.status.success(),
        "pull: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["digest"], built.digest.as_str());
    let inspect: Value = serde_json::from_str(&run_ok(
        tool("skopeo")
            .arg("inspect")
            .arg(format!("oci:{}:v1", pulled.display())),
    ))
    .unwrap();
    assert_eq!(inspect["Digest"], built.digest.as_str());
    let by_digest = format!("{}/tether/busybox@{}", registry.addr, built.digest);
    let again = built.dir.path().join("by-digest");
    let out = image_cmd(&["pull", &by_digest, again.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), built.digest);

    // Missing images and non-empty outputs fail clearly and leave nothing behind.
    let missing = built.dir.path().join("missing");
    let out = image_cmd(&[
        "pull",
        &format!("{}/tether/nothing:v1", registry.addr),
        missing.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MANIFEST_UNKNOWN") || err.contains("404"),
        "{err}"
    );
    assert!(!missing.exists());
    let out = image_cmd(&["pull", &reference, pulled.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
}

#[test]
fn pushes_with_credentials_from_the_docker_config() {
    // `htpasswd -Bbn -C 5 tester s3cret`
    const USER: &str = "tester:$2y$05$U.BrKwXHqKBKViLiveZaV.mePvM06GS3GNix28R08WvjH6LnPoeki";
    let built = busybox_image();
    let registry = RegistryServer::start_with(Some(USER));
    let reference = format!("{}/private/busybox:v1", registry.addr);
    let docker_config = built.dir.path().join("docker");
    std::fs::create_dir(&docker_config).unwrap();
    let push = |auth: Option<&str>| {
        if let Some(auth) = auth {
            let config = format!(
                r#"{{"auths":{{"http://{}":{{"auth":"{auth}"}}}}}}"#,
                registry.addr
            );
            std::fs::write(docker_config.join("config.json"), config).unwrap();
        }
        Command::new(bin("tether"))
            .args(["image", "push", built.layout.to_str().unwrap(), &reference])
            .env("DOCKER_CONFIG", &docker_config)
            .output()
            .unwrap()
    };

    let out = push(None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("refused access") && err.contains("docker login"),
        "{err}"
    );
    // base64("tester:wrong")
    let out = push(Some("dGVzdGVyOndyb25n"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("\"tester\""), "{err}");
    // base64("tester:s3cret")
    let out = push(Some("dGVzdGVyOnMzY3JldA=="));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&built.digest));
}

/// A podman container and the image it was made from, removed on drop.
struct Container {
    name: String,
    layout: PathBuf,
}

impl Drop for Container {
    fn drop(&mut self) {
        let image = Command::new("podman")
            .args(["inspect", "--format", "{{.Image}}", &self.name])
            .output();
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.name])
            .output();
        if let Ok(image) = image {
            let id = String::from_utf8_lossy(&image.stdout).trim().to_string();
            let _ = Command::new("podman").args(["rmi", "-f", &id]).output();
        }
        let _ = std::fs::remove_dir_all(&self.layout);
    }
}

#[tokio::test]
async fn podman_runs_it_and_the_agent_answers() {
    let built = busybox_image();
    let id = &token()[..12];
    let name = format!("tether-image-test-{id}");
    // Podman names an `oci:` image after its path, which must be lowercase.
    let layout = std::env::temp_dir().join(format!("tether-podman-{id}"));
    copy_dir(&built.layout, &layout);
    let _container = Container {
        name: name.clone(),
        layout: layout.clone(),
    };
    let secret = token();
    let mut podman = tool("podman");
    // runc where installed: crun refuses hosts whose cgroups are in hybrid mode.
    if Path::new("/usr/bin/runc").exists() {
        podman.args(["--runtime", "runc"]);
    }
    // Podman's default limits (1M open files) exceed what an unprivileged host allows.
    podman
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--ulimit",
            "nofile=4096:4096",
            "--ulimit",
            "nproc=4096:4096",
        ])
        .args([
            "-p",
            "127.0.0.1::7421",
            "-e",
            &format!("TETHER_AGENT_TOKEN={secret}"),
        ])
        .arg(format!("oci:{}", layout.display()));
    run_ok(&mut podman);

    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let logs = Command::new("podman")
            .args(["logs", &name])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&logs.stdout).contains("listening ws://0.0.0.0:7421") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the agent did not start: {}",
            String::from_utf8_lossy(&logs.stderr)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let port = run_ok(tool("podman").args(["port", &name, "7421/tcp"]));
    let addr = port
        .lines()
        .next()
        .expect("a mapped port")
        .trim()
        .to_string();

    let session = Session::connect(&format!("ws://{addr}"), Some(&secret))
        .await
        .expect("connect to the agent in podman");
    let out = session
        .exec(ExecSpec::argv(["busybox", "ls", "/"]))
        .await
        .unwrap()
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains("bin") && listing.contains("usr"),
        "{listing}"
    );
    assert!(
        Session::connect(&format!("ws://{addr}"), Some("wrong"))
            .await
            .is_err(),
        "a wrong token is refused"
    );
}

#[test]
fn local_sandboxes_run_oci_images() {
    let built = busybox_image();
    let relay = Relay::start();
    let create = |image: &str| {
        let out = relay
            .tether()
            .args(["create", "--image", image])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "create --image {image}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let image = format!("oci:{}", built.layout.display());
    let first = Instant::now();
    let id = create(&image);
    let unpacking = first.elapsed();
    let out = run_ok(
        relay
            .tether()
            .args(["exec", &id, "--", "busybox", "ls", "/"]),
    );
    assert!(out.contains("bin") && out.contains("usr"), "{out}");
    let agent = run_ok(
        relay
            .tether()
            .args(["exec", &id, "--", "busybox", "ls", "/usr/local/bin"]),
    );
    assert!(agent.contains("tether-agent"), "{agent}");

    // The second sandbox comes from the cache, and writes stay in each sandbox.
    let second = Instant::now();
    let other = create(&format!("oci:{}:latest", built.layout.display()));
    let cached = second.elapsed();
    run_ok(
        relay
            .tether()
            .args(["exec", &id, "--", "busybox", "touch", "/mine"]),
    );
    let out = relay
        .tether()
        .args(["exec", &other, "--", "busybox", "ls", "/mine"])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a write in one sandbox is not seen by another"
    );
    eprintln!("create with unpacking: {unpacking:?}; from the cache: {cached:?}");

    // One unpacked root per image, named by its manifest digest.
    let cache = relay.data_dir.join("local/images");
    let entries: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect();
    assert_eq!(entries, [built.digest.trim_start_matches("sha256:")]);
}

#[test]
fn the_unpacked_image_cache_keeps_images_in_use_and_the_recent_few() {
    let dir = tempfile::tempdir().unwrap();
    let root = tether_e2e::images::busybox_rootfs(dir.path());
    let relay = Relay::start();
    let cache = relay.data_dir.join("local/images");
    let cached = || -> usize {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter(|e| {
                !e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count()
    };
    let create = |n: usize| {
        let layout = dir.path().join(format!("image-{n}"));
        build(&root, &layout, &["--env", &format!("VARIANT={n}")]);
        let image = format!("oci:{}", layout.display());
        run_ok(relay.tether().args(["create", "--image", &image]))
            .trim()
            .to_string()
    };
    // The first image stays in use throughout; six more come and go.
    let kept = create(0);
    for n in 1..=6 {
        let id = create(n);
        run_ok(relay.tether().args(["rm", &id]));
        assert!(cached() <= 5, "{} images cached after {n}", cached());
    }
    // In use (1) plus the four most recent unused.
    assert_eq!(cached(), 5);
    let out = run_ok(
        relay
            .tether()
            .args(["exec", &kept, "--", "busybox", "ls", "/bin"]),
    );
    assert!(out.contains("busybox"), "{out}");
}

#[test]
fn local_sandboxes_apply_the_images_user_and_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = tether_e2e::images::busybox_rootfs(dir.path());
    std::fs::create_dir_all(root.join("srv/app")).unwrap();
    let layout = dir.path().join("image");
    build(
        &root,
        &layout,
        &["--workdir", "/srv/app", "--user", "4242:4343"],
    );
    let relay = Relay::start();
    let id =
        run_ok(
            relay
                .tether()
                .args(["create", "--image", &format!("oci:{}", layout.display())]),
        )
        .trim()
        .to_string();
    let exec = |args: &[&str]| {
        let mut cmd = relay.tether();
        cmd.args(["exec", &id, "--"]).args(args);
        run_ok(&mut cmd).trim().to_string()
    };
    assert_eq!(exec(&["busybox", "pwd"]), "/srv/app");
    assert_eq!(exec(&["busybox", "id", "-u"]), "4242");
    assert_eq!(exec(&["busybox", "id", "-g"]), "4343");
    // A command may still ask for another user: the agent itself runs as root.
    let mut cmd = relay.tether();
    cmd.args(["exec", "--user", "0", &id, "--", "busybox", "id", "-u"]);
    assert_eq!(run_ok(&mut cmd).trim(), "0");
}

#[test]
fn broken_bases_fail_clearly_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out");
    let fails = |base: &Path, agent: &Path, expect: &[&str]| {
        let out = image_cmd(&[
            "build",
            "--base",
            base.to_str().unwrap(),
            "--agent",
            agent.to_str().unwrap(),
            "--output",
            out_path.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            !out.status.success(),
            "building on {} should fail",
            base.display()
        );
        for e in expect {
            assert!(err.contains(e), "expected {e:?} in: {err}");
        }
        assert!(!out_path.exists(), "nothing is written: {err}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".tether-build-")
            })
            .collect();
        assert!(leftovers.is_empty(), "the staging directory is removed");
    };
    let agent = static_agent();

    fails(&dir.path().join("missing"), agent, &["does not exist"]);

    let junk = dir.path().join("junk.tar");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    fails(&junk, agent, &["junk.tar", "tar"]);

    // A valid image for another architecture.
    let built = busybox_image();
    let arm = dir.path().join("arm64");
    copy_dir(&built.layout, &arm);
    rewrite_config(&arm, |config| config["architecture"] = "arm64".into());
    fails(&arm, agent, &["linux/arm64", "amd64"]);

    // A layer blob that does not match its digest.
    let corrupt = dir.path().join("corrupt");
    copy_dir(&built.layout, &corrupt);
    let manifest = manifest_of(&corrupt);
    let layer = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let blob = corrupt.join("blobs/sha256").join(&layer);
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    fails(&corrupt, agent, &["corrupt", &layer]);

    // A dynamically linked agent (the one cargo test builds) is refused with the fix.
    fails(
        &built.dir.path().join("busybox-root"),
        &bin("tether-agent"),
        &["dynamically linked", "x86_64-unknown-linux-musl"],
    );

    // A broken image is refused before the registry is contacted (nothing listens there).
    let out = image_cmd(&["push", corrupt.to_str().unwrap(), "127.0.0.1:1/x:y"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("corrupt") && !err.contains("cannot reach"),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    run_ok(Command::new("cp").arg("-a").arg(from).arg(to));
}

fn manifest_of(layout: &Path) -> Value {
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let digest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(digest)).unwrap())
        .unwrap()
}

/// Rewrites the config of the layout's image with `edit`, updating the manifest and index.
fn rewrite_config(layout: &Path, edit: impl FnOnce(&mut Value)) {
    let blobs = layout.join("blobs/sha256");
    let put = |bytes: &[u8]| -> (String, usize) {
        let hex = tether_e2e::sha256_hex(bytes);
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let mut manifest = manifest_of(layout);
    let config_hex = manifest["config"]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(blobs.join(config_hex)).unwrap()).unwrap();
    edit(&mut config);
    let (digest, size) = put(&serde_json::to_vec(&config).unwrap());
    manifest["config"]["digest"] = digest.into();
    manifest["config"]["size"] = size.into();
    let (digest, size) = put(&serde_json::to_vec(&manifest).unwrap());
    let mut index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"][0]["digest"] = digest.into();
    index["manifests"][0]["size"] = size.into();
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
}
