//! `resident agent`: the agent's command line from `resident_node_agent::command`, with the
//! built-in actor kinds.

use resident_node_agent::backends::ActorKindRegistry;
pub use resident_node_agent::command::AgentArgs;

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let kinds = ActorKindRegistry::with_builtin_kinds();
    resident_node_agent::command::run(args, kinds, crate::shutdown_token()).await
}
