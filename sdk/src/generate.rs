//! Generation pools: a pool of `generate@1` actors and the call that completes a list of
//! prompts on it in input order, as [`crate::EmbedPool`] does for texts. Python's
//! `Cluster.generate` is this call; `resident generate` runs corpora through the corpus job
//! instead (resumable, sharded).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use resident_actor::generate::{
    Completion, Generate, GenerateConfig, GenerateParams, GenerateRequest, PromptParts,
};

use crate::client::Cluster;
use crate::error::SdkError;
use crate::pool::Pool;
use crate::pool_spec::PoolSpec;

/// How to make a generation pool: its name, the actors' config (model, KV slots, dtype)
/// and where they run.
#[derive(Clone, Debug)]
pub struct GeneratePoolSpec {
    name: String,
    config: GenerateConfig,
    replicas: Option<u32>,
    gpus: Option<f64>,
    vram_gib: f64,
    idle_ttl: Option<Duration>,
}

impl GeneratePoolSpec {
    /// A pool named `name` of actors loading `config.model`; replicas and device are
    /// chosen from the cluster unless set.
    pub fn new(name: impl Into<String>, config: GenerateConfig) -> Self {
        Self {
            name: name.into(),
            config,
            replicas: None,
            gpus: None,
            vram_gib: 2.0,
            idle_ttl: None,
        }
    }

    /// This many actors (default: [`crate::default_replicas`], one per node on CPUs).
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// GPUs per actor (0 for CPU actors; default: [`crate::choose_device`]) and the VRAM
    /// each actor reserves on a GPU.
    pub fn gpus(mut self, gpus_per_actor: Option<f64>, vram_gib: f64) -> Self {
        self.gpus = gpus_per_actor;
        self.vram_gib = vram_gib;
        self
    }

    /// Deletes the pool once unused this long.
    pub fn idle_ttl(mut self, idle_ttl: Duration) -> Self {
        self.idle_ttl = Some(idle_ttl);
        self
    }
}

/// A pool of generation actors.
#[derive(Clone)]
pub struct GeneratePool {
    /// The pool underneath.
    pub pool: Pool,
    /// Prompts in one task: enough to keep an actor's continuous batch full
    /// ([`GenerateConfig::records_per_task_on`]).
    prompts_per_task: usize,
}

impl Cluster {
    /// Creates a generation pool (or resizes the pool of that name) and waits until every
    /// actor has loaded the model. The device is the cluster's GPUs unless the spec says
    /// ([`crate::choose_device`]); the actor count one per GPU, or one per node on CPUs,
    /// since a step uses every core ([`crate::default_replicas`]).
    pub async fn create_generate_pool(
        &self,
        spec: GeneratePoolSpec,
        load_timeout: Duration,
    ) -> Result<GeneratePool, SdkError> {
        let anywhere = BTreeMap::new();
        let gpus = self
            .choose_device(spec.gpus, spec.replicas, &anywhere, "gpus")
            .await?
            .gpus_per_actor;
        let replicas = match spec.replicas {
            Some(replicas) => replicas,
            None => self.default_replicas(&anywhere, gpus, |_| 1).await?,
        };
        let prompts_per_task = spec.config.records_per_task_on(gpus > 0.0);
        let mut pool_spec =
            PoolSpec::typed::<Generate>(spec.name, &spec.config)?.replicas(replicas);
        if let Some(idle_ttl) = spec.idle_ttl {
            pool_spec = pool_spec.idle_ttl(idle_ttl);
        }
        if gpus > 0.0 {
            pool_spec = pool_spec.gpus(gpus).vram_gib(spec.vram_gib);
        }
        let pool = self.create_or_resize_pool(pool_spec, load_timeout).await?;
        Ok(GeneratePool {
            pool,
            prompts_per_task,
        })
    }
}

impl GeneratePool {
    /// Prompts [`GeneratePool::generate`] puts in one task: twice the sequences an actor
    /// decodes at once on GPUs (256 unless its config says), four times on CPUs (32), so
    /// that the task waiting at an actor joins its batch before the batch empties.
    pub fn prompts_per_task(&self) -> usize {
        self.prompts_per_task
    }

    /// Completes `prompts` with `params` (each prompt's own parameters override them),
    /// [`GeneratePool::prompts_per_task`] to a task, and returns the completions in input
    /// order (with `n > 1`, each prompt's in a row). Prompt ids are their positions.
    /// `on_answered` is called with the prompts answered so far as each task's reply comes.
    pub async fn generate(
        &self,
        prompts: &[PromptParts],
        params: &GenerateParams,
        mut on_answered: impl FnMut(usize) + Send,
    ) -> Result<Vec<Completion>, SdkError> {
        let per_task = self.prompts_per_task.max(1);
        let requests: Vec<GenerateRequest> = prompts
            .chunks(per_task)
            .enumerate()
            .map(|(task, chunk)| GenerateRequest {
                prompts: chunk
                    .iter()
                    .enumerate()
                    .map(|(i, prompt)| PromptParts {
                        id: (task * per_task + i).to_string(),
                        ..prompt.clone()
                    })
                    .collect(),
                params: params.clone(),
            })
            .collect();
        let tasks = requests.len();
        let mut replies: Vec<Option<_>> = (0..tasks).map(|_| None).collect();
        let mut stream = self
            .pool
            .typed::<Generate>()
            .submit("generate", futures::stream::iter(requests), 0)
            .await?;
        let mut answered = 0;
        while let Some(output) = stream.next().await {
            let output = output?;
            let reply = output.reply.map_err(SdkError::TaskFailed)?;
            answered += reply.completions.len();
            on_answered(answered);
            replies[output.seq as usize] = Some(reply);
        }
        let mut completions = Vec::with_capacity(prompts.len());
        for (task, reply) in replies.into_iter().enumerate() {
            let reply = reply.ok_or_else(|| {
                SdkError::TaskFailed(format!("generation task {task} was never answered"))
            })?;
            completions.extend(reply.completions);
        }
        Ok(completions)
    }
}
