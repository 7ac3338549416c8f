//! The process and cluster tests, in one test binary.
//!
//! Every file here was its own test binary once; each links the whole workspace (candle,
//! arrow, the AWS SDK), so thirteen of them cost CI minutes of linking and gigabytes of disk
//! (a CI run died when the linker ran out of room). One binary links once. nextest still runs
//! every test in its own process, so a test that kills or starts processes is isolated as
//! before; filter by module, e.g. `cargo nextest run -E 'test(agent_drain::)'`.

mod agent_drain;
mod agent_rejoin;
mod autoscaling_signal;
mod bad_requests;
mod bounded_memory;
mod choice_layouts;
mod cli_conventions;
mod client_reattach;
mod cluster_ops;
mod custom_actor;
mod deploy_files;
mod device_defaults;
mod durable_acks;
mod embed_actors;
mod embed_job;
mod embed_options;
mod embed_s3;
mod embed_windows;
mod eval_suite;
mod forged_outcomes;
mod function_length;
mod generate_actors;
mod generate_answers;
mod generate_chat;
mod generate_constraints;
mod generate_job;
mod generate_llama_cpp;
mod generate_reasoning;
mod generate_score;
mod gpu_failures;
mod hostile_configs;
mod http_port;
mod in_process_cluster;
mod model_delivery;
mod module_cycles;
mod observability;
mod poison_records;
mod process_faults;
mod readme_sdk;
mod scale;
mod scheduler_restart;
mod security;
mod source_check;
mod spoofed_adoption;
mod store_heals;
mod sweeps;
mod task_deadlines;
