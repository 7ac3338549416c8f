use std::collections::BTreeMap;

use resident_proto::pb;

/// What a pool of actors needs: its kind, replicas, resources per actor and limits.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    spec: pb::PoolSpec,
}

impl PoolSpec {
    /// A pool of one CPU actor of `kind`.
    pub fn new(name: impl Into<String>, kind: impl Into<String>) -> Self {
        Self {
            spec: pb::PoolSpec {
                name: name.into(),
                actor_kind: kind.into(),
                replicas: 1,
                resources: Some(pb::ResourceRequest::default()),
                ..Default::default()
            },
        }
    }

    /// A pool of one CPU actor of the typed kind `K` (asked for as `name@version`), each
    /// actor loaded with `config`.
    pub fn typed<K: resident_actor::Kind>(
        name: impl Into<String>,
        config: &K::Config,
    ) -> Result<Self, crate::SdkError> {
        let mut spec = Self::new(name, resident_actor::kind_id::<K>());
        spec.spec.actor_config = resident_actor::encode_config::<K>(config)?.into();
        Ok(spec)
    }

    fn resources(&mut self) -> &mut pb::ResourceRequest {
        self.spec.resources.get_or_insert_with(Default::default)
    }

    /// Actors in the pool.
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.spec.replicas = replicas;
        self
    }

    /// GPUs per actor: 0 for CPU, a fraction (0.25) to share one GPU, whole numbers for more.
    pub fn gpus(mut self, gpus: f64) -> Self {
        self.resources().gpus = gpus;
        self
    }

    /// VRAM each actor reserves on its GPU, in bytes.
    pub fn vram_bytes(mut self, bytes: u64) -> Self {
        self.resources().vram_bytes = bytes;
        self
    }

    /// VRAM each actor reserves on its GPU, in GiB.
    pub fn vram_gib(self, gib: f64) -> Self {
        self.vram_bytes((gib * (1u64 << 30) as f64) as u64)
    }

    /// CPU cores each actor reserves.
    pub fn cpus(mut self, cpus: f64) -> Self {
        self.resources().cpus = cpus;
        self
    }

    /// Only nodes with the label `key=value` (repeatable).
    pub fn selector(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.resources().selector.insert(key.into(), value.into());
        self
    }

    /// Only nodes with all these labels.
    pub fn selectors(mut self, labels: BTreeMap<String, String>) -> Self {
        self.resources().selector.extend(labels);
        self
    }

    /// Only GPUs whose model name contains this (`A10G`).
    pub fn gpu_model(mut self, model: impl Into<String>) -> Self {
        self.resources().gpu_model = model.into();
        self
    }

    /// Only GPUs of at least this CUDA compute capability.
    pub fn min_compute(mut self, major: u32, minor: u32) -> Self {
        let resources = self.resources();
        resources.min_compute_major = major;
        resources.min_compute_minor = minor;
        self
    }

    /// Places the actors on different nodes where it can.
    pub fn spread(mut self) -> Self {
        self.resources().strategy = pb::PlacementStrategy::Spread as i32;
        self
    }

    /// Kind-specific configuration, as JSON.
    pub fn config_json(mut self, config: &serde_json::Value) -> Self {
        self.spec.actor_config = serde_json::to_vec(config)
            .expect("json value serialises")
            .into();
        self
    }

    /// Tasks one actor holds at once (its credit; default: the scheduler's).
    pub fn max_in_flight_per_actor(mut self, credit: u32) -> Self {
        self.spec.max_in_flight_per_actor = credit;
        self
    }

    /// Restarts an actor may spend before the pool gives up on it.
    pub fn max_restarts(mut self, restarts: u32) -> Self {
        self.spec.max_restarts = restarts;
        self
    }

    /// Runs a task may take (retries after actor failures) before it fails for good.
    pub fn max_task_attempts(mut self, attempts: u32) -> Self {
        self.spec.max_task_attempts = attempts;
        self
    }

    /// The scheduler deletes the pool once it has been unused this long (no running job,
    /// no queued task, no actor loading), freeing what its actors hold. Creating the pool
    /// again with another value changes it.
    pub fn idle_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.spec.idle_ttl_ms = ttl.as_millis() as u64;
        self
    }

    /// An actor still loading after this long is stopped and started again, spending a
    /// restart (default: the scheduler's, 15 minutes). Raise it for models that take long
    /// to download.
    pub fn load_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.spec.load_timeout_ms = timeout.as_millis() as u64;
        self
    }

    /// A task running longer than this is taken back and retried (or failed after
    /// [`Self::max_task_attempts`]), and the actor running it is stopped and started again,
    /// freeing what it holds: a hung kernel or call cannot hold a GPU forever. Checked about
    /// once a second, from when the task reached the head of its actor's queue. Default:
    /// no deadline.
    pub fn task_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.spec.task_timeout_ms = timeout.as_millis().clamp(1, u64::MAX as u128) as u64;
        self
    }

    /// The task deadline, if the pool has one.
    pub fn task_timeout_wanted(&self) -> Option<std::time::Duration> {
        (self.spec.task_timeout_ms > 0)
            .then(|| std::time::Duration::from_millis(self.spec.task_timeout_ms))
    }

    /// The idle TTL, if the pool has one.
    pub fn idle_ttl_wanted(&self) -> Option<std::time::Duration> {
        (self.spec.idle_ttl_ms > 0).then(|| std::time::Duration::from_millis(self.spec.idle_ttl_ms))
    }

    /// The pool's name.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The replica count asked for.
    pub fn replicas_wanted(&self) -> u32 {
        self.spec.replicas
    }

    /// The actor kind (`embed`, `echo`, ...).
    pub fn kind(&self) -> &str {
        &self.spec.actor_kind
    }

    /// The principal that created the pool (as the scheduler reports it; empty for a pool
    /// saved before pools had owners, or a spec not yet created). Only it or an admin may
    /// scale or delete the pool.
    pub fn owner(&self) -> &str {
        &self.spec.owner
    }

    /// The same pool with another replica count (whoever owns it).
    pub fn same_but_replicas(&self, other: &PoolSpec) -> bool {
        let resized = pb::PoolSpec {
            replicas: self.spec.replicas,
            idle_ttl_ms: self.spec.idle_ttl_ms,
            owner: self.spec.owner.clone(),
            ..other.spec.clone()
        };
        resized == self.spec
    }

    pub(crate) fn from_pb(spec: pb::PoolSpec) -> Self {
        Self { spec }
    }

    pub(crate) fn into_pb(self) -> pb::PoolSpec {
        self.spec
    }
}
