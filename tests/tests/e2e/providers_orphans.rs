//! Orphans: sandboxes a provider runs with Tether's label that no relay's registry knows. A
//! relay creates sandboxes on a fake provider and dies with its data directory; a new relay
//! on the same provider account lists them (`tether ls --orphans`) and removes them, by id
//! (`tether rm`) or all at once (`--orphans --rm`), for its admin only. Each provider lists a
//! page at a time; with more orphans than one page holds, every page is read.

use std::collections::BTreeSet;

use tether_e2e::cloud::{http, tether, tether_fails, Fake};
use tether_e2e::Relay;

/// The key the fake accepts.
const KEY: &str = "e2b_fake_key";
/// Any template name: the fake runs every template as a local sandbox with the agent.
const TEMPLATE: &str = "tether-e2e-template";

fn relay_for(fake: &Fake) -> Relay {
    Relay::start_with_env(&[
        ("E2B_API_KEY", KEY),
        ("E2B_API_URL", &fake.url),
        ("E2B_SANDBOX_URL", &fake.url),
    ])
}

fn listed_at_e2b(fake: &Fake) -> String {
    let (code, listed) = http(&fake.url, "GET", "/v2/sandboxes", &[("X-API-Key", KEY)], "");
    assert_eq!(code, 200, "{listed}");
    listed
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_relays_sandboxes_are_listed_and_removed_as_orphans() {
    let fake = Fake::start("e2b", &["--api-key", KEY]);
    let mut dead = relay_for(&fake);
    let create = |relay: &Relay| {
        tether(
            relay,
            &["create", "--provider", "e2b", "--image", TEMPLATE, "--json"],
        )
    };
    let first: serde_json::Value = serde_json::from_str(&create(&dead)).expect("create");
    let second: serde_json::Value = serde_json::from_str(&create(&dead)).expect("create");
    let (first_id, second_id) = (
        first["id"].as_str().unwrap().to_string(),
        second["id"].as_str().unwrap().to_string(),
    );
    // The relay dies and its registry goes with its data directory.
    dead.stop();
    std::fs::remove_dir_all(&dead.data_dir).expect("delete the registry");
    drop(dead);

    let relay = relay_for(&fake);
    // The new relay's own sandboxes are not orphans.
    let own = tether(
        &relay,
        &["create", "--provider", "e2b", "--image", TEMPLATE],
    );
    let own = own.trim();
    let orphans: serde_json::Value =
        serde_json::from_str(&tether(&relay, &["ls", "--orphans", "--json"])).expect("orphans");
    let ids: Vec<&str> = orphans
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&first_id.as_str()) && ids.contains(&second_id.as_str()),
        "{orphans}"
    );
    assert!(!ids.contains(&own), "{orphans}");
    assert!(orphans
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["provider"] == "e2b"));
    // Plain `tether ls` is the registry's, as before.
    assert!(!tether(&relay, &["ls"]).contains(&first_id));

    // Orphans belong to no tenant: a tenant's token neither sees nor removes them.
    let member = tether(&relay, &["token", "create", "--tenant", "acme"]);
    let as_member = |args: &[&str]| {
        relay
            .tether()
            .env("TETHER_TOKEN", member.trim())
            .args(args)
            .output()
            .expect("run tether")
    };
    let out = as_member(&["ls", "--orphans"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("admin token"));
    let out = as_member(&["rm", &first_id]);
    assert!(!out.status.success());
    assert!(listed_at_e2b(&fake).contains(&first_id));

    // The admin removes one by id, then the rest at once.
    tether(&relay, &["rm", &first_id]);
    assert!(!listed_at_e2b(&fake).contains(&first_id));
    let out = tether(&relay, &["ls", "--orphans", "--rm", "--quiet"]);
    assert_eq!(out.trim(), second_id);
    let listed = listed_at_e2b(&fake);
    assert!(!listed.contains(&second_id), "{listed}");
    assert!(
        listed.contains(own),
        "the relay's own sandbox was removed: {listed}"
    );
    let out = tether(&relay, &["ls", "--orphans", "--quiet"]);
    assert_eq!(out.trim(), "");
    // An id that is neither the registry's nor an orphan's is still an error.
    let err = tether_fails(&relay, &["rm", "sb-nosuchsandbox"]);
    assert!(err.contains("no sandbox"), "{err}");
}

/// Orphans made on `provider` (its fake serving one sandbox a list page) by a relay with
/// `env` that died with its registry: a new relay finds them all, over several pages, and
/// removes them all.
fn orphans_on_every_page(provider: &str, image: &str, env: &[(&str, &str)]) {
    const ORPHANS: usize = 3;
    let mut dead = Relay::start_with_env(env);
    let made: BTreeSet<String> = (0..ORPHANS)
        .map(|_| {
            tether(&dead, &["create", "--provider", provider, "--image", image])
                .trim()
                .to_string()
        })
        .collect();
    dead.stop();
    std::fs::remove_dir_all(&dead.data_dir).expect("delete the registry");
    drop(dead);

    let relay = Relay::start_with_env(env);
    let orphans: serde_json::Value =
        serde_json::from_str(&tether(&relay, &["ls", "--orphans", "--json"])).expect("orphans");
    let found: BTreeSet<String> = orphans
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(found, made, "{orphans}");
    let removed: BTreeSet<String> = tether(&relay, &["ls", "--orphans", "--rm", "--quiet"])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(removed, made);
    assert_eq!(tether(&relay, &["ls", "--orphans", "--quiet"]).trim(), "");
}

#[test]
fn e2b_orphans_are_found_on_every_page() {
    let fake = Fake::start("e2b", &["--api-key", KEY, "--page-size", "1"]);
    let env = [
        ("E2B_API_KEY", KEY),
        ("E2B_API_URL", fake.url.as_str()),
        ("E2B_SANDBOX_URL", fake.url.as_str()),
    ];
    orphans_on_every_page("e2b", TEMPLATE, &env);
}

#[test]
fn daytona_orphans_are_found_on_every_page() {
    const DAYTONA_KEY: &str = "dtn_orphans_key";
    let fake = Fake::start("daytona", &["--api-key", DAYTONA_KEY, "--page-size", "1"]);
    let api = format!("{}/api", fake.url);
    let env = [
        ("DAYTONA_API_KEY", DAYTONA_KEY),
        ("DAYTONA_API_URL", api.as_str()),
    ];
    // A snapshot the fake never saw runs the agent, as one added through the Dashboard.
    orphans_on_every_page("daytona", "tether-orphans", &env);
}

#[test]
fn modal_orphans_are_found_on_every_page() {
    let fake = Fake::start(
        "modal",
        &[
            "--token-id",
            "ak-orphans",
            "--token-secret",
            "as-orphans",
            "--page-size",
            "1",
        ],
    );
    let env = [
        ("MODAL_TOKEN_ID", "ak-orphans"),
        ("MODAL_TOKEN_SECRET", "as-orphans"),
        ("MODAL_SERVER_URL", fake.url.as_str()),
    ];
    // Any registry tag: the fake "builds" it at once.
    orphans_on_every_page("modal", "ghcr.io/example/tether-agent:orphans", &env);
}
