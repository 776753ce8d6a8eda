//! Scaffold, being written in this session.

use crate::engine::{Ctx, Decision, Phase};
use crate::error::Result;
use knit_api::PhaseName;

pub struct KubernetesComponents;

impl Phase for KubernetesComponents {
    fn name(&self) -> PhaseName {
        PhaseName::KubernetesComponents
    }

    fn inspect(&self, _ctx: &Ctx) -> Result<Decision> {
        Ok(Decision::Skip("not implemented yet".to_string()))
    }

    fn run(&self, _ctx: &mut Ctx) -> Result<String> {
        Ok(String::new())
    }
}
