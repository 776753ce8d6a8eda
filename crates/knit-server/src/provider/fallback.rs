//! Several instance types, in order: a create refused for want of capacity
//! for one type (an error of kind [`ProviderErrorKind::Capacity`]: ECS
//! `OperationDenied.NoStock`, `Zone.NotOnSale` and kin, the local cloud's
//! per-type capacity, each provider mapping its own) is tried again with the
//! pool's next type. The caller records each move (the reconciler writes
//! an event on the instance saying which type had no room, why, and which
//! is tried next) and the type the instance was made with (its Node's
//! `node.kubernetes.io/instance-type`): the providers do not reach into
//! the store.

use super::{
    within, InstanceTemplate, Provider, ProviderErrorKind, ProviderInstance, CREATE_TIMEOUT,
};
use crate::error::{Result, ServerError};

/// Whether a create error says the instance type has no capacity (another
/// type may have).
pub fn is_capacity_error(e: &ServerError) -> bool {
    e.provider_kind() == Some(ProviderErrorKind::Capacity)
}

/// The types to try for an instance planned as `planned`: it first, then
/// the pool's others in their order.
pub fn order(planned: &str, pool_types: &[String]) -> Vec<String> {
    let mut out = vec![planned.to_string()];
    out.extend(pool_types.iter().filter(|t| *t != planned).cloned());
    out
}

/// One move to the next type: `instance_type` had no room for `instance`.
#[derive(Debug)]
pub struct NoRoom<'a> {
    pub instance: &'a str,
    pub instance_type: &'a str,
    pub next: &'a str,
    /// The provider's capacity error.
    pub error: &'a ServerError,
}

impl NoRoom<'_> {
    /// The text of the instance's `InstanceTypeFallback` event.
    pub fn message(&self) -> String {
        format!(
            "{} has no capacity ({}); trying {}",
            self.instance_type, self.error, self.next
        )
    }
}

/// Creates `template`'s instance with the first of `types` that has
/// capacity, telling `moved_on` of each type that had none before trying
/// the next (an error it returns ends the create); another error, or the
/// last type's, is returned as it is. Returns the instance and the type it
/// was made with.
pub async fn create(
    provider: &dyn Provider,
    template: &InstanceTemplate,
    types: &[String],
    moved_on: &mut (dyn FnMut(&NoRoom<'_>) -> Result<()> + Send),
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
            Ok(created) => return Ok((created, itype.clone())),
            Err(e) => {
                let Some(next) = types.get(i + 1).filter(|_| is_capacity_error(&e)) else {
                    return Err(e);
                };
                moved_on(&NoRoom {
                    instance: &template.name,
                    instance_type: itype,
                    next,
                    error: &e,
                })?;
            }
        }
    }
    Err(ServerError::Internal(
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
    fn capacity_errors_are_told_by_kind_not_by_words() {
        use crate::provider::ProviderError;
        let capacity = ProviderError::new(
            "ecs",
            ProviderErrorKind::Capacity,
            "OperationDenied.NoStock",
            "RunInstances: sold out",
        );
        assert!(is_capacity_error(&capacity.into()));
        // The words of a capacity error in a permanent one do not count.
        let permanent = ProviderError::failed("ecs", "OutOfCapacity NoStock NotOnSale");
        assert!(!is_capacity_error(&permanent.into()));
        assert!(!is_capacity_error(&ServerError::Internal(
            "OperationDenied.NoStock".into()
        )));
    }

    /// A provider whose listed types have no capacity and whose others
    /// fail with `fail_kind`; it records every type asked.
    struct Refusing {
        no_room: Vec<&'static str>,
        fail_kind: ProviderErrorKind,
        asked: std::sync::Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Provider for Refusing {
        fn name(&self) -> &str {
            "refusing"
        }
        async fn create(&self, t: &InstanceTemplate) -> Result<ProviderInstance> {
            self.asked
                .lock()
                .map_err(|_| ServerError::Internal("poisoned".into()))?
                .push(t.instance_type.clone());
            let kind = if self.no_room.contains(&t.instance_type.as_str()) {
                ProviderErrorKind::Capacity
            } else {
                self.fail_kind
            };
            if kind == ProviderErrorKind::Capacity || t.instance_type != "ok" {
                return Err(crate::provider::ProviderError::new(
                    "refusing",
                    kind,
                    "Test",
                    format!("{} refused", t.instance_type),
                )
                .into());
            }
            Ok(ProviderInstance {
                id: "i-1".into(),
                name: Some(t.name.clone()),
                state: "Running".into(),
                ip: None,
                tags: Default::default(),
            })
        }
        async fn get(&self, _: &str) -> Result<Option<ProviderInstance>> {
            Ok(None)
        }
        async fn list(&self) -> Result<Vec<ProviderInstance>> {
            Ok(Vec::new())
        }
        async fn start(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn stop(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn reimage(&self, _: &str, _: &str, _: &str) -> Result<()> {
            Ok(())
        }
        async fn check_image(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn rename(&self, _: &str, _: &str) -> Result<()> {
            Ok(())
        }
        async fn set_password(&self, _: &str, _: &str) -> Result<()> {
            Ok(())
        }
        async fn delete(&self, _: &str) -> Result<()> {
            Ok(())
        }
        async fn read_file(&self, _: &str, _: &str) -> Result<Vec<u8>> {
            Ok(Vec::new())
        }
        async fn snapshot_create(
            &self,
            _: &str,
            _: usize,
            _: &str,
        ) -> Result<crate::provider::ProviderSnapshot> {
            Err(ServerError::Internal("not in this test".into()))
        }
        async fn snapshot_delete(&self, _: &str) -> Result<()> {
            Ok(())
        }
    }

    fn template() -> InstanceTemplate {
        InstanceTemplate {
            name: "web-1".into(),
            instance_type: "a".into(),
            image: "debian-12".into(),
            system_disk_gib: 20,
            data_disks: Vec::new(),
            user_data: String::new(),
            region: "r".into(),
            zone: None,
            vpc: "v".into(),
            tags: Default::default(),
            light: false,
        }
    }

    /// The moves `create` told of, as their messages.
    async fn create_noting(
        p: &Refusing,
        types: &[String],
    ) -> (Result<(ProviderInstance, String)>, Vec<String>) {
        let mut moves = Vec::new();
        let made = create(p, &template(), types, &mut |m| {
            assert_eq!(m.instance, "web-1");
            moves.push(m.message());
            Ok(())
        })
        .await;
        (made, moves)
    }

    #[tokio::test]
    async fn the_fallback_moves_on_for_capacity_and_not_for_permanent() {
        let types = vec!["a".to_string(), "b".to_string(), "ok".to_string()];

        // a and b have no room: ok is made, after two fallback events.
        let p = Refusing {
            no_room: vec!["a", "b"],
            fail_kind: ProviderErrorKind::Permanent,
            asked: Default::default(),
        };
        let (made, moves) = create_noting(&p, &types).await;
        let (made, itype) = made.expect("made with the third type");
        assert_eq!((made.id.as_str(), itype.as_str()), ("i-1", "ok"));
        assert_eq!(*p.asked.lock().expect("asked"), ["a", "b", "ok"]);
        assert_eq!(
            moves,
            [
                "a has no capacity (provider refusing: a refused); trying b",
                "b has no capacity (provider refusing: b refused); trying ok",
            ]
        );

        // a fails for good: b is never asked and a's error comes back.
        let p = Refusing {
            no_room: vec![],
            fail_kind: ProviderErrorKind::Permanent,
            asked: Default::default(),
        };
        let (made, moves) = create_noting(&p, &types).await;
        let e = made.expect_err("a permanent error ends the fallback");
        assert_eq!(e.provider_kind(), Some(ProviderErrorKind::Permanent));
        assert_eq!(e.to_string(), "provider refusing: a refused");
        assert_eq!(*p.asked.lock().expect("asked"), ["a"]);
        assert!(moves.is_empty(), "{moves:?}");

        // The last type's capacity error is returned as it is.
        let p = Refusing {
            no_room: vec!["a", "b", "ok"],
            fail_kind: ProviderErrorKind::Permanent,
            asked: Default::default(),
        };
        let (made, moves) = create_noting(&p, &types).await;
        let e = made.expect_err("no type has room");
        assert!(is_capacity_error(&e), "{e}");
        assert_eq!(*p.asked.lock().expect("asked"), ["a", "b", "ok"]);
        assert_eq!(moves.len(), 2, "{moves:?}");

        // A move the caller cannot record ends the create with its error.
        let p = Refusing {
            no_room: vec!["a"],
            fail_kind: ProviderErrorKind::Permanent,
            asked: Default::default(),
        };
        let e = create(&p, &template(), &types, &mut |_| {
            Err(ServerError::Internal("store down".into()))
        })
        .await
        .expect_err("the record failed");
        assert_eq!(e.to_string(), "store down");
        assert_eq!(*p.asked.lock().expect("asked"), ["a"]);
    }
}
