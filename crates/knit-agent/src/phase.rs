//! What a phase is and what it may use: the `Phase` trait, its `Decision`
//! and its `Ctx`. Below both the engine (which runs phases) and `phases/`
//! (which implement them), so neither imports the other to share them.

use crate::error::Result;
use crate::host::Host;
use crate::identity::NodeFacts;
use crate::journal::Journal;
use knit_api::{NodeConfig, PhaseName};

/// What a phase's inspection concluded, with the reason shown to users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Work to do.
    Run(String),
    /// Not applicable or turned off (config, marker, environment).
    Skip(String),
    /// The machine is already in the wanted state.
    Done(String),
}

impl Decision {
    pub fn reason(&self) -> &str {
        match self {
            Decision::Run(r) | Decision::Skip(r) | Decision::Done(r) => r,
        }
    }

    pub fn action(&self) -> &'static str {
        match self {
            Decision::Run(_) => "run",
            Decision::Skip(_) => "skip",
            Decision::Done(_) => "done",
        }
    }
}

/// Everything a phase may use.
pub struct Ctx<'a> {
    pub host: &'a Host,
    pub config: &'a NodeConfig,
    pub node: NodeFacts,
    pub journal: Journal,
}

impl Ctx<'_> {
    pub fn save_journal(&self) -> Result<()> {
        self.journal.save(self.host)
    }
}

pub trait Phase {
    fn name(&self) -> PhaseName;
    /// Looks at the machine and decides; changes nothing.
    fn inspect(&self, ctx: &Ctx) -> Result<Decision>;
    /// Acts; called only after `inspect` said `Run`. Returns a summary line.
    fn run(&self, ctx: &mut Ctx) -> Result<String>;
}

/// Builds the context shared by `plan` and `init`.
pub fn context<'a>(host: &'a Host, config: &'a NodeConfig) -> Result<Ctx<'a>> {
    let journal = Journal::load(host)?;
    let node = NodeFacts::compute(host, config)?;
    Ok(Ctx {
        host,
        config,
        node,
        journal,
    })
}
