//! The typed calls of the knit API: one method per route the CLI uses,
//! each answering the view the server sends (`knit_api::views`).

use crate::error::{ClientError, Result};
use crate::{segment, Client};
use knit_api::views::{
    ApiTokenView, AttachRequest, AttachResponse, AttachScriptRequest, AttachScriptResponse, DryRun,
    EventView, InstanceView, Items, JoinTokenView, NodeRemoving, NodeView, PoolDeleting,
    PoolRevisionView, PoolView, PoolWriteQuery, RolloutUndoRequest, ScaleRequest,
    SnapshotBuildRequest, SnapshotBuildStatus, SnapshotBuildView, SnapshotDeleted, SnapshotView,
    TokenCreateRequest, TokenCreated, TokenRevoked,
};
use knit_api::Cluster;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// A view and the document it was read from, as the server sent it (what
/// `-o json|yaml` prints, unchanged).
#[derive(Debug, Clone)]
pub struct Document<T> {
    pub view: T,
    pub raw: Value,
}

impl<T: DeserializeOwned> Document<T> {
    fn read(raw: Value, what: &str) -> Result<Document<T>> {
        let view = serde_json::from_value(raw.clone()).map_err(|e| {
            ClientError::Decode(format!(
                "the answer to {what} is not the document expected: {e}"
            ))
        })?;
        Ok(Document { view, raw })
    }
}

/// A list answer's items, each with its document.
fn items<T: DeserializeOwned>(raw: Value, what: &str) -> Result<Vec<Document<T>>> {
    let list: Items<Value> = serde_json::from_value(raw)
        .map_err(|e| ClientError::Decode(format!("the answer to {what} is not a list: {e}")))?;
    list.items
        .into_iter()
        .map(|item| Document::read(item, what))
        .collect()
}

fn json_body(what: &str, body: &impl Serialize) -> Result<String> {
    serde_json::to_string(body).map_err(|e| ClientError::Decode(format!("{what}: {e}")))
}

impl Client {
    fn typed<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> Result<T> {
        self.call_typed(method, path, body)
    }

    /// `GET /api/v1/cluster`.
    pub fn cluster(&self) -> Result<Document<Cluster>> {
        Document::read(self.get("/api/v1/cluster")?, "/api/v1/cluster")
    }

    /// `PUT /api/v1/cluster` with a Cluster document (YAML or JSON).
    pub fn apply_cluster(&self, document: &str) -> Result<Cluster> {
        self.typed("PUT", "/api/v1/cluster", Some(document))
    }

    pub fn list_pools(&self) -> Result<Vec<Document<PoolView>>> {
        items(self.get("/api/v1/pools")?, "/api/v1/pools")
    }

    pub fn get_pool(&self, name: &str) -> Result<Document<PoolView>> {
        let path = format!("/api/v1/pools/{}", segment(name));
        Document::read(self.get(&path)?, &path)
    }

    /// `POST /api/v1/pools`: a new pool from a NodePool document.
    pub fn create_pool(&self, document: &str, strict: bool) -> Result<PoolView> {
        self.typed(
            "POST",
            &format!("/api/v1/pools?strict={strict}"),
            Some(document),
        )
    }

    /// `PUT /api/v1/pools/{name}`: create or update a pool.
    pub fn apply_pool(&self, name: &str, document: &str, strict: bool) -> Result<PoolView> {
        let path = format!("/api/v1/pools/{}?strict={strict}", segment(name));
        self.typed("PUT", &path, Some(document))
    }

    /// A pool write with every query option: `name` given, `PUT` (create
    /// or update, `knit apply`), else `POST` (create); `?dryRun=All`
    /// answers what the write would store and stores nothing.
    pub fn write_pool(
        &self,
        name: Option<&str>,
        document: &str,
        query: PoolWriteQuery,
    ) -> Result<PoolView> {
        let mut q = format!("strict={}", query.strict);
        if query.dry_run == Some(DryRun::All) {
            q.push_str("&dryRun=All");
        }
        match name {
            Some(name) => {
                let path = format!("/api/v1/pools/{}?{q}", segment(name));
                self.typed("PUT", &path, Some(document))
            }
            None => self.typed("POST", &format!("/api/v1/pools?{q}"), Some(document)),
        }
    }

    pub fn scale_pool(&self, name: &str, request: &ScaleRequest) -> Result<PoolView> {
        let path = format!("/api/v1/pools/{}/scale", segment(name));
        self.typed("POST", &path, Some(&json_body("scale", request)?))
    }

    /// `POST /api/v1/pools/{name}/rollout/{verb}`: pause, resume or restart.
    pub fn rollout_pool(&self, name: &str, verb: &str) -> Result<PoolView> {
        let path = format!("/api/v1/pools/{}/rollout/{}", segment(name), segment(verb));
        self.typed("POST", &path, Some(""))
    }

    /// `POST /api/v1/pools/{name}/rollout/undo`.
    pub fn undo_pool(&self, name: &str, request: &RolloutUndoRequest) -> Result<PoolView> {
        let path = format!("/api/v1/pools/{}/rollout/undo", segment(name));
        self.typed("POST", &path, Some(&json_body("rollout undo", request)?))
    }

    /// `GET /api/v1/pools/{name}/revisions`.
    pub fn pool_revisions(&self, name: &str) -> Result<Vec<Document<PoolRevisionView>>> {
        let path = format!("/api/v1/pools/{}/revisions", segment(name));
        items(self.get(&path)?, &path)
    }

    pub fn delete_pool(&self, name: &str) -> Result<PoolDeleting> {
        self.typed("DELETE", &format!("/api/v1/pools/{}", segment(name)), None)
    }

    pub fn list_instances(&self) -> Result<Vec<Document<InstanceView>>> {
        items(self.get("/api/v1/instances")?, "/api/v1/instances")
    }

    pub fn list_nodes(&self) -> Result<Vec<Document<NodeView>>> {
        items(self.get("/api/v1/nodes")?, "/api/v1/nodes")
    }

    /// One node with its phase timeline and caches.
    pub fn get_node(&self, name: &str) -> Result<Document<NodeView>> {
        let path = format!("/api/v1/nodes/{}", segment(name));
        Document::read(self.get(&path)?, &path)
    }

    /// `DELETE /api/v1/nodes/{name}`; `release` absent: the server's default.
    pub fn delete_node(&self, name: &str, release: Option<bool>) -> Result<NodeRemoving> {
        let path = match release {
            Some(r) => format!("/api/v1/nodes/{}?release={r}", segment(name)),
            None => format!("/api/v1/nodes/{}", segment(name)),
        };
        self.typed("DELETE", &path, None)
    }

    /// One of a node's logs, as text.
    pub fn node_log(&self, name: &str, file: &str) -> Result<String> {
        self.get_text(&format!(
            "/api/v1/nodes/{}/logs?file={}",
            segment(name),
            segment(file)
        ))
    }

    /// The last events, oldest first (`limit`: the server's default when absent).
    pub fn events(&self, limit: Option<u32>) -> Result<Vec<Document<EventView>>> {
        let path = match limit {
            Some(l) => format!("/api/v1/events?limit={l}"),
            None => "/api/v1/events".to_string(),
        };
        items(self.get(&path)?, &path)
    }

    pub fn join_tokens(&self) -> Result<Vec<Document<JoinTokenView>>> {
        items(self.get("/api/v1/jointokens")?, "/api/v1/jointokens")
    }

    pub fn list_snapshots(&self) -> Result<Vec<Document<SnapshotView>>> {
        items(self.get("/api/v1/snapshots")?, "/api/v1/snapshots")
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<SnapshotDeleted> {
        self.typed(
            "DELETE",
            &format!("/api/v1/snapshots/{}", segment(id)),
            None,
        )
    }

    /// Starts a snapshot build.
    pub fn build_snapshot(&self, request: &SnapshotBuildRequest) -> Result<SnapshotBuildStatus> {
        let body = json_body("snapshot build", request)?;
        self.typed("POST", "/api/v1/snapshots", Some(&body))
    }

    pub fn snapshot_builds(&self) -> Result<Vec<Document<SnapshotBuildView>>> {
        items(
            self.get("/api/v1/snapshot-builds")?,
            "/api/v1/snapshot-builds",
        )
    }

    /// One build with its steps.
    pub fn snapshot_build(&self, id: &str) -> Result<Document<SnapshotBuildStatus>> {
        let path = format!("/api/v1/snapshot-builds/{}", segment(id));
        Document::read(self.get(&path)?, &path)
    }

    /// Adds existing instances to a pool (automatic mode).
    pub fn attach(&self, pool: &str, request: &AttachRequest) -> Result<Document<AttachResponse>> {
        let path = format!("/api/v1/pools/{}/attach", segment(pool));
        let body = json_body("attach", request)?;
        Document::read(self.call("POST", &path, Some(&body))?, &path)
    }

    /// The command that adds one machine to a pool (manual mode).
    pub fn attach_script(
        &self,
        pool: &str,
        request: &AttachScriptRequest,
    ) -> Result<Document<AttachScriptResponse>> {
        let path = format!("/api/v1/pools/{}/attach-script", segment(pool));
        let body = json_body("attach-script", request)?;
        Document::read(self.call("POST", &path, Some(&body))?, &path)
    }

    /// `GET /api/v1/tokens`: the API tokens (never their secrets).
    pub fn list_tokens(&self) -> Result<Vec<Document<ApiTokenView>>> {
        items(self.get("/api/v1/tokens")?, "/api/v1/tokens")
    }

    /// `POST /api/v1/tokens`: a new token; the answer holds its secret,
    /// which the server never shows again.
    pub fn create_token(&self, request: &TokenCreateRequest) -> Result<TokenCreated> {
        let body = json_body("token", request)?;
        self.typed("POST", "/api/v1/tokens", Some(&body))
    }

    /// `DELETE /api/v1/tokens/{id}`.
    pub fn revoke_token(&self, id: &str) -> Result<TokenRevoked> {
        self.typed("DELETE", &format!("/api/v1/tokens/{}", segment(id)), None)
    }

    /// Whether the server answers `GET /healthz` with 200.
    pub fn healthy(&self) -> bool {
        matches!(self.raw("GET", "/healthz", None), Ok((200, _)))
    }
}
