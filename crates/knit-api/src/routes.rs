//! Every route of the control plane's REST API, once: method, path, who
//! may call it and what it does. The server's router adds each [`Route`]
//! with its handler and takes its access from here (`http::auth::Routes::api`),
//! the OpenAPI document is built from [`Route::ALL`], and knit-client fills
//! these paths instead of writing its own. What must stay a copy (the route
//! table in docs/control-plane.md, the attach command's script) is held to
//! this list by tests (crates/knit-api/tests/lists.rs, knit-server's
//! `attach::manual` tests).

use crate::state::TokenRole;

/// The HTTP methods the API uses (`Get` answers `HEAD` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    /// As on the wire: `GET`, `POST`, `PUT`, `DELETE`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }
}

/// What a route needs from its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: it holds no secret (health, the OpenAPI document, the
    /// package mirror and the system images every node gets).
    Public,
    /// The handler checks its own per-instance token (`what` names it:
    /// join, report or attach token).
    NodeToken(&'static str),
    /// An API token of any role, or the metrics reader token.
    Metrics,
    /// An API token of this role or higher.
    Role(TokenRole),
}

impl Access {
    /// The word the OpenAPI document uses for it: none, a node token's
    /// name, metrics, or the role viewer|operator|admin.
    pub const fn word(self) -> &'static str {
        match self {
            Access::Public => "none",
            Access::NodeToken(what) => what,
            Access::Metrics => "metrics",
            Access::Role(r) => r.as_str(),
        }
    }
}

/// Declares the routes: one line each, `Name = METHOD "path", access,
/// "summary";`. Paths are in the router's form (`:name` one segment,
/// `*path` the rest).
macro_rules! routes {
    (
        $( $(#[$meta:meta])* $name:ident = $method:ident $path:literal, $access:expr, $summary:literal; )+
    ) => {
        /// One route of the API (method and path).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Route {
            $( $(#[$meta])* $name, )+
        }

        impl Route {
            /// Every route, in the order declared.
            pub const ALL: &'static [Route] = &[$(Route::$name),+];

            pub const fn method(self) -> Method {
                match self {
                    $(Route::$name => Method::$method,)+
                }
            }

            /// The path as the router matches it (`:name`, `*path`).
            pub const fn path(self) -> &'static str {
                match self {
                    $(Route::$name => $path,)+
                }
            }

            /// Who may call it.
            pub const fn access(self) -> Access {
                match self {
                    $(Route::$name => $access,)+
                }
            }

            /// What it does, as the OpenAPI document says.
            pub const fn summary(self) -> &'static str {
                match self {
                    $(Route::$name => $summary,)+
                }
            }
        }
    };
}

use Access::{Metrics, NodeToken, Public, Role};
use TokenRole::{Admin, Operator, Viewer};

// Roles as in docs/security.md: viewer reads, operator also changes,
// admin also runs commands on machines, reads their logs and manages
// credentials.
routes! {
    Healthz = Get "/healthz", Public, "Liveness";
    OpenApi = Get "/openapi.json", Public, "This document";
    Mirror = Get "/mirror/*path", Public, "Package mirror file";
    /// The system images nodes pull (read-only; HEAD too, through GET).
    RegistryBase = Get "/v2/", Public, "The system images' registry: API version check";
    RegistryObject = Get "/v2/*path", Public, "The system images' registry: manifests and blobs (read-only)";
    Bootstrap = Post "/bootstrap/v1/config", NodeToken("joinToken"), "Exchange a one-time join token for the instance's NodeConfig (YAML)";
    AttachManual = Post "/attach/v1/manual", NodeToken("attachToken"), "Redeem an attach token (the command's server-side preflight); answers a join token";
    AttachFailed = Post "/attach/v1/failed", NodeToken("reportToken"), "The attach command reports that its join failed and the machine was rolled back (body: the reason, text); the add is undone; answers the diagnosis";
    Report = Post "/report/v1/events", NodeToken("reportToken"), "Receive one agent PhaseEvent";
    Metrics = Get "/metrics", Metrics, "Prometheus metrics";
    GetCluster = Get "/api/v1/cluster", Role(Viewer), "The cluster spec";
    PutCluster = Put "/api/v1/cluster", Role(Operator), "Replace the cluster spec (YAML or JSON body)";
    ListPools = Get "/api/v1/pools", Role(Viewer), "List node pools with status";
    CreatePool = Post "/api/v1/pools", Role(Operator), "Create a node pool (YAML or JSON NodePool, or what GET answered: server-set fields ignored); 409 if it exists; ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing";
    GetPool = Get "/api/v1/pools/:name", Role(Viewer), "One node pool with status";
    ApplyPool = Put "/api/v1/pools/:name", Role(Operator), "Create or replace a node pool (apply; what GET answered is taken, server-set fields ignored); ?strict=true refuses a stale snapshot; ?dryRun=All checks everything and stores nothing";
    DeletePool = Delete "/api/v1/pools/:name", Role(Operator), "Scale a pool to 0, then remove it";
    ScalePool = Post "/api/v1/pools/:name/scale", Role(Operator), "Set the desired count: {\"replicas\": N, \"release\": true}";
    /// Before `Rollout`: `undo` is not a verb.
    RolloutUndo = Post "/api/v1/pools/:name/rollout/undo", Role(Operator), "Roll a pool back to a kept revision: {\"toRevision\": N} (absent: the one before)";
    Rollout = Post "/api/v1/pools/:name/rollout/:verb", Role(Operator), "Pause, resume or restart a pool's rollout (verb: pause|resume|restart)";
    PoolRevisions = Get "/api/v1/pools/:name/revisions", Role(Viewer), "A pool's kept revisions";
    Attach = Post "/api/v1/pools/:name/attach", Role(Operator), "Add existing instances (automatic mode): {\"instances\": [ids], \"formatDataDisk\", \"keepInstanceName\", \"password\", \"dryRun\"}; every preflight result";
    AttachScript = Post "/api/v1/pools/:name/attach-script", Role(Operator), "The command that adds one machine (manual mode): one-time attach token, CA pin, agent sha256";
    ListInstances = Get "/api/v1/instances", Role(Viewer), "List instances";
    ListNodes = Get "/api/v1/nodes", Role(Viewer), "List nodes";
    GetNode = Get "/api/v1/nodes/:name", Role(Viewer), "One node with its phase timeline";
    DeleteNode = Delete "/api/v1/nodes/:name", Role(Operator), "Remove a node from its pool (?release=false keeps the instance; one added by attach is kept unless ?release=true)";
    /// A node's logs may hold what its scripts printed (secrets too).
    NodeLogs = Get "/api/v1/nodes/:name/logs", Role(Admin), "A node's log file (?file=init|user-data|error-code|error-msg)";
    Events = Get "/api/v1/events", Role(Viewer), "Recent events (?limit=N)";
    ListSnapshots = Get "/api/v1/snapshots", Role(Viewer), "Data-disk snapshots (stale, used by)";
    BuildSnapshot = Post "/api/v1/snapshots", Role(Operator), "Build a snapshot from a pool (returns a build id)";
    DeleteSnapshot = Delete "/api/v1/snapshots/:id", Role(Operator), "Delete a snapshot (refused while a pool uses it)";
    SnapshotBuilds = Get "/api/v1/snapshot-builds", Role(Viewer), "Snapshot builds, stored (status, current step, builder, snapshot id)";
    SnapshotBuild = Get "/api/v1/snapshot-builds/:id", Role(Viewer), "One snapshot build with its steps (kept across server restarts)";
    JoinTokens = Get "/api/v1/jointokens", Role(Viewer), "Join tokens (ids and state, never the secret)";
    Servers = Get "/api/v1/servers", Role(Viewer), "The servers sharing the datastore, the leader marked";
    Exec = Post "/api/v1/exec", Role(Admin), "Run a command on a machine through its provider: {\"kind\": \"node\"|\"instance\", \"name\", \"argv\": [..], \"timeoutSeconds\"}; exit code, base64 stdout/stderr (each cut at 4 MiB); audited as an event without the output";
    /// A client certificate from knit's CA is a credential.
    AutoscalerClientCertificate = Post "/api/v1/autoscaler/client-certificate", Role(Admin), "A new client certificate and key from knit's CA for cluster-autoscaler's externalgrpc client, the CA and the service's address (knit autoscaler cloud-config)";
    ListTokens = Get "/api/v1/tokens", Role(Admin), "API tokens: id, role, description, created, expires, last used (never the secret)";
    CreateToken = Post "/api/v1/tokens", Role(Admin), "Create an API token: {\"role\": \"viewer\"|\"operator\"|\"admin\", \"ttlSeconds\", \"description\"}; answers its secret, once";
    RevokeToken = Delete "/api/v1/tokens/:id", Role(Admin), "Revoke an API token (the last live admin token is refused: LastAdminToken)";
}

impl Route {
    /// The path in OpenAPI's form (`{name}`, `{path}`).
    pub fn openapi_path(self) -> String {
        self.path()
            .split('/')
            .map(|seg| match parameter(seg) {
                Some(name) => format!("{{{name}}}"),
                None => seg.to_string(),
            })
            .collect::<Vec<_>>()
            .join("/")
    }

    /// The path up to its first parameter, without the `/` before it
    /// (`/mirror` of `/mirror/*path`): the base URL of what it serves.
    pub fn prefix(self) -> &'static str {
        let path = self.path();
        match path.find("/:").or_else(|| path.find("/*")) {
            Some(at) => &path[..at],
            None => path,
        }
    }

    /// The names of the path's parameters, in order.
    pub fn parameters(self) -> Vec<&'static str> {
        self.path().split('/').filter_map(parameter).collect()
    }

    /// The path with its parameters replaced by `values`, in order, each
    /// as given (the caller encodes them: a value holding `/` would reach
    /// another route). A missing value leaves its parameter as declared,
    /// which no route matches (404 naming the path).
    pub fn fill(self, values: &[&str]) -> String {
        let mut values = values.iter();
        self.path()
            .split('/')
            .map(|seg| match parameter(seg) {
                Some(_) => values.next().copied().unwrap_or(seg),
                None => seg,
            })
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// A path segment's parameter name (`:name` or `*path`).
fn parameter(segment: &str) -> Option<&str> {
    segment
        .strip_prefix(':')
        .or_else(|| segment.strip_prefix('*'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_api_route_needs_a_role_and_no_route_is_declared_twice() {
        let mut seen = BTreeSet::new();
        for &route in Route::ALL {
            if route.path().starts_with("/api/") {
                assert!(
                    matches!(route.access(), Access::Role(_)),
                    "{route:?} must need a role, declares {:?}",
                    route.access()
                );
            }
            assert!(
                seen.insert((route.method(), route.path())),
                "{route:?}: {} {} declared twice",
                route.method().as_str(),
                route.path()
            );
            assert!(route.path().starts_with('/'), "{route:?}");
            assert!(!route.summary().is_empty(), "{route:?} says nothing");
        }
    }

    #[test]
    fn paths_fill_and_convert() {
        assert_eq!(
            Route::ScalePool.fill(&["a%2Fb"]),
            "/api/v1/pools/a%2Fb/scale"
        );
        assert_eq!(
            Route::Rollout.fill(&["p", "pause"]),
            "/api/v1/pools/p/rollout/pause"
        );
        assert_eq!(Route::ListPools.fill(&[]), "/api/v1/pools");
        // Too few values: the parameter stays, no route answers it.
        assert_eq!(Route::Rollout.fill(&["p"]), "/api/v1/pools/p/rollout/:verb");
        assert_eq!(Route::Mirror.openapi_path(), "/mirror/{path}");
        assert_eq!(Route::Mirror.prefix(), "/mirror");
        assert_eq!(
            Route::Mirror.fill(&["pkg/kubernetes/k.tar.gz"]),
            "/mirror/pkg/kubernetes/k.tar.gz"
        );
        assert_eq!(Route::RegistryBase.prefix(), "/v2/");
        assert_eq!(Route::Report.prefix(), "/report/v1/events");
        assert_eq!(Route::Rollout.parameters(), ["name", "verb"]);
        assert_eq!(Route::Healthz.parameters(), Vec::<&str>::new());
        assert_eq!(Access::Role(TokenRole::Operator).word(), "operator");
        assert_eq!(Access::NodeToken("joinToken").word(), "joinToken");
    }
}
