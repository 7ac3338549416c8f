//! The `resident` command line: run a scheduler, an agent, a local cluster, or inspect one.

mod agent;
mod certs;
mod corpus_args;
mod credentials;
mod embed;
mod eval;
mod exit;
mod generate;
mod generate_preview;
mod health;
mod local;
mod model;
mod ops;
mod pool_args;
mod scheduler;
mod status;
mod sweep;
mod sweep_progress;
mod token;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "resident",
    version,
    about = "Resident: resident model actors for GPU batch inference",
    after_help = "Exit status: 0 success; 1 other error; 2 usage error or bad input; 3 the work \
                  cannot be placed or started; 4 the work finished with failures; 5 the cluster \
                  cannot be reached or refuses the credentials."
)]
struct Cli {
    /// Log more: -v shows a local job's scheduler and agent at work (a local job on a
    /// terminal otherwise shows only its bar and summary), -vv debug. RESIDENT_LOG (an
    /// EnvFilter such as `info,resident_scheduler=debug`) wins.
    #[arg(short, long, global = true, env = "RESIDENT_VERBOSE", action = clap::ArgAction::Count)]
    verbose: u8,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true, env = "RESIDENT_LOG_JSON")]
    log_json: bool,
    /// Threads one model operation may use on CPU. 1 (with one actor per core) is fastest
    /// for small encoders; RAYON_NUM_THREADS, when set, wins.
    #[arg(
        long,
        global = true,
        env = "RESIDENT_COMPUTE_THREADS",
        default_value_t = 1
    )]
    compute_threads: usize,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the central scheduler.
    Scheduler(scheduler::SchedulerArgs),
    /// Run a node agent that dials out to a scheduler.
    Agent(agent::AgentArgs),
    /// Run a scheduler and an agent in this process.
    Local(local::LocalArgs),
    /// Show nodes and actors of a cluster.
    Status(status::StatusArgs),
    /// List the jobs a cluster holds (running and recently finished), with progress.
    Jobs(ops::ClusterArgs),
    /// Act on one job: `resident job cancel ID`.
    #[command(subcommand)]
    Job(ops::JobCommand),
    /// List a cluster's pools with their actors and model loads.
    Pools(ops::ClusterArgs),
    /// Act on one pool: `resident pool delete NAME`.
    #[command(subcommand)]
    Pool(ops::PoolCommand),
    /// Embed a corpus with resident model actors, resumably.
    Embed(embed::EmbedArgs),
    /// Generate a text per record of a corpus (summaries, answers) with an LLM kept
    /// resident in generate actors, resumably.
    Generate(Box<generate::GenerateArgs>),
    /// Run a suite of evaluation tasks (each a `resident generate` job: multiple choice,
    /// generated answers, perplexity) on one model, and print the results table.
    Eval(eval::EvalArgs),
    /// Run a hyperparameter sweep whose trials train on resident embed actors.
    Sweep(sweep::SweepArgs),
    /// Make a private CA and the scheduler's TLS certificate.
    Certs(certs::CertsArgs),
    /// Push a model directory to S3 with its manifest, or print a directory's manifest.
    #[command(subcommand)]
    Model(model::ModelCommand),
    /// Create, revoke and list the tokens of a scheduler's auth file.
    Token(token::TokenArgs),
    /// Print a shell completion script: `resident completions bash > /etc/bash_completion.d/resident`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Ask a scheduler's or agent's health port (`--health-listen`) whether it is serving;
    /// exits 0 when it is (Docker HEALTHCHECK, scripts).
    Health(health::HealthArgs),
}

use resident_node_agent::command::{init_logging_at, shutdown_token};

impl Cli {
    /// A job run in this process, which shows its own progress instead of the internals.
    fn is_local_job(&self) -> bool {
        match &self.command {
            Command::Embed(args) => args.is_local(),
            Command::Generate(args) => args.is_local(),
            Command::Eval(args) => args.is_local(),
            Command::Sweep(args) => args.is_local(),
            _ => false,
        }
    }

    /// The log level when RESIDENT_LOG does not say.
    fn default_log_level(&self) -> &'static str {
        let quiet = self.is_local_job() && std::io::IsTerminal::is_terminal(&std::io::stderr());
        match (self.verbose, quiet) {
            (0, true) => "warn",
            (0, false) | (1, true) => "info",
            _ => "debug",
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    resident_models::device::set_compute_threads(cli.compute_threads);
    // Commands that may load a model on a GPU keep the driver's compiled kernels on disk.
    let jit_cache = match &cli.command {
        Command::Agent(args) => Some(args.cuda_jit_cache_dir()),
        Command::Local(_)
        | Command::Embed(_)
        | Command::Generate(_)
        | Command::Eval(_)
        | Command::Sweep(_) => {
            Some(resident_node_agent::model_cache::default_model_cache_dir().join("cuda-jit"))
        }
        _ => None,
    };
    if let Some(dir) = jit_cache {
        resident_models::device::set_cuda_jit_cache(&dir);
    }
    init_logging_at(cli.log_json, cli.default_log_level());
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> std::process::ExitCode {
    let result = match cli.command {
        Command::Scheduler(args) => scheduler::run(args).await,
        Command::Agent(args) => agent::run(args).await,
        Command::Local(args) => local::run(args).await,
        Command::Status(args) => status::run(args).await,
        Command::Jobs(args) => ops::list_jobs(args).await,
        Command::Job(command) => ops::job(command).await,
        Command::Pools(args) => ops::list_pools(args).await,
        Command::Pool(command) => ops::pool(command).await,
        Command::Embed(args) => embed::run(args).await,
        Command::Generate(args) => generate::run(*args).await,
        Command::Eval(args) => eval::run(args).await,
        Command::Sweep(args) => sweep::run(args).await,
        Command::Certs(args) => certs::run(args),
        Command::Token(args) => token::run(args),
        Command::Health(args) => health::run(args).await,
        Command::Model(command) => model::run(command).await,
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "resident",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::from(exit::SUCCESS),
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::from(exit::exit_code(&error))
        }
    }
}

#[cfg(test)]
mod conventions {
    use clap::CommandFactory;

    /// Every flag of every command, as `command --flag`, that lacks help text or an
    /// environment variable.
    fn flags_missing(command: &clap::Command, path: &str, out: &mut Vec<String>) {
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if arg.is_positional() || id == "help" || id == "version" {
                if arg.is_positional() && arg.get_help().is_none() {
                    out.push(format!("{path} <{id}>: no help"));
                }
                continue;
            }
            let flag = arg.get_long().unwrap_or(id);
            if arg.get_help().is_none() {
                out.push(format!("{path} --{flag}: no help"));
            }
            if arg.get_env().is_none() {
                out.push(format!("{path} --{flag}: no env"));
            }
        }
        for sub in command.get_subcommands() {
            flags_missing(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_has_help_and_an_environment_variable() {
        let mut missing = Vec::new();
        flags_missing(&super::Cli::command(), "resident", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
