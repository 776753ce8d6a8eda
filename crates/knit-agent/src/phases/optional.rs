//! Scaffold, being written in this session.

use crate::engine::{Ctx, Decision, Phase};
use crate::error::Result;
use knit_api::PhaseName;

pub struct OptionalComponentsPhase;

impl Phase for OptionalComponentsPhase {
    fn name(&self) -> PhaseName {
        PhaseName::OptionalComponents
    }

    fn inspect(&self, _ctx: &Ctx) -> Result<Decision> {
        Ok(Decision::Skip("not implemented yet".to_string()))
    }

    fn run(&self, _ctx: &mut Ctx) -> Result<String> {
        Ok(String::new())
    }
}
