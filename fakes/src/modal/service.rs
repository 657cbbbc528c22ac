//! The fake's `ModalClient` RPCs.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response as GrpcResponse, Status};

use super::images::JoinStream;
use super::lifecycle::task_id;
use super::pb::generic_result::GenericStatus;
use super::pb::modal_client_server::ModalClient;
use super::pb::*;
use super::{result, Modal};
use crate::sandboxes::random_id;

/// Base62, for ids.
pub(super) const BASE62: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// The image builder version environments report.
const IMAGE_BUILDER_VERSION: &str = "2025.06";
/// How long an auth token lives.
const AUTH_TOKEN_LIFE: Duration = Duration::from_secs(3600);
/// The pause between two looks at a sandbox in `SandboxWait`.
const WAIT_POLL: Duration = Duration::from_millis(50);
/// The longest `SandboxWait` or `SandboxGetTunnels` long-poll served.
const MAX_LONG_POLL: Duration = Duration::from_secs(55);

/// The service, sharing the fake's state.
pub(super) struct Service(pub Arc<Modal>);

impl Service {
    /// Injected failures, then authentication, for `method`.
    fn check(&self, metadata: &MetadataMap, method: &str) -> Result<(), Status> {
        let fake = &self.0;
        if let Some(fault) = fake
            .faults
            .take(&format!("/modal.client.ModalClient/{method}"))
        {
            let message = format!("injected failure {}", fault.status);
            return Err(match fault.status {
                429 => Status::resource_exhausted(message),
                502..=504 => Status::unavailable(message),
                401 => Status::unauthenticated(message),
                404 => Status::not_found(message),
                _ => Status::internal(message),
            });
        }
        let header = |name: &str| {
            metadata
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
        };
        if header("x-modal-token-id") != fake.config.token_id
            || header("x-modal-token-secret") != fake.config.token_secret
        {
            return Err(Status::unauthenticated(
                "Token ID or secret is invalid. Please check your Modal token.",
            ));
        }
        // The Go SDK sends the auth token on every call, the Python SDK only to the input
        // plane: one that is sent must be one we issued.
        let auth = header("x-modal-auth-token");
        if !auth.is_empty() && !fake.auth_tokens.lock().expect("auth tokens").contains(auth) {
            return Err(Status::unauthenticated(
                "invalid auth token; call AuthTokenGet again",
            ));
        }
        Ok(())
    }
}

pub(super) fn long_poll(timeout: f32) -> Duration {
    Duration::from_secs_f32(timeout.clamp(0.0, MAX_LONG_POLL.as_secs_f32()))
}

#[tonic::async_trait]
impl ModalClient for Service {
    async fn auth_token_get(
        &self,
        req: Request<AuthTokenGetRequest>,
    ) -> Result<GrpcResponse<AuthTokenGetResponse>, Status> {
        self.check(req.metadata(), "AuthTokenGet")?;
        let b64 = |s: String| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let exp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            + AUTH_TOKEN_LIFE;
        let token = format!(
            "{}.{}.{}",
            b64(r#"{"alg":"none","typ":"JWT"}"#.into()),
            b64(format!(
                r#"{{"exp":{},"jti":"{}"}}"#,
                exp.as_secs(),
                random_id(12, BASE62)
            )),
            random_id(16, BASE62)
        );
        self.0
            .auth_tokens
            .lock()
            .expect("auth tokens")
            .insert(token.clone());
        Ok(GrpcResponse::new(AuthTokenGetResponse { token }))
    }

    async fn app_get_or_create(
        &self,
        req: Request<AppGetOrCreateRequest>,
    ) -> Result<GrpcResponse<AppGetOrCreateResponse>, Status> {
        self.check(req.metadata(), "AppGetOrCreate")?;
        let req = req.into_inner();
        let mut apps = self.0.apps.lock().expect("apps");
        let app_id = match apps.get(&req.app_name) {
            Some(id) => id.clone(),
            None if req.object_creation_type == ObjectCreationType::CreateIfMissing as i32 => {
                let id = format!("ap-{}", random_id(22, BASE62));
                apps.insert(req.app_name.clone(), id.clone());
                id
            }
            None => {
                return Err(Status::not_found(format!(
                    "App '{}' not found",
                    req.app_name
                )))
            }
        };
        Ok(GrpcResponse::new(AppGetOrCreateResponse { app_id }))
    }

    async fn image_get_or_create(
        &self,
        req: Request<ImageGetOrCreateRequest>,
    ) -> Result<GrpcResponse<ImageGetOrCreateResponse>, Status> {
        self.check(req.metadata(), "ImageGetOrCreate")?;
        self.image_get_or_create_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    type ImageJoinStreamingStream = JoinStream;

    async fn image_join_streaming(
        &self,
        req: Request<ImageJoinStreamingRequest>,
    ) -> Result<GrpcResponse<Self::ImageJoinStreamingStream>, Status> {
        self.check(req.metadata(), "ImageJoinStreaming")?;
        self.image_join(req.into_inner()).map(GrpcResponse::new)
    }

    async fn image_get_by_tag(
        &self,
        req: Request<ImageGetByTagRequest>,
    ) -> Result<GrpcResponse<ImageGetByTagResponse>, Status> {
        self.check(req.metadata(), "ImageGetByTag")?;
        self.image_get_by_tag_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn image_publish(
        &self,
        req: Request<ImagePublishRequest>,
    ) -> Result<GrpcResponse<ImagePublishResponse>, Status> {
        self.check(req.metadata(), "ImagePublish")?;
        self.image_publish_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn sandbox_create(
        &self,
        req: Request<SandboxCreateRequest>,
    ) -> Result<GrpcResponse<SandboxCreateResponse>, Status> {
        self.check(req.metadata(), "SandboxCreate")?;
        let req = req.into_inner();
        let secret_ids = req
            .definition
            .as_ref()
            .map(|d| d.secret_ids.clone())
            .unwrap_or_default();
        let env = self.secret_env(&secret_ids)?;
        let sandbox_id = self
            .create(req.app_id, req.definition, req.tags, env)
            .await?;
        Ok(GrpcResponse::new(SandboxCreateResponse { sandbox_id }))
    }

    async fn sandbox_create_v2(
        &self,
        req: Request<SandboxCreateV2Request>,
    ) -> Result<GrpcResponse<SandboxCreateV2Response>, Status> {
        self.check(req.metadata(), "SandboxCreateV2")?;
        let req = req.into_inner();
        // V2 takes Secrets by id in the definition or in `secret_sources`, env inline in
        // `secret_sources` or `ephemeral_secrets`; later ones win.
        let mut env = self.secret_env(
            &req.definition
                .as_ref()
                .map(|d| d.secret_ids.clone())
                .unwrap_or_default(),
        )?;
        env.extend(
            req.ephemeral_secrets
                .map(|m| m.contents)
                .unwrap_or_default(),
        );
        for source in req.secret_sources {
            match source.source {
                Some(secret_source::Source::SecretId(id)) => env.extend(self.secret_env(&[id])?),
                Some(secret_source::Source::Env(map)) => env.extend(map.contents),
                None => return Err(Status::invalid_argument("empty secret source")),
            }
        }
        let sandbox_id = self
            .create(req.app_id, req.definition, req.tags, env)
            .await?;
        let tunnels = self
            .0
            .table
            .lock()
            .expect("sandbox table")
            .get(&sandbox_id)
            .map(|s| s.tunnels.iter().map(|(t, _)| t.clone()).collect())
            .unwrap_or_default();
        Ok(GrpcResponse::new(SandboxCreateV2Response {
            task_id: task_id(&sandbox_id),
            sandbox_id,
            tunnels,
            sandbox_token: random_id(32, BASE62),
        }))
    }

    async fn sandbox_get_task_id(
        &self,
        req: Request<SandboxGetTaskIdRequest>,
    ) -> Result<GrpcResponse<SandboxGetTaskIdResponse>, Status> {
        self.check(req.metadata(), "SandboxGetTaskId")?;
        self.task(&req.into_inner().sandbox_id)
            .map(GrpcResponse::new)
    }

    async fn sandbox_get_task_id_v2(
        &self,
        req: Request<SandboxGetTaskIdRequest>,
    ) -> Result<GrpcResponse<SandboxGetTaskIdResponse>, Status> {
        self.check(req.metadata(), "SandboxGetTaskIdV2")?;
        self.task(&req.into_inner().sandbox_id)
            .map(GrpcResponse::new)
    }

    async fn sandbox_wait_v2(
        &self,
        req: Request<SandboxWaitRequest>,
    ) -> Result<GrpcResponse<SandboxWaitResponse>, Status> {
        self.sandbox_wait(req).await
    }

    async fn sandbox_terminate_v2(
        &self,
        req: Request<SandboxTerminateRequest>,
    ) -> Result<GrpcResponse<SandboxTerminateResponse>, Status> {
        self.sandbox_terminate(req).await
    }

    async fn sandbox_list_v2(
        &self,
        req: Request<SandboxListRequest>,
    ) -> Result<GrpcResponse<SandboxListResponse>, Status> {
        self.sandbox_list(req).await
    }

    async fn sandbox_get_tunnels_v2(
        &self,
        req: Request<SandboxGetTunnelsRequest>,
    ) -> Result<GrpcResponse<SandboxGetTunnelsResponse>, Status> {
        self.sandbox_get_tunnels(req).await
    }

    async fn sandbox_get_tunnels(
        &self,
        req: Request<SandboxGetTunnelsRequest>,
    ) -> Result<GrpcResponse<SandboxGetTunnelsResponse>, Status> {
        self.check(req.metadata(), "SandboxGetTunnels")?;
        let req = req.into_inner();
        let table = self.0.table.lock().expect("sandbox table");
        let s = table
            .get(&req.sandbox_id)
            .ok_or_else(|| Status::not_found(format!("Sandbox {} not found", req.sandbox_id)))?;
        Ok(GrpcResponse::new(SandboxGetTunnelsResponse {
            result: s.result.clone(),
            tunnels: s.tunnels.iter().map(|(t, _)| t.clone()).collect(),
        }))
    }

    async fn sandbox_wait(
        &self,
        req: Request<SandboxWaitRequest>,
    ) -> Result<GrpcResponse<SandboxWaitResponse>, Status> {
        self.check(req.metadata(), "SandboxWait")?;
        let req = req.into_inner();
        let deadline = tokio::time::Instant::now() + long_poll(req.timeout);
        loop {
            let result = {
                let table = self.0.table.lock().expect("sandbox table");
                let s = table.get(&req.sandbox_id).ok_or_else(|| {
                    Status::not_found(format!("Sandbox {} not found", req.sandbox_id))
                })?;
                s.result.clone()
            };
            if result.is_some() || tokio::time::Instant::now() >= deadline {
                return Ok(GrpcResponse::new(SandboxWaitResponse { result }));
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    async fn sandbox_terminate(
        &self,
        req: Request<SandboxTerminateRequest>,
    ) -> Result<GrpcResponse<SandboxTerminateResponse>, Status> {
        self.check(req.metadata(), "SandboxTerminate")?;
        let id = req.into_inner().sandbox_id;
        let existing = {
            let table = self.0.table.lock().expect("sandbox table");
            table
                .get(&id)
                .ok_or_else(|| Status::not_found(format!("Sandbox {id} not found")))?
                .result
                .clone()
        };
        self.0
            .finish(
                &id,
                result(GenericStatus::Terminated, 0, "Sandbox terminated"),
            )
            .await;
        Ok(GrpcResponse::new(SandboxTerminateResponse {
            existing_result: existing,
        }))
    }

    async fn sandbox_list(
        &self,
        req: Request<SandboxListRequest>,
    ) -> Result<GrpcResponse<SandboxListResponse>, Status> {
        self.check(req.metadata(), "SandboxList")?;
        let req = req.into_inner();
        let table = self.0.table.lock().expect("sandbox table");
        let mut sandboxes: Vec<SandboxInfo> = table
            .iter()
            .filter(|(_, s)| req.app_id.is_empty() || s.app_id == req.app_id)
            .filter(|(_, s)| req.include_finished || s.result.is_none())
            .filter(|(_, s)| {
                req.tags
                    .iter()
                    .all(|t| s.tags.get(&t.tag_name) == Some(&t.tag_value))
            })
            .map(|(id, s)| SandboxInfo {
                id: id.clone(),
                created_at: s
                    .created_at
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64(),
                app_id: s.app_id.clone(),
                tags: s
                    .tags
                    .iter()
                    .map(|(k, v)| SandboxTag {
                        tag_name: k.clone(),
                        tag_value: v.clone(),
                    })
                    .collect(),
                name: s.name.clone().unwrap_or_default(),
                image_id: s.image_id.clone(),
                timeout_secs: s.timeout_secs,
                tunnels: s.tunnels.iter().map(|(t, _)| t.clone()).collect(),
            })
            .filter(|info| req.before_timestamp <= 0.0 || info.created_at < req.before_timestamp)
            .collect();
        // Newest first, a page at a time: the client asks for the next one with the last
        // one's `created_at` as `before_timestamp`.
        sandboxes.sort_by(|a, b| b.created_at.total_cmp(&a.created_at));
        sandboxes.truncate(self.0.config.page_size.max(1));
        Ok(GrpcResponse::new(SandboxListResponse { sandboxes }))
    }

    async fn environment_get_or_create(
        &self,
        req: Request<EnvironmentGetOrCreateRequest>,
    ) -> Result<GrpcResponse<EnvironmentGetOrCreateResponse>, Status> {
        self.check(req.metadata(), "EnvironmentGetOrCreate")?;
        let name = req.into_inner().deployment_name;
        let name = if name.is_empty() {
            "main".to_string()
        } else {
            name
        };
        Ok(GrpcResponse::new(EnvironmentGetOrCreateResponse {
            environment_id: "en-fake".into(),
            metadata: Some(EnvironmentMetadata {
                name,
                settings: Some(EnvironmentSettings {
                    image_builder_version: IMAGE_BUILDER_VERSION.into(),
                }),
            }),
        }))
    }

    async fn secret_get_or_create(
        &self,
        req: Request<SecretGetOrCreateRequest>,
    ) -> Result<GrpcResponse<SecretGetOrCreateResponse>, Status> {
        self.check(req.metadata(), "SecretGetOrCreate")?;
        self.secret_get_or_create_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn blob_create(
        &self,
        req: Request<BlobCreateRequest>,
    ) -> Result<GrpcResponse<BlobCreateResponse>, Status> {
        self.check(req.metadata(), "BlobCreate")?;
        let origin = super::blobs::origin(&req);
        self.blob_create_in(&origin, req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn blob_get(
        &self,
        req: Request<BlobGetRequest>,
    ) -> Result<GrpcResponse<BlobGetResponse>, Status> {
        self.check(req.metadata(), "BlobGet")?;
        let origin = super::blobs::origin(&req);
        self.blob_get_in(&origin, req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn mount_batched_check_existence(
        &self,
        req: Request<MountBatchedCheckExistenceRequest>,
    ) -> Result<GrpcResponse<MountBatchedCheckExistenceResponse>, Status> {
        self.check(req.metadata(), "MountBatchedCheckExistence")?;
        self.mount_check_in(req.into_inner()).map(GrpcResponse::new)
    }

    async fn mount_put_file(
        &self,
        req: Request<MountPutFileRequest>,
    ) -> Result<GrpcResponse<MountPutFileResponse>, Status> {
        self.check(req.metadata(), "MountPutFile")?;
        self.mount_put_file_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn mount_get_or_create(
        &self,
        req: Request<MountGetOrCreateRequest>,
    ) -> Result<GrpcResponse<MountGetOrCreateResponse>, Status> {
        self.check(req.metadata(), "MountGetOrCreate")?;
        self.mount_get_or_create_in(req.into_inner())
            .map(GrpcResponse::new)
    }

    async fn sandbox_get_from_name(
        &self,
        req: Request<SandboxGetFromNameRequest>,
    ) -> Result<GrpcResponse<SandboxGetFromNameResponse>, Status> {
        self.check(req.metadata(), "SandboxGetFromName")?;
        let req = req.into_inner();
        let app_id = self
            .0
            .apps
            .lock()
            .expect("apps")
            .get(&req.app_name)
            .cloned();
        let table = self.0.table.lock().expect("sandbox table");
        let found = table.iter().find(|(_, s)| {
            s.result.is_none()
                && Some(&s.app_id) == app_id.as_ref()
                && s.name.as_deref() == Some(req.sandbox_name.as_str())
        });
        match found {
            Some((id, _)) => Ok(GrpcResponse::new(SandboxGetFromNameResponse {
                sandbox_id: id.clone(),
            })),
            None => Err(Status::not_found(format!(
                "Sandbox with name '{}' not found",
                req.sandbox_name
            ))),
        }
    }
}
