//! A continuous batch that takes requests while it runs. The requests come in groups (an
//! actor's tasks) from a [`GenerationFeed`]: whenever every request taken so far has a KV
//! slot, the batch asks the feed for the next group, so an actor's next task joins the
//! running batch instead of waiting for the last one's longest sequence. Each group's
//! answers go back as soon as its last sequence ends.
//!
//! Pure bookkeeping (which requests wait, which are in flight, which group each belongs
//! to); the model's steps are in `mod.rs`.

use std::collections::{HashMap, VecDeque};

use super::grammar::Constraint;
use super::request::{Generation, GenerationRequest};
use super::sampling::{Sampler, TokenLogprob};
use super::thinking::ThinkingWatch;

/// Where a running batch takes its requests from and gives its answers to. Groups are
/// numbered from 0 in the order [`GenerationFeed::next_group`] gave them.
pub trait GenerationFeed {
    /// The next group of requests, if one is at hand. It must not wait: the batch asks
    /// again at its next step, and ends once nothing is in flight and nothing is at hand.
    fn next_group(&mut self) -> Option<Vec<GenerationRequest>>;

    /// One more token was generated for group `group`.
    fn token(&mut self, group: usize);

    /// Group `group` is finished: its generations, in its requests' order. An empty group
    /// finishes as soon as it is taken.
    fn finished(&mut self, group: usize, generations: Vec<Generation>);
}

/// The feed of one list of requests ([`super::GenerateModel::generate`]).
pub(super) struct OneGroup<'a> {
    requests: Option<Vec<GenerationRequest>>,
    on_token: &'a mut dyn FnMut(),
    /// The group's generations, once finished.
    pub answer: Option<Vec<Generation>>,
}

impl<'a> OneGroup<'a> {
    pub fn new(requests: Vec<GenerationRequest>, on_token: &'a mut dyn FnMut()) -> Self {
        Self {
            requests: Some(requests),
            on_token,
            answer: None,
        }
    }
}

impl GenerationFeed for OneGroup<'_> {
    fn next_group(&mut self) -> Option<Vec<GenerationRequest>> {
        self.requests.take()
    }

    fn token(&mut self, _group: usize) {
        (self.on_token)();
    }

    fn finished(&mut self, _group: usize, generations: Vec<Generation>) {
        self.answer = Some(generations);
    }
}

/// The requests of a running batch as they move through it.
pub(super) struct Batch {
    /// Every request taken and not yet answered, with its group.
    pub requests: TakenRequests,
    /// Requests not yet given a cache slot, in order.
    pub waiting: VecDeque<usize>,
    pub free_slots: Vec<usize>,
    /// In admission order.
    pub flight: Vec<InFlight>,
    /// Sequences preempted for want of KV blocks, with what they generated so far, to
    /// compute again before any new request starts (the earliest admitted on top).
    pub preempted: Vec<InFlight>,
}

impl Batch {
    /// An empty batch of `slots` KV slots.
    pub fn new(slots: usize) -> Self {
        Self {
            requests: TakenRequests::default(),
            waiting: VecDeque::new(),
            free_slots: (0..slots).rev().collect(),
            flight: Vec::new(),
            preempted: Vec::new(),
        }
    }

    /// Takes the feed's next group when every request taken so far has a slot (nothing
    /// waits, nothing preempted): its requests wait in order. An empty group is answered
    /// at once and the next one asked for. Whether a group with requests was taken.
    pub fn take_from(&mut self, feed: &mut dyn GenerationFeed) -> bool {
        if !self.waiting.is_empty() || !self.preempted.is_empty() {
            return false;
        }
        while let Some(group) = feed.next_group() {
            let (number, requests) = self.requests.take_group(group);
            if requests.is_empty() {
                feed.finished(number, Vec::new());
                continue;
            }
            self.waiting.extend(requests);
            return true;
        }
        false
    }

    /// Records request `number`'s answer, and hands its group's answers to `feed` when that
    /// was the group's last.
    pub fn answer(&mut self, number: usize, answer: Generation, feed: &mut dyn GenerationFeed) {
        if let Some((group, generations)) = self.requests.answer(number, answer) {
            feed.finished(group, generations);
        }
    }
}

/// One sequence in flight.
pub(super) struct InFlight {
    /// Its request's number ([`TakenRequests`]).
    pub request: usize,
    pub slot: usize,
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub cached: usize,
    pub sampler: Sampler,
    pub logprobs: Vec<TokenLogprob>,
    pub constraint: Option<Constraint>,
    /// While the model thinks before a grammar holds
    /// ([`GenerationRequest::grammar_after_thinking`]), what looks for the thinking's end;
    /// the grammar waits until it is found.
    pub thinking: Option<ThinkingWatch>,
    /// The prompt tokens scored so far ([`GenerationRequest::score`]).
    pub scored: Vec<TokenLogprob>,
    /// Every token scored so far was the likeliest at its position.
    pub scored_greedy: bool,
}

/// The requests a batch has taken and not yet answered, numbered in the order taken, and
/// the groups they came in. A group's requests leave together, when its last is answered,
/// so a batch that runs through a whole job holds only what is in hand.
#[derive(Default)]
pub(super) struct TakenRequests {
    by_number: HashMap<usize, Taken>,
    groups: HashMap<usize, Group>,
    next_number: usize,
    next_group: usize,
}

struct Taken {
    request: GenerationRequest,
    group: usize,
    answer: Option<Generation>,
}

/// A group's requests are the numbers `first..first + len`.
struct Group {
    first: usize,
    len: usize,
    unanswered: usize,
}

impl TakenRequests {
    /// Takes a group of requests: its number and its requests' numbers.
    fn take_group(&mut self, requests: Vec<GenerationRequest>) -> (usize, std::ops::Range<usize>) {
        let group = self.next_group;
        self.next_group += 1;
        let first = self.next_number;
        let len = requests.len();
        self.next_number += len;
        for (number, request) in (first..).zip(requests) {
            let taken = Taken {
                request,
                group,
                answer: None,
            };
            self.by_number.insert(number, taken);
        }
        if len > 0 {
            let unanswered = len;
            self.groups.insert(
                group,
                Group {
                    first,
                    len,
                    unanswered,
                },
            );
        }
        (group, first..first + len)
    }

    /// Request `number`, taken and not yet answered.
    pub fn get(&self, number: usize) -> &GenerationRequest {
        &self.by_number[&number].request
    }

    /// The group request `number` came in.
    pub fn group_of(&self, number: usize) -> usize {
        self.by_number[&number].group
    }

    /// Records request `number`'s answer; its group's answers, in order, when every one of
    /// its requests is answered.
    fn answer(&mut self, number: usize, answer: Generation) -> Option<(usize, Vec<Generation>)> {
        let taken = self.by_number.get_mut(&number).expect("a taken request");
        assert!(taken.answer.is_none(), "request {number} answered twice");
        taken.answer = Some(answer);
        let group_number = taken.group;
        let group = self.groups.get_mut(&group_number).expect("its group");
        group.unanswered -= 1;
        if group.unanswered > 0 {
            return None;
        }
        let group = self.groups.remove(&group_number).expect("its group");
        let answers = (group.first..group.first + group.len)
            .map(|n| {
                let taken = self.by_number.remove(&n).expect("a request of the group");
                taken.answer.expect("every request of the group answered")
            })
            .collect();
        Some((group_number, answers))
    }

    /// Requests taken and not yet answered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_number.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::request::FinishReason;

    fn request(id: &str) -> GenerationRequest {
        GenerationRequest {
            id: id.into(),
            prompt: vec![1, 2],
            max_new_tokens: 1,
            ..Default::default()
        }
    }

    fn generation(text: &str) -> Generation {
        Generation {
            text: text.into(),
            tokens: Vec::new(),
            prompt_tokens: 2,
            finish_reason: FinishReason::Length,
            logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
            prompt_greedy: true,
        }
    }

    /// A feed of fixed groups that records what it hears.
    #[derive(Default)]
    struct Recorded {
        at_hand: VecDeque<Vec<GenerationRequest>>,
        finished: Vec<(usize, Vec<String>)>,
    }

    impl GenerationFeed for Recorded {
        fn next_group(&mut self) -> Option<Vec<GenerationRequest>> {
            self.at_hand.pop_front()
        }
        fn token(&mut self, _group: usize) {}
        fn finished(&mut self, group: usize, generations: Vec<Generation>) {
            let texts = generations.into_iter().map(|g| g.text).collect();
            self.finished.push((group, texts));
        }
    }

    #[test]
    fn a_group_is_answered_in_its_order_when_its_last_request_is() {
        let mut feed = Recorded::default();
        feed.at_hand.push_back(vec![request("a"), request("b")]);
        feed.at_hand.push_back(vec![request("c")]);
        let mut batch = Batch::new(4);
        assert!(batch.take_from(&mut feed));
        assert_eq!(batch.waiting, [0, 1]);
        assert!(!batch.take_from(&mut feed), "requests still wait for slots");
        batch.waiting.clear();
        assert!(batch.take_from(&mut feed));
        assert_eq!(batch.waiting, [2]);
        assert_eq!(batch.requests.get(2).id, "c");
        assert_eq!(batch.requests.group_of(2), 1);

        // Out of order: the second group's request, then the first group's second, first.
        batch.answer(2, generation("C"), &mut feed);
        batch.answer(1, generation("B"), &mut feed);
        assert_eq!(feed.finished, [(1, vec!["C".to_owned()])]);
        batch.answer(0, generation("A"), &mut feed);
        assert_eq!(feed.finished[1], (0, vec!["A".to_owned(), "B".to_owned()]));
        assert_eq!(batch.requests.len(), 0, "answered requests are let go");
    }

    #[test]
    fn an_empty_group_is_answered_at_once_and_the_next_taken() {
        let mut feed = Recorded::default();
        feed.at_hand.push_back(Vec::new());
        feed.at_hand.push_back(vec![request("a")]);
        let mut batch = Batch::new(1);
        assert!(batch.take_from(&mut feed));
        assert_eq!(feed.finished, [(0, Vec::new())]);
        assert_eq!(batch.requests.group_of(0), 1);
        assert!(!batch.take_from(&mut feed), "a request waits");
        batch.waiting.clear();
        assert!(!batch.take_from(&mut feed), "nothing at hand");
    }

    #[test]
    #[should_panic(expected = "answered twice")]
    fn a_request_is_answered_once() {
        let mut feed = Recorded::default();
        feed.at_hand.push_back(vec![request("a"), request("b")]);
        let mut batch = Batch::new(2);
        batch.take_from(&mut feed);
        batch.answer(0, generation("A"), &mut feed);
        batch.answer(0, generation("A"), &mut feed);
    }
}
