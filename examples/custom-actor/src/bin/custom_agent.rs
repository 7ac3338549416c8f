//! `resident agent`, every flag of it, with the MinHash kind added to the built-in ones.

use resident_node_agent::backends::ActorKindRegistry;

fn main() -> std::process::ExitCode {
    let mut kinds = ActorKindRegistry::with_builtin_kinds();
    kinds.register_actor::<custom_actor::MinHashActor>();
    resident_node_agent::command::agent_main("custom-agent", kinds)
}
