//! Several instance types, in order: a create refused for want of capacity
//! for one type (ECS `OperationDenied.NoStock`, `Zone.NotOnSale` and kin;
//! the local cloud's per-type capacity) is tried again with the pool's next
//! type. Each fallback is an event on the instance saying which type had no
//! room, why, and which is tried next; the instance's record takes the type
//! it was made with (its Node's `node.kubernetes.io/instance-type`).

use super::{within, InstanceTemplate, Provider, ProviderInstance, CREATE_TIMEOUT};
use crate::error::Result;
use crate::store::Store;
use knit_api::state::EventType;

/// The provider error codes (and knit's own words) that mean "this type
/// has no capacity here now", where another type may.
pub const CAPACITY_MARKS: &[&str] = &[
    "OperationDenied.NoStock",
    "NoStock",
    "Zone.NotOnSale",
    "NotOnSale",
    "InvalidInstanceType.NotSupported",
    "InvalidResourceType.NotSupported",
    "ResourceNotAvailable",
    "OutOfCapacity",
];

/// Whether a create error says the instance type has no capacity.
pub fn is_capacity_error(message: &str) -> bool {
    CAPACITY_MARKS.iter().any(|m| message.contains(m))
}

/// The types to try for an instance planned as `planned`: it first, then
/// the pool's others in their order.
pub fn order(planned: &str, pool_types: &[String]) -> Vec<String> {
    let mut out = vec![planned.to_string()];
    out.extend(pool_types.iter().filter(|t| *t != planned).cloned());
    out
}

/// Creates `template`'s instance with the first of `types` that has
/// capacity; another error, or the last type's, is returned as it is.
/// Returns the instance and the type it was made with.
pub async fn create(
    provider: &dyn Provider,
    store: &Store,
    template: &InstanceTemplate,
    types: &[String],
) -> Result<(ProviderInstance, String)> {
    let mut template = template.clone();
    for (i, itype) in types.iter().enumerate() {
        template.instance_type = itype.clone();
        match within(
            provider.name(),
            "creating the instance",
            CREATE_TIMEOUT,
            provider.create(&template),
        )
        .await
        {
            Ok(created) => {
                if i > 0 {
                    store.set_instance_type(&template.name, itype)?;
                }
                return Ok((created, itype.clone()));
            }
            Err(e) => {
                let message = e.to_string();
                let Some(next) = types.get(i + 1).filter(|_| is_capacity_error(&message)) else {
                    return Err(e);
                };
                store.add_event(
                    EventType::Warning,
                    "Instance",
                    &template.name,
                    "InstanceTypeFallback",
                    &format!("{itype} has no capacity ({message}); trying {next}"),
                )?;
            }
        }
    }
    Err(crate::error::ServerError::Internal(
        "no instance type to create with".to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_planned_type_first_then_the_pools_order() {
        let pool = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        assert_eq!(order("a", &pool), ["a", "b", "c"]);
        assert_eq!(order("b", &pool), ["b", "a", "c"]);
        assert_eq!(order("z", &pool), ["z", "a", "b", "c"]);
    }

    #[test]
    fn capacity_errors_are_told_from_others() {
        assert!(is_capacity_error(
            "provider ecs: RunInstances: OperationDenied.NoStock: sold out"
        ));
        assert!(is_capacity_error("Zone.NotOnSale: not on sale in cn-x-a"));
        assert!(!is_capacity_error("InvalidParameter: bad image"));
        assert!(!is_capacity_error("connection refused"));
        // The local cloud's per-type capacity, as the provider passes it on.
        let local = knit_local::LocalError::OutOfCapacity {
            instance_type: "ecs.g7.large".into(),
            used: 1,
            capacity: 1,
        };
        assert!(is_capacity_error(&local.to_string()));
    }
}
