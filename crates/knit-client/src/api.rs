//! The typed calls of the knit API: one method per route the CLI uses,
//! each answering the view the server sends (`knit_api::views`), at the
//! method and path `knit_api::routes` declares for it.

use crate::error::{ClientError, Result};
use crate::{segment, Client};
use knit_api::routes::Route;
use knit_api::views::{
    ApiTokenView, AttachRequest, AttachResponse, AttachScriptRequest, AttachScriptResponse, DryRun,
    EventView, InstanceView, Items, JoinTokenView, NodeRemoving, NodeView, PoolDeleting,
    PoolRevisionView, PoolView, PoolWriteQuery, RolloutUndoRequest, ScaleRequest, ServerView,
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

/// `route`'s method, and its path with `params` filled (each one
/// percent-encoded segment) and `query` after a `?` when not empty: every
/// call's method and path come from the API's one list of routes
/// (`knit_api::routes`), the one the server's router is built from.
fn at(route: Route, params: &[&str], query: &str) -> (&'static str, String) {
    let encoded: Vec<String> = params.iter().map(|p| segment(p)).collect();
    let encoded: Vec<&str> = encoded.iter().map(String::as_str).collect();
    let mut path = route.fill(&encoded);
    if !query.is_empty() {
        path.push('?');
        path.push_str(query);
    }
    (route.method().as_str(), path)
}

impl Client {
    fn typed<T: DeserializeOwned>(
        &self,
        (method, path): (&str, String),
        body: Option<&str>,
    ) -> Result<T> {
        self.call_typed(method, &path, body)
    }

    /// A call's JSON answer and the path it was asked at.
    fn document(
        &self,
        (method, path): (&str, String),
        body: Option<&str>,
    ) -> Result<(Value, String)> {
        Ok((self.call(method, &path, body)?, path))
    }

    /// `GET /api/v1/cluster`.
    pub fn cluster(&self) -> Result<Document<Cluster>> {
        let (raw, path) = self.document(at(Route::GetCluster, &[], ""), None)?;
        Document::read(raw, &path)
    }

    /// `PUT /api/v1/cluster` with a Cluster document (YAML or JSON).
    pub fn apply_cluster(&self, document: &str) -> Result<Cluster> {
        self.typed(at(Route::PutCluster, &[], ""), Some(document))
    }

    pub fn list_pools(&self) -> Result<Vec<Document<PoolView>>> {
        let (raw, path) = self.document(at(Route::ListPools, &[], ""), None)?;
        items(raw, &path)
    }

    pub fn get_pool(&self, name: &str) -> Result<Document<PoolView>> {
        let (raw, path) = self.document(at(Route::GetPool, &[name], ""), None)?;
        Document::read(raw, &path)
    }

    /// `POST /api/v1/pools`: a new pool from a NodePool document.
    pub fn create_pool(&self, document: &str, strict: bool) -> Result<PoolView> {
        let query = format!("strict={strict}");
        self.typed(at(Route::CreatePool, &[], &query), Some(document))
    }

    /// `PUT /api/v1/pools/{name}`: create or update a pool.
    pub fn apply_pool(&self, name: &str, document: &str, strict: bool) -> Result<PoolView> {
        let query = format!("strict={strict}");
        self.typed(at(Route::ApplyPool, &[name], &query), Some(document))
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
            Some(name) => self.typed(at(Route::ApplyPool, &[name], &q), Some(document)),
            None => self.typed(at(Route::CreatePool, &[], &q), Some(document)),
        }
    }

    pub fn scale_pool(&self, name: &str, request: &ScaleRequest) -> Result<PoolView> {
        let body = json_body("scale", request)?;
        self.typed(at(Route::ScalePool, &[name], ""), Some(&body))
    }

    /// `POST /api/v1/pools/{name}/rollout/{verb}`: pause, resume or restart.
    pub fn rollout_pool(&self, name: &str, verb: &str) -> Result<PoolView> {
        self.typed(at(Route::Rollout, &[name, verb], ""), Some(""))
    }

    /// `POST /api/v1/pools/{name}/rollout/undo`.
    pub fn undo_pool(&self, name: &str, request: &RolloutUndoRequest) -> Result<PoolView> {
        let body = json_body("rollout undo", request)?;
        self.typed(at(Route::RolloutUndo, &[name], ""), Some(&body))
    }

    /// `GET /api/v1/pools/{name}/revisions`.
    pub fn pool_revisions(&self, name: &str) -> Result<Vec<Document<PoolRevisionView>>> {
        let (raw, path) = self.document(at(Route::PoolRevisions, &[name], ""), None)?;
        items(raw, &path)
    }

    pub fn delete_pool(&self, name: &str) -> Result<PoolDeleting> {
        self.typed(at(Route::DeletePool, &[name], ""), None)
    }

    pub fn list_instances(&self) -> Result<Vec<Document<InstanceView>>> {
        let (raw, path) = self.document(at(Route::ListInstances, &[], ""), None)?;
        items(raw, &path)
    }

    pub fn list_nodes(&self) -> Result<Vec<Document<NodeView>>> {
        let (raw, path) = self.document(at(Route::ListNodes, &[], ""), None)?;
        items(raw, &path)
    }

    /// One node with its phase timeline and caches.
    pub fn get_node(&self, name: &str) -> Result<Document<NodeView>> {
        let (raw, path) = self.document(at(Route::GetNode, &[name], ""), None)?;
        Document::read(raw, &path)
    }

    /// `DELETE /api/v1/nodes/{name}`; `release` absent: the server's default.
    pub fn delete_node(&self, name: &str, release: Option<bool>) -> Result<NodeRemoving> {
        let query = release.map(|r| format!("release={r}")).unwrap_or_default();
        self.typed(at(Route::DeleteNode, &[name], &query), None)
    }

    /// One of a node's logs, as text.
    pub fn node_log(&self, name: &str, file: &str) -> Result<String> {
        let query = format!("file={}", segment(file));
        let (_, path) = at(Route::NodeLogs, &[name], &query);
        self.get_text(&path)
    }

    /// The last events, oldest first (`limit`: the server's default when absent).
    pub fn events(&self, limit: Option<u32>) -> Result<Vec<Document<EventView>>> {
        let query = limit.map(|l| format!("limit={l}")).unwrap_or_default();
        let (raw, path) = self.document(at(Route::Events, &[], &query), None)?;
        items(raw, &path)
    }

    pub fn join_tokens(&self) -> Result<Vec<Document<JoinTokenView>>> {
        let (raw, path) = self.document(at(Route::JoinTokens, &[], ""), None)?;
        items(raw, &path)
    }

    pub fn list_snapshots(&self) -> Result<Vec<Document<SnapshotView>>> {
        let (raw, path) = self.document(at(Route::ListSnapshots, &[], ""), None)?;
        items(raw, &path)
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<SnapshotDeleted> {
        self.typed(at(Route::DeleteSnapshot, &[id], ""), None)
    }

    /// Starts a snapshot build.
    pub fn build_snapshot(&self, request: &SnapshotBuildRequest) -> Result<SnapshotBuildStatus> {
        let body = json_body("snapshot build", request)?;
        self.typed(at(Route::BuildSnapshot, &[], ""), Some(&body))
    }

    pub fn snapshot_builds(&self) -> Result<Vec<Document<SnapshotBuildView>>> {
        let (raw, path) = self.document(at(Route::SnapshotBuilds, &[], ""), None)?;
        items(raw, &path)
    }

    /// One build with its steps.
    pub fn snapshot_build(&self, id: &str) -> Result<Document<SnapshotBuildStatus>> {
        let (raw, path) = self.document(at(Route::SnapshotBuild, &[id], ""), None)?;
        Document::read(raw, &path)
    }

    /// Adds existing instances to a pool (automatic mode).
    pub fn attach(&self, pool: &str, request: &AttachRequest) -> Result<Document<AttachResponse>> {
        let body = json_body("attach", request)?;
        let (raw, path) = self.document(at(Route::Attach, &[pool], ""), Some(&body))?;
        Document::read(raw, &path)
    }

    /// The command that adds one machine to a pool (manual mode).
    pub fn attach_script(
        &self,
        pool: &str,
        request: &AttachScriptRequest,
    ) -> Result<Document<AttachScriptResponse>> {
        let body = json_body("attach-script", request)?;
        let (raw, path) = self.document(at(Route::AttachScript, &[pool], ""), Some(&body))?;
        Document::read(raw, &path)
    }

    /// `GET /api/v1/tokens`: the API tokens (never their secrets).
    pub fn list_tokens(&self) -> Result<Vec<Document<ApiTokenView>>> {
        let (raw, path) = self.document(at(Route::ListTokens, &[], ""), None)?;
        items(raw, &path)
    }

    /// `POST /api/v1/tokens`: a new token; the answer holds its secret,
    /// which the server never shows again.
    pub fn create_token(&self, request: &TokenCreateRequest) -> Result<TokenCreated> {
        let body = json_body("token", request)?;
        self.typed(at(Route::CreateToken, &[], ""), Some(&body))
    }

    /// `DELETE /api/v1/tokens/{id}`.
    pub fn revoke_token(&self, id: &str) -> Result<TokenRevoked> {
        self.typed(at(Route::RevokeToken, &[id], ""), None)
    }

    /// The servers sharing the datastore, the leader marked.
    pub fn servers(&self) -> Result<Vec<ServerView>> {
        Ok(self
            .typed::<Items<ServerView>>(at(Route::Servers, &[], ""), None)?
            .items)
    }

    /// `POST /api/v1/autoscaler/client-certificate`: a new client
    /// certificate from knit's CA for cluster-autoscaler (as JSON).
    pub fn autoscaler_client_certificate(&self) -> Result<Value> {
        let (method, path) = at(Route::AutoscalerClientCertificate, &[], "");
        self.call(method, &path, Some("{}"))
    }

    /// Whether the server answers `GET /healthz` with 200.
    pub fn healthy(&self) -> bool {
        let (method, path) = at(Route::Healthz, &[], "");
        matches!(self.raw(method, &path, None), Ok((200, _)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parameters are percent-encoded segments: a name never reaches
    /// another route.
    #[test]
    fn calls_fill_the_declared_paths() {
        assert_eq!(
            at(Route::ScalePool, &["../evil"], ""),
            ("POST", "/api/v1/pools/..%2Fevil/scale".to_string())
        );
        assert_eq!(
            at(Route::DeleteNode, &["n"], "release=false"),
            ("DELETE", "/api/v1/nodes/n?release=false".to_string())
        );
        assert_eq!(
            at(Route::Events, &[], ""),
            ("GET", "/api/v1/events".to_string())
        );
    }
}
