//! The secret store's routes: status codes, tenants kept apart, the rules for names and
//! values, no value in any answer, and bound secrets gone with their sandbox.

use reqwest::StatusCode;
use serde_json::json;

use super::{assert_error, eventually, TestRelay};
use tether_client::api::{SecretInfo, SecretValue};
use tether_relay_core::egress::policy::{BoundSecret, HostPattern};
use tether_store::{SandboxId, Store};

/// A value no other test data contains: any answer holding it leaked it.
const VALUE: &str = "sk-route-Mn4bV7cX0zL3kJ6h";

impl TestRelay {
    fn store(&self) -> &Store {
        &self.relay.as_ref().expect("relay running").relay.store
    }

    /// `PUT /v1/secrets/{name}{query}` with a raw body; the status and the body's text.
    async fn put_raw(&self, token: &str, name_and_query: &str, body: &str) -> (StatusCode, String) {
        let resp = self
            .http
            .put(self.url(&format!("/v1/secrets/{name_and_query}")))
            .bearer_auth(token)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (resp.status(), resp.text().await.unwrap())
    }
}

fn put_body(value: &str) -> Option<serde_json::Value> {
    Some(json!({ "value": value }))
}

#[tokio::test]
async fn secrets_are_stored_listed_and_deleted_without_showing_values() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let path = "/v1/secrets/OPENAI_API_KEY";

    let (status, body) = t.call("PUT", path, &admin, put_body("first")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let first: SecretInfo = serde_json::from_value(body).unwrap();
    assert_eq!(
        (first.name.as_str(), first.tenant.as_str()),
        ("OPENAI_API_KEY", "default")
    );
    assert_eq!(first.created_ms, first.updated_ms);

    let (status, body) = t.call("PUT", path, &admin, put_body(VALUE)).await;
    assert_eq!(status, StatusCode::OK, "a second put replaces: {body}");
    let second: SecretInfo = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(second.created_ms, first.created_ms);
    assert!(second.updated_ms >= first.updated_ms);
    assert!(!body.to_string().contains(VALUE));

    let (status, list) = t.call("GET", "/v1/secrets", &admin, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list, json!([second]), "names and times, never values");

    assert_eq!(
        t.call("DELETE", path, &admin, None).await.0,
        StatusCode::NO_CONTENT
    );
    let again = t.call("DELETE", path, &admin, None).await;
    assert_error(
        &again,
        StatusCode::NOT_FOUND,
        "not_found",
        &["OPENAI_API_KEY", "tether secret list"],
    );
    assert_eq!(
        t.call("GET", "/v1/secrets", &admin, None).await.1,
        json!([])
    );

    let anonymous = t.http.get(t.url("/v1/secrets")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let wrong = t.call("GET", "/v1/secrets", &admin, None).await;
    assert_eq!(wrong.0, StatusCode::OK);
    let post = t.call("POST", "/v1/secrets", &admin, None).await;
    assert_eq!(post.0, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_tenant_can_neither_see_overwrite_nor_delete_another_tenants_secret() {
    let t = TestRelay::start().await;
    let (admin, a, b) = (
        t.admin(),
        t.token_for("team-a").await,
        t.token_for("team-b").await,
    );
    let b_admin = t.mint(&admin, "team-b", true).await;
    let path = "/v1/secrets/KEY";
    assert_eq!(
        t.call("PUT", path, &a, put_body(VALUE)).await.0,
        StatusCode::CREATED
    );

    // b's requests act on b's store: empty, and its own KEY is another secret.
    assert_eq!(t.call("GET", "/v1/secrets", &b, None).await.1, json!([]));
    assert_eq!(
        t.call("DELETE", path, &b, None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        t.call("PUT", path, &b, put_body("b's")).await.0,
        StatusCode::CREATED
    );
    // Naming a's tenant is refused to b's tokens, even b's admin.
    for token in [&b, &b_admin] {
        for (method, p) in [
            ("GET", "/v1/secrets?tenant=team-a"),
            ("PUT", "/v1/secrets/KEY?tenant=team-a"),
            ("DELETE", "/v1/secrets/KEY?tenant=team-a"),
        ] {
            let got = t.call(method, p, token, put_body("overwrite")).await;
            assert_error(
                &got,
                StatusCode::FORBIDDEN,
                "forbidden",
                &["team-a", "relay's admin token"],
            );
        }
    }
    let store = t.store();
    let value = |tenant: &str| {
        let tenant = tether_store::Tenant::parse(tenant).unwrap();
        async move { store.secret_value(&tenant, "KEY").await.unwrap().unwrap() }
    };
    assert_eq!(
        value("team-a").await.expose(),
        VALUE,
        "a's value is untouched"
    );
    assert_eq!(value("team-b").await.expose(), "b's");

    // The relay's admin token manages any tenant's; naming one's own tenant is always fine.
    let (status, list) = t
        .call("GET", "/v1/secrets?tenant=team-a", &admin, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list[0]["tenant"], "team-a");
    assert!(!list.to_string().contains(VALUE));
    let put = t
        .call(
            "PUT",
            "/v1/secrets/OTHER?tenant=team-a",
            &admin,
            put_body("x"),
        )
        .await;
    assert_eq!(put.0, StatusCode::CREATED);
    assert_eq!(put.1["tenant"], "team-a");
    let own = t.call("GET", "/v1/secrets?tenant=team-b", &b, None).await;
    assert_eq!(own.1.as_array().unwrap().len(), 1);
    let del = t
        .call("DELETE", "/v1/secrets/KEY?tenant=team-a", &admin, None)
        .await;
    assert_eq!(del.0, StatusCode::NO_CONTENT);
    assert_eq!(
        t.call("GET", "/v1/secrets", &a, None).await.1[0]["name"],
        "OTHER"
    );
}

#[tokio::test]
async fn bad_names_values_and_queries_are_400s_naming_the_rule() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let long = "A".repeat(129);
    for name in ["1KEY", "A-B", "a%2Fb", "K%C3%A9Y", "%20", long.as_str()] {
        let body = format!("{{\"value\": \"{VALUE}\"}}");
        let (status, text) = t.put_raw(&admin, name, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {text}");
        assert!(text.contains("environment variable"), "{name}: {text}");
        let del = t
            .call("DELETE", &format!("/v1/secrets/{name}"), &admin, None)
            .await;
        assert_eq!(del.0, StatusCode::BAD_REQUEST, "{name}");
    }
    assert_eq!(
        t.put_raw(&admin, &"A".repeat(128), "{\"value\": \"x\"}")
            .await
            .0,
        StatusCode::CREATED
    );

    let too_big = format!("{{\"value\": \"{}\"}}", "x".repeat(64 * 1024 + 1));
    let cases = [
        (format!("{{\"value\": \"{VALUE}\""), "not valid JSON"),
        (format!("\"{VALUE}\""), "not an object"),
        (format!("{{\"value\": [\"{VALUE}\"]}}"), "not a string"),
        (
            format!("{{\"value\": \"x\", \"{VALUE}\": 1}}"),
            "other fields",
        ),
        ("{}".to_string(), "missing"),
        (String::new(), "not valid JSON"),
        ("{\"value\": \"\"}".to_string(), "empty"),
        ("{\"value\": \"a\\u0000b\"}".to_string(), "NUL"),
        (too_big, "64 KiB"),
    ];
    for (body, words) in cases {
        let (status, text) = t.put_raw(&admin, "KEY", &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body:.80}: {text}");
        assert!(text.contains(words), "{words:?} not in {text}");
        assert!(!text.contains(VALUE), "the answer quotes the body: {text}");
    }
    assert_eq!(
        t.call("GET", "/v1/secrets", &admin, None)
            .await
            .1
            .as_array()
            .unwrap()
            .len(),
        1
    );

    for query in ["?tenant=a%20b", "?label=x", "?tenant=a&tenant=b"] {
        let got = t
            .call("GET", &format!("/v1/secrets{query}"), &admin, None)
            .await;
        assert_error(&got, StatusCode::BAD_REQUEST, "invalid_argument", &[]);
    }
}

#[tokio::test]
async fn bound_secrets_go_with_their_sandbox_whoever_deletes_it() {
    let t = TestRelay::start().await;
    let admin = t.admin();
    let bound = vec![BoundSecret {
        name: "KEY".into(),
        placeholder: crate::bound_secrets::placeholder(),
        value: SecretValue::new(VALUE),
        hosts: vec![HostPattern::parse("api.example.test").unwrap()],
    }];
    let asked = t.create(&admin, json!({"provider": "fake"})).await;
    let timed = t
        .create(&admin, json!({"provider": "fake", "ttl": 1}))
        .await;
    let ids: Vec<SandboxId> = [&asked.id, &timed.id]
        .map(|id| SandboxId::from(id.clone()))
        .into();
    for id in &ids {
        t.store().bind_secrets(id, &bound).await.unwrap();
        assert_eq!(
            crate::bound_secrets::load(t.store(), id).await.unwrap(),
            bound
        );
    }

    let path = format!("/v1/sandboxes/{}", asked.id);
    assert_eq!(
        t.call("DELETE", &path, &admin, None).await.0,
        StatusCode::NO_CONTENT
    );
    assert!(crate::bound_secrets::load(t.store(), &ids[0])
        .await
        .unwrap()
        .is_empty());
    eventually("the TTL to delete the sandbox and its secrets", || async {
        crate::bound_secrets::load(t.store(), &ids[1])
            .await
            .unwrap()
            .is_empty()
    })
    .await;
    let path = format!("/v1/sandboxes/{}", timed.id);
    assert_eq!(t.call("GET", &path, &admin, None).await.0, StatusCode::GONE);
}

#[tokio::test]
async fn a_tenant_store_is_bounded_and_a_full_one_still_replaces() {
    let t = TestRelay::start().await;
    let member = t.token_for("team-a").await;
    let max = super::super::constants::MAX_SECRETS_PER_TENANT;
    for n in 0..max {
        let path = format!("/v1/secrets/KEY_{n}");
        let got = t.call("PUT", &path, &member, put_body("v")).await;
        assert_eq!(got.0, StatusCode::CREATED, "{n}: {}", got.1);
    }
    let full = t
        .call("PUT", "/v1/secrets/ONE_MORE", &member, put_body("v"))
        .await;
    assert_error(
        &full,
        StatusCode::FORBIDDEN,
        "forbidden",
        &["team-a", &max.to_string(), "tether secret rm"],
    );
    let replace = t
        .call("PUT", "/v1/secrets/KEY_0", &member, put_body("w"))
        .await;
    assert_eq!(replace.0, StatusCode::OK);
    let other = t
        .call("PUT", "/v1/secrets/ONE_MORE", &t.admin(), put_body("v"))
        .await;
    assert_eq!(
        other.0,
        StatusCode::CREATED,
        "another tenant has its own room"
    );
}

#[tokio::test]
async fn a_create_body_that_is_no_object_is_described_not_quoted() {
    let t = TestRelay::start().await;
    let secret = json!({"name": "KEY", "hosts": ["a.test"], "value": VALUE});
    for body in [
        json!([{"network": "allowlist", "secrets": [secret]}]),
        json!(VALUE),
    ] {
        let got = t
            .call("POST", "/v1/sandboxes", &t.admin(), Some(body))
            .await;
        assert_error(
            &got,
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            &["must be a JSON object"],
        );
        assert!(!got.1.to_string().contains(VALUE), "{}", got.1);
    }
}
