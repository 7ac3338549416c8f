//! A `generate@1` actor's tasks in one continuous batch. The engine asks for the next
//! group of sequences whenever every sequence it holds has a KV slot; the actor answers
//! with its next task at hand (the scheduler's credit lets one wait at the actor), so the
//! batch stays full across tasks instead of draining to its longest sequence at the end
//! of each. Each task's answer goes back as soon as its last sequence ends.
//!
//! When the device runs out of memory, the sequences in flight (and the step's tokens)
//! are halved for this and later runs, and the tasks not yet answered run again from
//! their start: each record's text depends only on its prompt, seed and id, so the rerun
//! gives what the first would have.

use std::collections::{HashMap, VecDeque};

use resident_actor::generate::{Generate, GenerateRequest};
use resident_models::ModelError;
use resident_models::generate::batcher::StepLimits;
use resident_models::generate::running::GenerationFeed;
use resident_models::generate::{GenerateModel, Generation, GenerationRequest};

use super::prompts::TaskPlan;
use crate::backends::TaskProgress;
use crate::backends::typed::{Reply, RequestFeed};

/// Runs the tasks `tasks` hands over until none is running and none is at hand, halving
/// `limits` when the device runs out of memory. Another error of the model ends the run
/// with it: the host fails the tasks left unanswered (retried elsewhere, unless the error
/// is permanent), and checks the actor's GPU first (a failed GPU is taken out of service).
pub(super) fn run_tasks(
    model: &mut GenerateModel,
    limits: &mut StepLimits,
    tasks: &mut dyn RequestFeed<Generate>,
) -> Result<(), ModelError> {
    let model: &GenerateModel = model;
    let mut feed = TaskGroups {
        model,
        tasks,
        again: VecDeque::new(),
        by_group: HashMap::new(),
        groups_given: 0,
    };
    loop {
        let outcome = model.generate_fed(*limits, &mut feed);
        match outcome {
            Ok(()) => return Ok(()),
            Err(ModelError::OutOfMemory(message)) if limits.max_sequences > 1 => {
                *limits = StepLimits {
                    kv_blocks: limits.kv_blocks,
                    ..StepLimits::new(limits.max_sequences / 2, limits.max_step_tokens / 2)
                };
                tracing::warn!(
                    max_sequences = limits.max_sequences,
                    max_step_tokens = limits.max_step_tokens,
                    running = feed.by_group.len(),
                    %message,
                    "out of device memory; halving the sequences in flight and running the \
                     unanswered tasks again"
                );
                feed.run_again();
            }
            Err(error) => return Err(error),
        }
    }
}

/// A task in the batch: the number its feed knows it by, its plan, and the tokens it has
/// generated (its progress).
struct Running {
    number: u64,
    plan: TaskPlan,
    generated: u64,
}

/// The actor's tasks as the engine's groups of requests.
struct TaskGroups<'a> {
    model: &'a GenerateModel,
    tasks: &'a mut dyn RequestFeed<Generate>,
    /// Tasks taken by a run that ran out of memory, to give first to the next run.
    again: VecDeque<Running>,
    /// The tasks given to the engine's current run, by its group number.
    by_group: HashMap<usize, Running>,
    groups_given: usize,
}

impl TaskGroups<'_> {
    /// The current run failed: its unanswered tasks go first to the next one, in order.
    fn run_again(&mut self) {
        let mut unanswered: Vec<(usize, Running)> = self.by_group.drain().collect();
        unanswered.sort_unstable_by_key(|(group, _)| *group);
        for (_, task) in unanswered.into_iter().rev() {
            self.again.push_front(task);
        }
        self.groups_given = 0;
    }
}

impl GenerationFeed for TaskGroups<'_> {
    fn next_group(&mut self) -> Option<Vec<GenerationRequest>> {
        let task = match self.again.pop_front() {
            Some(task) => task,
            None => loop {
                let (number, request) = self.tasks.next_request()?;
                match TaskPlan::new(self.model, &request) {
                    Ok(plan) => {
                        break Running {
                            number,
                            plan,
                            generated: 0,
                        };
                    }
                    Err(error) => self.tasks.answer(number, Err(error)),
                }
            },
        };
        let requests = task.plan.requests.clone();
        self.by_group.insert(self.groups_given, task);
        self.groups_given += 1;
        Some(requests)
    }

    fn token(&mut self, group: usize) {
        if let Some(task) = self.by_group.get_mut(&group) {
            task.generated += 1;
            self.tasks.progress(task.number, task.generated);
        }
    }

    fn finished(&mut self, group: usize, generations: Vec<Generation>) {
        let task = self
            .by_group
            .remove(&group)
            .expect("a group this feed gave");
        let response = task.plan.response(self.model.format(), &generations);
        self.tasks.answer(task.number, Ok(response));
    }
}

/// One request as a feed: [`super::GenerateActor`]'s `handle`, the same path as its tasks.
pub(super) struct OneRequest {
    request: Option<GenerateRequest>,
    progress: TaskProgress,
    /// The request's reply, once answered.
    pub reply: Option<Reply<Generate>>,
}

impl OneRequest {
    pub fn new(request: GenerateRequest, progress: TaskProgress) -> Self {
        Self {
            request: Some(request),
            progress,
            reply: None,
        }
    }
}

impl RequestFeed<Generate> for OneRequest {
    fn next_request(&mut self) -> Option<(u64, GenerateRequest)> {
        self.request.take().map(|request| (0, request))
    }

    fn answer(&mut self, _number: u64, reply: Reply<Generate>) {
        self.reply = Some(reply);
    }

    fn progress(&mut self, _number: u64, items_done: u64) {
        self.progress.report(items_done);
    }
}
