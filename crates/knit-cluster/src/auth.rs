//! Who is asking (authentication result) and what they may do
//! (authorization): admins everything; bootstrappers create and read their
//! own CSRs; a node only its own Node and Lease and its own CSRs.

use crate::error::ApiStatus;
use crate::resources::ResourceDef;

pub const MASTERS: &str = "system:masters";
pub const NODES: &str = "system:nodes";
pub const NODE_PREFIX: &str = "system:node:";
pub const ANONYMOUS: &str = "system:anonymous";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

impl Identity {
    pub fn anonymous() -> Identity {
        Identity {
            user: ANONYMOUS.into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
    pub fn is_anonymous(&self) -> bool {
        self.user == ANONYMOUS
    }
    pub fn is_admin(&self) -> bool {
        self.groups.iter().any(|g| g == MASTERS)
    }
    pub fn node_name(&self) -> Option<&str> {
        self.user
            .strip_prefix(NODE_PREFIX)
            .filter(|_| self.groups.iter().any(|g| g == NODES))
    }
    pub fn is_bootstrapper(&self) -> bool {
        self.groups
            .iter()
            .any(|g| g == crate::tokens::BOOTSTRAPPERS)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
    Create,
    Update,
    Patch,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
        }
    }
    fn reads(self) -> bool {
        matches!(self, Verb::Get | Verb::List | Verb::Watch)
    }
    fn collection(self) -> bool {
        matches!(self, Verb::List | Verb::Watch)
    }
}

/// Which objects of an allowed request the caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    All,
    /// Only the object with this name.
    Named(String),
    /// Only CSRs whose `spec.username` is this user.
    OwnCsrs(String),
    /// Only pods bound to this node (`spec.nodeName`), as the Node
    /// authorizer and NodeRestriction allow a kubelet.
    BoundPods(String),
}

pub struct Request<'a> {
    pub verb: Verb,
    pub def: &'a ResourceDef,
    pub namespace: Option<&'a str>,
    /// Target name (for create: the name in the body).
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

pub fn authorize(id: &Identity, req: &Request<'_>) -> Result<Scope, ApiStatus> {
    if id.is_admin() {
        return Ok(Scope::All);
    }
    let plural = req.def.plural;
    if id.is_anonymous() {
        // kubeadm-style discovery reads cluster-info before it has credentials.
        if plural == "configmaps"
            && req.verb == Verb::Get
            && req.namespace == Some("kube-public")
            && req.name == Some("cluster-info")
        {
            return Ok(Scope::All);
        }
        return Err(ApiStatus::unauthorized(
            "Unauthorized: no credentials (client certificate or bearer token) presented",
        ));
    }
    let deny = |why: &str| {
        let what = match req.subresource {
            Some(s) => format!("{plural}/{s}"),
            None => plural.to_string(),
        };
        let scope = match req.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".into(),
        };
        let name = req.name.map(|n| format!(" \"{n}\"")).unwrap_or_default();
        ApiStatus::forbidden(format!(
            "{plural}{name} is forbidden: User \"{}\" cannot {} resource \"{what}\" in API group \"{}\" {scope}: {why}",
            id.user,
            req.verb.as_str(),
            req.def.group
        ))
    };
    let csr = plural == "certificatesigningrequests";
    if csr && (id.is_bootstrapper() || id.node_name().is_some()) {
        return match (req.verb, req.subresource) {
            (Verb::Create, None) => Ok(Scope::All),
            (v, None) if v.reads() => Ok(Scope::OwnCsrs(id.user.clone())),
            _ => Err(deny(
                "may only create and read its own certificate signing requests",
            )),
        };
    }
    if let Some(node) = id.node_name() {
        if plural == "pods" {
            // A kubelet reads the pods bound to it, reports their status
            // and deletes them once they are finished; it creates none
            // (mirror pods are not supported) and evicts none.
            return match (req.verb, req.subresource) {
                (Verb::Get | Verb::List | Verb::Watch, None | Some("status"))
                | (Verb::Update | Verb::Patch, Some("status"))
                | (Verb::Delete, None) => Ok(Scope::BoundPods(node.to_string())),
                _ => Err(deny(&format!(
                    "node \"{node}\" may only read pods bound to it, update their status and delete them"
                ))),
            };
        }
        let own_object = match plural {
            "nodes" => req.verb != Verb::Delete,
            "leases" => {
                req.namespace == Some(crate::store::NODE_LEASE_NAMESPACE)
                    && req.subresource.is_none()
            }
            _ => false,
        };
        if !own_object {
            return Err(deny("a node may only access its own Node and Lease"));
        }
        if req.verb.collection() {
            return Ok(Scope::Named(node.to_string()));
        }
        if req.name != Some(node) {
            return Err(deny(&format!(
                "node \"{node}\" may only access its own object"
            )));
        }
        return Ok(Scope::All);
    }
    if id.is_bootstrapper() {
        return Err(deny(
            "bootstrap tokens may only create and read certificate signing requests",
        ));
    }
    Err(deny("no rule allows it"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::find;

    fn node(n: &str) -> Identity {
        Identity {
            user: format!("system:node:{n}"),
            groups: vec![NODES.into()],
        }
    }

    fn req<'a>(
        verb: Verb,
        plural: &str,
        ns: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Request<'a> {
        let def = crate::resources::RESOURCES
            .iter()
            .find(|r| r.plural == plural)
            .unwrap();
        Request {
            verb,
            def,
            namespace: ns,
            name,
            subresource: None,
        }
    }

    #[test]
    fn nodes_touch_only_their_own_objects() {
        let n1 = node("n1");
        assert_eq!(
            authorize(&n1, &req(Verb::Patch, "nodes", None, Some("n1"))).unwrap(),
            Scope::All
        );
        assert_eq!(
            authorize(&n1, &req(Verb::Patch, "nodes", None, Some("n2")))
                .unwrap_err()
                .code,
            403
        );
        assert_eq!(
            authorize(&n1, &req(Verb::Delete, "nodes", None, Some("n1")))
                .unwrap_err()
                .code,
            403
        );
        assert_eq!(
            authorize(&n1, &req(Verb::List, "nodes", None, None)).unwrap(),
            Scope::Named("n1".into())
        );
        assert!(authorize(
            &n1,
            &req(Verb::Update, "leases", Some("kube-node-lease"), Some("n1"))
        )
        .is_ok());
        assert!(authorize(
            &n1,
            &req(Verb::Update, "leases", Some("default"), Some("n1"))
        )
        .is_err());
        assert!(authorize(
            &n1,
            &req(Verb::Get, "secrets", Some("kube-system"), Some("x"))
        )
        .is_err());
        assert!(find("", "v1", "nodes").is_some());
        assert_eq!(
            authorize(&n1, &req(Verb::List, "pods", None, None)).unwrap(),
            Scope::BoundPods("n1".into())
        );
        assert!(authorize(&n1, &req(Verb::Create, "pods", Some("default"), Some("p"))).is_err());
        assert!(authorize(&n1, &req(Verb::Update, "pods", Some("default"), Some("p"))).is_err());
        let mut status = req(Verb::Patch, "pods", Some("default"), Some("p"));
        status.subresource = Some("status");
        assert!(authorize(&n1, &status).is_ok());
        let mut evict = req(Verb::Create, "pods", Some("default"), Some("p"));
        evict.subresource = Some("eviction");
        assert!(authorize(&n1, &evict).is_err());
    }

    #[test]
    fn bootstrappers_only_create_and_read_csrs() {
        let b = Identity {
            user: "system:bootstrap:abcdef".into(),
            groups: vec!["system:bootstrappers".into()],
        };
        assert_eq!(
            authorize(
                &b,
                &req(Verb::Create, "certificatesigningrequests", None, Some("c"))
            )
            .unwrap(),
            Scope::All
        );
        assert_eq!(
            authorize(
                &b,
                &req(Verb::Get, "certificatesigningrequests", None, Some("c"))
            )
            .unwrap(),
            Scope::OwnCsrs(b.user.clone())
        );
        assert_eq!(
            authorize(
                &b,
                &req(Verb::Delete, "certificatesigningrequests", None, Some("c"))
            )
            .unwrap_err()
            .code,
            403
        );
        assert_eq!(
            authorize(&b, &req(Verb::Get, "nodes", None, Some("n")))
                .unwrap_err()
                .code,
            403
        );
        let anon = Identity::anonymous();
        assert_eq!(
            authorize(&anon, &req(Verb::Get, "nodes", None, Some("n")))
                .unwrap_err()
                .code,
            401
        );
        assert!(authorize(
            &anon,
            &req(
                Verb::Get,
                "configmaps",
                Some("kube-public"),
                Some("cluster-info")
            )
        )
        .is_ok());
    }
}
