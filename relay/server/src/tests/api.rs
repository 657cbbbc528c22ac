//! The REST contract: auth, tenants, lifecycle, get-or-create, and error bodies.

use std::sync::atomic::Ordering;

use reqwest::StatusCode;
use serde_json::json;

use super::{assert_error, TestRelay};
use tether_client::api::SandboxInfo;

#[tokio::test]
async fn health_is_open_and_everything_else_needs_a_known_token() {
    let t = TestRelay::start().await;
    let health = t.http.get(t.url("/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    let none = t.http.get(t.url("/v1/sandboxes")).send().await.unwrap();
    let none = (none.status(), none.json().await.unwrap());
    assert_error(
        &none,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        &["no API token", "TETHER_TOKEN"],
    );

    let wrong = t.call("GET", "/v1/sandboxes", "tether_wrong", None).await;
    let admin_file = t.dir.path().join("data/admin.token");
    let words = [
        "not known",
        "TETHER_TOKEN",
        "tether token create",
        admin_file.to_str().unwrap(),
    ];
    assert_error(&wrong, StatusCode::UNAUTHORIZED, "unauthorized", &words);
    let wrong = t
        .call("POST", "/v1/sandboxes", "tether_wrong", Some(json!({})))
        .await;
    assert_error(&wrong, StatusCode::UNAUTHORIZED, "unauthorized", &[]);

    let file = std::fs::read_to_string(&admin_file).unwrap();
    assert_eq!(file.trim(), t.admin());
    let ok = t.call("GET", "/v1/sandboxes", &t.admin(), None).await;
    assert_eq!(ok, (StatusCode::OK, json!([])));
}

#[tokio::test]
async fn creates_lists_gets_renews_and_deletes() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let body = json!({"provider": "fake", "image": "img", "labels": {"app": "web", "env": "dev"}});
    let web = t.create(&admin, body).await;
    assert!(web.id.starts_with("sb-") && web.created, "{web:?}");
    assert_eq!(
        (web.state.as_str(), web.provider.as_str()),
        ("running", "fake")
    );
    assert_eq!(web.provider_ref, format!("fake-{}", web.id));
    assert_eq!(web.image.as_deref(), Some("img"));
    let db = t
        .create(&admin, json!({"provider": "fake", "labels": {"app": "db"}}))
        .await;

    let (status, list) = t
        .call("GET", "/v1/sandboxes?label=app=web", &admin, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let list: Vec<SandboxInfo> = serde_json::from_value(list).unwrap();
    assert_eq!(
        list.iter().map(|s| &s.id).collect::<Vec<_>>(),
        vec![&web.id]
    );
    let (_, all) = t.call("GET", "/v1/sandboxes", &admin, None).await;
    assert_eq!(all.as_array().unwrap().len(), 2);
    let both = "/v1/sandboxes?label=app%3Dweb&label=env=dev";
    assert_eq!(
        t.call("GET", both, &admin, None).await.1[0]["id"],
        json!(web.id)
    );

    let (status, got) = t
        .call("GET", &format!("/v1/sandboxes/{}", db.id), &admin, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let got: SandboxInfo = serde_json::from_value(got).unwrap();
    assert_eq!(
        got,
        SandboxInfo {
            created: false,
            ..db.clone()
        }
    );

    let renew = format!("/v1/sandboxes/{}/renew", db.id);
    let (status, renewed) = t
        .call("POST", &renew, &admin, Some(json!({"ttl_secs": 3600})))
        .await;
    assert_eq!(status, StatusCode::OK, "{renewed}");
    let expires = renewed["expires_ms"].as_i64().unwrap();
    assert!(expires >= db.created_ms + 3_600_000, "{renewed}");
    assert_eq!(t.provider.renews.load(Ordering::SeqCst), 1);
    let zero = t
        .call("POST", &renew, &admin, Some(json!({"ttl_secs": 0})))
        .await;
    assert_error(
        &zero,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["ttl_secs"],
    );

    let path = format!("/v1/sandboxes/{}", db.id);
    assert_eq!(
        t.call("DELETE", &path, &admin, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert!(!t.provider.has(&db.id));
    let gone = t.call("GET", &path, &admin, None).await;
    assert_error(&gone, StatusCode::NOT_FOUND, "not_found", &[&db.id]);
    // Idempotent.
    assert_eq!(
        t.call("DELETE", &path, &admin, None).await.0,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test]
async fn bad_input_gets_a_400_that_says_why() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let raw = |body: &'static str| {
        let req = t
            .http
            .post(t.url("/v1/sandboxes"))
            .bearer_auth(&admin)
            .body(body);
        async move {
            let resp = req.send().await.unwrap();
            (
                resp.status(),
                resp.json::<serde_json::Value>().await.unwrap(),
            )
        }
    };
    let bad = raw("{\"labels\": ").await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["EOF", "line 1"],
    );
    let bad = raw("{\"labels\": [1]}").await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["invalid type"],
    );
    let bad = t
        .call("POST", "/v1/sandboxes", &admin, Some(json!({"ttl": -5})))
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["`ttl`", "positive"],
    );

    // No provider named: the default, `local`, is not configured in this relay.
    let bad = raw("").await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["`local`", "fake"],
    );
    let bad = t
        .call(
            "POST",
            "/v1/sandboxes",
            &admin,
            Some(json!({"provider": "k8s"})),
        )
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["`k8s`", "fake"],
    );
    let bad = t
        .call(
            "POST",
            "/v1/sandboxes",
            &admin,
            Some(json!({"provider": "fake", "get_or_create": true})),
        )
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["at least one label"],
    );

    let bad = t.call("GET", "/v1/sandboxes?label=app", &admin, None).await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["KEY=VALUE"],
    );
    let bad = t
        .call("GET", "/v1/sandboxes?labels=a=b", &admin, None)
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["`labels`"],
    );

    let bad = t.call("GET", "/v1/nothing", &admin, None).await;
    assert_error(&bad, StatusCode::NOT_FOUND, "not_found", &["/v1/nothing"]);
    let bad = t.call("PUT", "/v1/sandboxes", &admin, None).await;
    assert_error(
        &bad,
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_argument",
        &["PUT"],
    );
    let bad = t.call("GET", "/v1/sandboxes/sb-x/ws", &admin, None).await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["WebSocket"],
    );
}

#[tokio::test]
async fn tenants_see_only_their_own_sandboxes() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let b = t.token_for("team-b").await;
    let theirs = t
        .create(&b, json!({"provider": "fake", "labels": {"k": "v"}}))
        .await;
    let mine = t
        .create(&admin, json!({"provider": "fake", "labels": {"k": "v"}}))
        .await;
    let path = format!("/v1/sandboxes/{}", theirs.id);

    let listed = t.call("GET", "/v1/sandboxes", &admin, None).await.1;
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["id"], json!(mine.id));
    for (method, p, body) in [
        ("GET", path.clone(), None),
        (
            "POST",
            format!("{path}/renew"),
            Some(json!({"ttl_secs": 60})),
        ),
    ] {
        let got = t.call(method, &p, &admin, body).await;
        assert_error(&got, StatusCode::NOT_FOUND, "not_found", &[&theirs.id]);
    }
    let err = t.tunnel(&theirs.id, &admin).await.unwrap_err();
    assert!(
        matches!(&err, tokio_tungstenite::tungstenite::Error::Http(r) if r.status() == 404),
        "{err}"
    );
    // A delete of someone else's sandbox is the delete of an unknown one: nothing happens.
    assert_eq!(
        t.call("DELETE", &path, &admin, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert!(t.provider.has(&theirs.id));
    assert_eq!(t.call("GET", &path, &b, None).await.0, StatusCode::OK);

    // Only admins mint tokens.
    let denied = t
        .call("POST", "/v1/tokens", &b, Some(json!({"tenant": "team-c"})))
        .await;
    assert_error(&denied, StatusCode::FORBIDDEN, "forbidden", &["admin"]);
    let bad = t
        .call("POST", "/v1/tokens", &admin, Some(json!({"tenant": "a b"})))
        .await;
    assert_error(
        &bad,
        StatusCode::BAD_REQUEST,
        "invalid_argument",
        &["tenant"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_or_create_hands_out_one_sandbox_per_label_set() {
    let t = std::sync::Arc::new(TestRelay::start().await);
    let admin = t.admin();
    let body = json!({"provider": "fake", "labels": {"task": "42"}, "get_or_create": true});
    let calls = (0..8).map(|_| {
        let (t, admin, body) = (t.clone(), admin.clone(), body.clone());
        tokio::spawn(async move { t.call("POST", "/v1/sandboxes", &admin, Some(body)).await })
    });
    let answers: Vec<_> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let ids: std::collections::BTreeSet<_> = answers
        .iter()
        .map(|(_, b)| b["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let created: Vec<_> = answers
        .iter()
        .filter(|(_, b)| b["created"] == json!(true))
        .collect();
    assert_eq!(created.len(), 1, "{answers:?}");
    assert_eq!(created[0].0, StatusCode::CREATED);
    assert!(answers
        .iter()
        .all(|(s, b)| *s == StatusCode::OK || b["created"] == json!(true)));
    assert_eq!(t.provider.creates.load(Ordering::SeqCst), 1);

    // Other labels, or another tenant: another sandbox.
    let more =
        json!({"provider": "fake", "labels": {"task": "42", "x": "y"}, "get_or_create": true});
    let other = t.call("POST", "/v1/sandboxes", &admin, Some(more)).await;
    assert_eq!(other.0, StatusCode::CREATED);
    let b = t.token_for("b").await;
    let theirs = t
        .call("POST", "/v1/sandboxes", &b, Some(body.clone()))
        .await;
    assert_eq!(theirs.0, StatusCode::CREATED);
    assert!(!ids.contains(theirs.1["id"].as_str().unwrap()));

    // Once the provider loses it, get-or-create makes a new one.
    t.provider.lose(ids.first().unwrap());
    let again = t.call("POST", "/v1/sandboxes", &admin, Some(body)).await;
    assert_eq!(again.0, StatusCode::CREATED, "{}", again.1);
    assert!(!ids.contains(again.1["id"].as_str().unwrap()));
}
