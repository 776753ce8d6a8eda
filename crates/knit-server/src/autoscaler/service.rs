//! The `CloudProvider` calls, each on knit's store and pool rules. A node
//! group is an auto-scaling pool (`type: auto-scaling`, not being
//! deleted): id = pool name, min/max = `spec.scaling`, target size =
//! `spec.replicas`. An instance's id is the providerID its Node has (or
//! will have: `<region>.<instance-id>`, lowercased, as the agent gives the
//! kubelet); an instance not made yet has `knit://<instance name>`.
//!
//! Errors are gRPC statuses whose message starts with knit's stable error
//! code: `InvalidArgument` for a malformed request, `NotFound` for an
//! unknown group or node, `FailedPrecondition` for a change the group's
//! bounds or state refuse (nothing was changed), `Unavailable` when the
//! datastore is, `Unimplemented` for pricing.

// tonic's `Status` is the gRPC error every call answers with: the helpers
// return it as it is rather than boxed.
#![allow(clippy::result_large_err)]

use super::proto::externalgrpc as pb;
use super::template;
use crate::control::ControlPlane;
use crate::error::ServerError;
use crate::pool_state::counts_toward_pool;
use crate::provider_error::ProviderErrorKind;
use crate::store::{InstanceRecord, PoolRecord};
use knit_api::state::{EventType, InstanceState, IntentAction};
use pb::instance_status::InstanceState as PbState;
use prost::Message;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The id prefix of an instance that has no machine yet.
pub const PENDING_ID_PREFIX: &str = "knit://";
/// cluster-autoscaler's `cloudprovider.OutOfResourcesErrorClass`.
pub const OUT_OF_RESOURCES_CLASS: i32 = 1;
/// cluster-autoscaler's `cloudprovider.OtherErrorClass`.
pub const OTHER_ERROR_CLASS: i32 = 99;

type Answer<T> = Result<Response<T>, Status>;

/// The service, over the control plane.
pub struct Autoscaler {
    cp: Arc<ControlPlane>,
}

impl Autoscaler {
    pub fn new(cp: Arc<ControlPlane>) -> Autoscaler {
        Autoscaler { cp }
    }
}

/// A gRPC status for a knit error; the message starts with its code.
pub fn status(e: ServerError) -> Status {
    let message = format!("{}: {e}", e.code());
    match e.http_status() {
        400 | 422 => Status::invalid_argument(message),
        404 => Status::not_found(message),
        409 => Status::failed_precondition(message),
        401 | 403 => Status::permission_denied(message),
        503 | 504 => Status::unavailable(message),
        _ => Status::internal(message),
    }
}

fn refused(code: &str, message: String) -> Status {
    Status::failed_precondition(format!("{code}: {message}"))
}

fn invalid(message: String) -> Status {
    Status::invalid_argument(format!("BadRequest: {message}"))
}

/// Whether `record` is a node group: an auto-scaling pool not being deleted.
pub fn is_group(record: &PoolRecord) -> bool {
    !record.deleting
        && record.pool.spec.pool_type == "auto-scaling"
        && record.pool.spec.scaling.is_some()
}

fn node_group(record: &PoolRecord) -> pb::NodeGroup {
    let spec = &record.pool.spec;
    let (min, max) = spec
        .scaling
        .as_ref()
        .map(|s| (s.min, s.max))
        .unwrap_or((0, 0));
    pb::NodeGroup {
        id: record.pool.metadata.name.clone(),
        min_size: clamp(min),
        max_size: clamp(max),
        debug: format!(
            "knit pool {}: replicas {}, scaling [{min}, {max}], instance types {}",
            record.pool.metadata.name,
            spec.replicas,
            spec.instance_types.join(",")
        ),
    }
}

fn clamp(n: i64) -> i32 {
    n.clamp(0, i64::from(i32::MAX)) as i32
}

/// The id cluster-autoscaler knows an instance by: its Node's providerID.
pub fn instance_id(region: &str, instance: &InstanceRecord) -> String {
    match &instance.provider_id {
        Some(id) => knit_api::agent::node_id(region, id),
        None => format!("{PENDING_ID_PREFIX}{}", instance.name),
    }
}

/// A create's last error as the store keeps it: its text, and the
/// provider's kind when it was a provider's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateError {
    pub message: String,
    pub kind: Option<ProviderErrorKind>,
}

impl CreateError {
    /// Whether the cloud had no room for the instance: the provider said
    /// so by the kind of its error (ECS `OperationDenied.NoStock`, the
    /// local cloud's capacity …), never by words in the text.
    pub fn out_of_resources(&self) -> bool {
        self.kind == Some(ProviderErrorKind::Capacity)
    }
}

fn error_info(error: &CreateError) -> pb::InstanceErrorInfo {
    let capacity = error.out_of_resources();
    pb::InstanceErrorInfo {
        error_code: if capacity {
            "OutOfResources".to_string()
        } else {
            "CreateFailed".to_string()
        },
        error_message: error.message.clone(),
        instance_error_class: if capacity {
            OUT_OF_RESOURCES_CLASS
        } else {
            OTHER_ERROR_CLASS
        },
    }
}

impl Autoscaler {
    fn region(&self) -> Result<String, Status> {
        Ok(self.cp.cluster_doc().map_err(status)?.spec.region)
    }

    /// The node group `id`, or NotFound.
    fn group(&self, id: &str) -> Result<PoolRecord, Status> {
        match self.cp.store.pool(id).map_err(status)? {
            Some(record) if is_group(&record) => Ok(record),
            Some(_) => Err(Status::not_found(format!(
                "NotFound: pool {id:?} is not an auto-scaling pool (type: auto-scaling with spec.scaling)"
            ))),
            None => Err(Status::not_found(format!(
                "NotFound: no node group {id:?}: no such pool"
            ))),
        }
    }

    fn groups(&self) -> Result<Vec<PoolRecord>, Status> {
        Ok(self
            .cp
            .store
            .pools()
            .map_err(status)?
            .into_iter()
            .filter(is_group)
            .collect())
    }

    /// The instance a node names, by its providerID, else (no providerID)
    /// by its node name; `None` when knit has no such instance.
    fn instance_of(
        &self,
        region: &str,
        node: &pb::ExternalGrpcNode,
    ) -> Result<Option<InstanceRecord>, Status> {
        let instances = self.cp.store.instances(None).map_err(status)?;
        if !node.provider_id.is_empty() {
            return Ok(instances
                .into_iter()
                .filter(|i| counts_toward_pool(&i.state) || i.state == InstanceState::Deleting)
                .find(|i| instance_id(region, i) == node.provider_id));
        }
        if node.name.is_empty() {
            return Ok(None);
        }
        let Some(record) = self.cp.store.node(&node.name).map_err(status)? else {
            return Ok(None);
        };
        Ok(instances.into_iter().find(|i| i.name == record.instance))
    }
}

#[tonic::async_trait]
impl pb::cloud_provider_server::CloudProvider for Autoscaler {
    async fn node_groups(
        &self,
        _: Request<pb::NodeGroupsRequest>,
    ) -> Answer<pb::NodeGroupsResponse> {
        Ok(Response::new(pb::NodeGroupsResponse {
            node_groups: self.groups()?.iter().map(node_group).collect(),
        }))
    }

    async fn node_group_for_node(
        &self,
        request: Request<pb::NodeGroupForNodeRequest>,
    ) -> Answer<pb::NodeGroupForNodeResponse> {
        let node = request
            .into_inner()
            .node
            .ok_or_else(|| invalid("node is required".to_string()))?;
        let region = self.region()?;
        let group = match self.instance_of(&region, &node)? {
            Some(instance) => match self.cp.store.pool(&instance.pool).map_err(status)? {
                Some(record) if is_group(&record) => node_group(&record),
                _ => pb::NodeGroup::default(),
            },
            None => pb::NodeGroup::default(),
        };
        Ok(Response::new(pb::NodeGroupForNodeResponse {
            node_group: Some(group),
        }))
    }

    async fn pricing_node_price(
        &self,
        _: Request<pb::PricingNodePriceRequest>,
    ) -> Answer<pb::PricingNodePriceResponse> {
        Err(Status::unimplemented("knit has no pricing"))
    }

    async fn pricing_pod_price(
        &self,
        _: Request<pb::PricingPodPriceRequest>,
    ) -> Answer<pb::PricingPodPriceResponse> {
        Err(Status::unimplemented("knit has no pricing"))
    }

    async fn gpu_label(&self, _: Request<pb::GpuLabelRequest>) -> Answer<pb::GpuLabelResponse> {
        Ok(Response::new(pb::GpuLabelResponse {
            label: template::GPU_LABEL.to_string(),
        }))
    }

    async fn get_available_gpu_types(
        &self,
        _: Request<pb::GetAvailableGpuTypesRequest>,
    ) -> Answer<pb::GetAvailableGpuTypesResponse> {
        let gpu_types = gpu_types()
            .into_iter()
            .map(|value| (value, prost_types::Any::default()))
            .collect();
        Ok(Response::new(pb::GetAvailableGpuTypesResponse {
            gpu_types,
        }))
    }

    async fn cleanup(&self, _: Request<pb::CleanupRequest>) -> Answer<pb::CleanupResponse> {
        Ok(Response::new(pb::CleanupResponse {}))
    }

    async fn refresh(&self, _: Request<pb::RefreshRequest>) -> Answer<pb::RefreshResponse> {
        // Every call reads the store: nothing is cached to refresh. The
        // store is asked once so that an unreachable one shows here.
        self.cp.store.pools().map_err(status)?;
        Ok(Response::new(pb::RefreshResponse {}))
    }

    async fn node_group_target_size(
        &self,
        request: Request<pb::NodeGroupTargetSizeRequest>,
    ) -> Answer<pb::NodeGroupTargetSizeResponse> {
        let record = self.group(&request.into_inner().id)?;
        Ok(Response::new(pb::NodeGroupTargetSizeResponse {
            target_size: clamp(record.pool.spec.replicas),
        }))
    }

    async fn node_group_increase_size(
        &self,
        request: Request<pb::NodeGroupIncreaseSizeRequest>,
    ) -> Answer<pb::NodeGroupIncreaseSizeResponse> {
        let request = request.into_inner();
        if request.delta <= 0 {
            return Err(invalid(format!("delta {} must be positive", request.delta)));
        }
        let record = self.group(&request.id)?;
        let max = record.pool.spec.scaling.as_ref().map_or(0, |s| s.max);
        let from = record.pool.spec.replicas;
        let target = from + i64::from(request.delta);
        if target > max {
            return Err(refused(
                "AboveMaxSize",
                format!(
                    "size increase too large: node group {} at {from} + {} = {target} is above its max {max}; nothing changed",
                    request.id, request.delta
                ),
            ));
        }
        self.set_target(&request.id, from, target, "ScaledUp", "")
            .await?;
        Ok(Response::new(pb::NodeGroupIncreaseSizeResponse {}))
    }

    async fn node_group_delete_nodes(
        &self,
        request: Request<pb::NodeGroupDeleteNodesRequest>,
    ) -> Answer<pb::NodeGroupDeleteNodesResponse> {
        let request = request.into_inner();
        let record = self.group(&request.id)?;
        let region = self.region()?;
        // Every node is checked before anything changes.
        let mut chosen: BTreeMap<String, InstanceRecord> = BTreeMap::new();
        for node in &request.nodes {
            let who = if node.provider_id.is_empty() {
                node.name.clone()
            } else {
                node.provider_id.clone()
            };
            let instance = self.instance_of(&region, node)?.ok_or_else(|| {
                Status::not_found(format!(
                    "NotFound: node {who:?} is not an instance of knit; nothing changed"
                ))
            })?;
            if instance.pool != request.id {
                return Err(refused(
                    "WrongNodeGroup",
                    format!(
                        "node {who:?} belongs to pool {:?}, not to node group {:?}; nothing changed",
                        instance.pool, request.id
                    ),
                ));
            }
            if counts_toward_pool(&instance.state) {
                chosen.insert(instance.name.clone(), instance);
            }
        }
        if chosen.is_empty() {
            return Ok(Response::new(pb::NodeGroupDeleteNodesResponse {}));
        }
        let min = record.pool.spec.scaling.as_ref().map_or(0, |s| s.min);
        let count = chosen.len() as i64;
        {
            let _guard = self.cp.plan_lock.lock().await;
            let mut pool = self.cp.store.live_pool(&request.id).map_err(status)?.pool;
            let from = pool.spec.replicas;
            let target = from - count;
            if target < min {
                return Err(refused(
                    "BelowMinSize",
                    format!(
                        "deleting {count} node(s) of node group {} would take it from {from} to {target}, below its min {min}; nothing changed",
                        request.id
                    ),
                ));
            }
            pool.spec.replicas = target;
            self.cp.store.update_pool(&pool).map_err(status)?;
            // Released unless added by attach (the user's machine: kept).
            for release in [true, false] {
                let names: Vec<String> = chosen
                    .values()
                    .filter(|i| i.added != release)
                    .map(|i| i.name.clone())
                    .collect();
                if !names.is_empty() {
                    self.cp
                        .store
                        .add_delete_intents(&request.id, &names, release)
                        .map_err(status)?;
                }
            }
            self.event(
                &request.id,
                "ScaledDown",
                &format!(
                    "cluster-autoscaler: removing {} (drained first), target {from} -> {target}",
                    chosen.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            );
        }
        self.cp.wake();
        Ok(Response::new(pb::NodeGroupDeleteNodesResponse {}))
    }

    async fn node_group_decrease_target_size(
        &self,
        request: Request<pb::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Answer<pb::NodeGroupDecreaseTargetSizeResponse> {
        let request = request.into_inner();
        if request.delta >= 0 {
            return Err(invalid(format!("delta {} must be negative", request.delta)));
        }
        let record = self.group(&request.id)?;
        let instances = self.cp.store.instances(Some(&request.id)).map_err(status)?;
        // Made: a machine exists or is being made for it.
        let made = instances
            .iter()
            .filter(|i| counts_toward_pool(&i.state))
            .filter(|i| i.provider_id.is_some() || i.state == InstanceState::Creating)
            .count() as i64;
        let from = record.pool.spec.replicas;
        let target = from + i64::from(request.delta);
        if target < made {
            return Err(refused(
                "ExistingNodes",
                format!(
                    "attempt to delete existing nodes: node group {} target {from}, delta {}, {made} instance(s) made; only instances not yet made can be taken back (NodeGroupDeleteNodes removes a made one); nothing changed",
                    request.id, request.delta
                ),
            ));
        }
        let min = record.pool.spec.scaling.as_ref().map_or(0, |s| s.min);
        if target < min {
            return Err(refused(
                "BelowMinSize",
                format!(
                    "node group {} target {from} {} = {target} is below its min {min}; nothing changed",
                    request.id, request.delta
                ),
            ));
        }
        self.set_target(
            &request.id,
            from,
            target,
            "TargetDecreased",
            " (instances not yet made)",
        )
        .await?;
        Ok(Response::new(pb::NodeGroupDecreaseTargetSizeResponse {}))
    }

    async fn node_group_nodes(
        &self,
        request: Request<pb::NodeGroupNodesRequest>,
    ) -> Answer<pb::NodeGroupNodesResponse> {
        let id = request.into_inner().id;
        self.group(&id)?;
        let region = self.region()?;
        // Why a create is being retried, by instance.
        let retrying: BTreeMap<String, CreateError> = self
            .cp
            .store
            .pending_intents()
            .map_err(status)?
            .into_iter()
            .filter(|i| i.pool == id && i.action == IntentAction::Create)
            .filter_map(|i| {
                let kind = i.last_error_kind;
                i.last_error
                    .map(|message| (i.instance, CreateError { message, kind }))
            })
            .collect();
        let instances = self
            .cp
            .store
            .instances(Some(&id))
            .map_err(status)?
            .into_iter()
            .filter(|i| counts_toward_pool(&i.state) || i.state == InstanceState::Deleting)
            .map(|i| {
                let (state, error) = match i.state {
                    InstanceState::Running => (PbState::InstanceRunning, None),
                    InstanceState::Deleting => (PbState::InstanceDeleting, None),
                    InstanceState::Failed => (
                        PbState::InstanceCreating,
                        Some(CreateError {
                            message: i
                                .last_error
                                .clone()
                                .unwrap_or_else(|| "the instance failed".to_string()),
                            kind: i.last_error_kind,
                        }),
                    ),
                    // A create retried for want of capacity is reported,
                    // so that the autoscaler can back off the group; other
                    // retries are knit's own business.
                    _ => (
                        PbState::InstanceCreating,
                        retrying
                            .get(&i.name)
                            .filter(|e| e.out_of_resources())
                            .cloned(),
                    ),
                };
                pb::Instance {
                    id: instance_id(&region, &i),
                    status: Some(pb::InstanceStatus {
                        instance_state: state as i32,
                        error_info: error.map(|e| error_info(&e)),
                    }),
                }
            })
            .collect();
        Ok(Response::new(pb::NodeGroupNodesResponse { instances }))
    }

    async fn node_group_template_node_info(
        &self,
        request: Request<pb::NodeGroupTemplateNodeInfoRequest>,
    ) -> Answer<pb::NodeGroupTemplateNodeInfoResponse> {
        let record = self.group(&request.into_inner().id)?;
        let cluster = self.cp.cluster_doc().map_err(status)?;
        let node = template::node(&cluster, &record.pool)
            .map_err(|e| refused("UnknownInstanceType", e.to_string()))?;
        Ok(Response::new(pb::NodeGroupTemplateNodeInfoResponse {
            node_bytes: node.encode_to_vec(),
            resource_slice_bytes: Vec::new(),
        }))
    }

    async fn node_group_get_options(
        &self,
        request: Request<pb::NodeGroupAutoscalingOptionsRequest>,
    ) -> Answer<pb::NodeGroupAutoscalingOptionsResponse> {
        let request = request.into_inner();
        let record = self.group(&request.id)?;
        let scaling = record.pool.spec.scaling.unwrap_or_default();
        Ok(Response::new(pb::NodeGroupAutoscalingOptionsResponse {
            node_group_autoscaling_options: Some(options(
                &scaling,
                request.defaults.unwrap_or_default(),
            )),
        }))
    }
}

impl Autoscaler {
    /// An event on the pool; one that cannot be written is logged (the
    /// change it tells of is made).
    /// Scales the pool to `target` (the bounds already checked) and says so
    /// in an event with `reason`, `note` appended to its message.
    async fn set_target(
        &self,
        pool: &str,
        from: i64,
        target: i64,
        reason: &str,
        note: &str,
    ) -> Result<(), Status> {
        crate::pools::scale(&self.cp, pool, target, true)
            .await
            .map_err(status)?;
        self.event(
            pool,
            reason,
            &format!("cluster-autoscaler: target {from} -> {target}{note}"),
        );
        Ok(())
    }

    fn event(&self, pool: &str, reason: &str, message: &str) {
        if let Err(e) =
            self.cp
                .store
                .add_event(EventType::Normal, "NodePool", pool, reason, message)
        {
            tracing::warn!(pool, reason, error = %e, "event not recorded");
        }
    }
}

/// The pool's own options (`spec.scaling`) over the autoscaler's
/// `defaults`: each one the pool leaves unset is the default.
pub fn options(
    scaling: &knit_api::ScalingSpec,
    defaults: pb::NodeGroupAutoscalingOptions,
) -> pb::NodeGroupAutoscalingOptions {
    let seconds = |s: i64| prost_types::Duration {
        seconds: s,
        nanos: 0,
    };
    let mut o = defaults;
    if let Some(v) = scaling.scale_down_utilization_threshold {
        o.scale_down_utilization_threshold = v;
    }
    if let Some(v) = scaling.scale_down_gpu_utilization_threshold {
        o.scale_down_gpu_utilization_threshold = v;
    }
    if let Some(v) = scaling.scale_down_unneeded_seconds {
        o.scale_down_unneeded_duration = Some(seconds(v));
    }
    if let Some(v) = scaling.scale_down_unready_seconds {
        o.scale_down_unready_duration = Some(seconds(v));
    }
    if let Some(v) = scaling.max_node_provision_seconds {
        o.max_node_provision_duration = Some(seconds(v));
    }
    if let Some(v) = scaling.zero_or_max_node_scaling {
        o.zero_or_max_node_scaling = v;
    }
    if let Some(v) = scaling.ignore_daemon_sets_utilization {
        o.ignore_daemon_sets_utilization = v;
    }
    o
}

/// The distinct GPU label values of the catalog.
pub fn gpu_types() -> BTreeSet<String> {
    knit_api::instance_types::all()
        .iter()
        .filter_map(|t| t.gpu_type)
        .map(template::gpu_label_value)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(message: &str, kind: Option<ProviderErrorKind>) -> CreateError {
        CreateError {
            message: message.to_string(),
            kind,
        }
    }

    #[test]
    fn out_of_resources_is_told_by_the_stored_kind_not_by_words() {
        let no_room = error_info(&error(
            "provider ecs: RunInstances: sold out",
            Some(ProviderErrorKind::Capacity),
        ));
        assert_eq!(
            (no_room.error_code.as_str(), no_room.instance_error_class),
            ("OutOfResources", OUT_OF_RESOURCES_CLASS)
        );
        assert_eq!(
            no_room.error_message,
            "provider ecs: RunInstances: sold out"
        );
        // Words of a capacity failure in another kind's text, or in an
        // error that was no provider's, do not count.
        for other in [
            error(
                "provider ecs: OperationDenied.NoStock capacity",
                Some(ProviderErrorKind::Permanent),
            ),
            error("store: no capacity left (NoStock)", None),
        ] {
            let info = error_info(&other);
            assert_eq!(
                (info.error_code.as_str(), info.instance_error_class),
                ("CreateFailed", OTHER_ERROR_CLASS),
                "{other:?}"
            );
        }
    }
}
