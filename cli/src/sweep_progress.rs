//! What `resident sweep` shows as trials finish: trials done of total, the best so far and
//! an ETA at this run's pace (trials an earlier run finished count as done, not as pace).

use std::time::Duration;

use resident_jobs::sweep::TrialResult;

#[derive(Debug)]
pub struct SweepProgress {
    total: usize,
    resumed: usize,
    done: usize,
    failed: usize,
    maximise: bool,
    best: Option<(usize, f64)>,
}

impl SweepProgress {
    pub fn new(maximise: bool) -> Self {
        Self {
            total: 0,
            resumed: 0,
            done: 0,
            failed: 0,
            maximise,
            best: None,
        }
    }

    pub fn planned(&mut self, total: usize, resumed: &[TrialResult]) {
        self.total = total;
        self.resumed = resumed.len();
        self.done = resumed.len();
        for result in resumed {
            self.consider(result);
        }
    }

    pub fn finished(&mut self, result: &TrialResult) {
        self.done += 1;
        if result.error.is_some() {
            self.failed += 1;
        }
        self.consider(result);
    }

    fn consider(&mut self, result: &TrialResult) {
        let Some(metric) = result.metric.filter(|m| m.is_finite()) else {
            return;
        };
        let better = match self.best {
            None => true,
            Some((_, best)) if self.maximise => metric > best,
            Some((_, best)) => metric < best,
        };
        if better {
            self.best = Some((result.trial_id, metric));
        }
    }

    pub fn done(&self) -> usize {
        self.done
    }

    pub fn total(&self) -> usize {
        self.total
    }

    #[cfg(test)]
    pub fn failed(&self) -> usize {
        self.failed
    }

    #[cfg(test)]
    pub fn best(&self) -> Option<(usize, f64)> {
        self.best
    }

    /// The time left at this run's pace; `None` before this run finished a trial.
    pub fn eta(&self, elapsed: Duration) -> Option<Duration> {
        let this_run = self.done.saturating_sub(self.resumed);
        (this_run > 0).then(|| {
            let left = self.total.saturating_sub(self.done) as f64;
            Duration::from_secs_f64(elapsed.as_secs_f64() / this_run as f64 * left)
        })
    }

    /// `12/40 trials, best 0.8731 (trial 7), ETA 95s`.
    pub fn line(&self, elapsed: Duration, metric: &str) -> String {
        let best = self.best.map_or_else(
            || "no result yet".to_owned(),
            |(trial, value)| format!("best {metric} {value:.4} (trial {trial})"),
        );
        let eta = self
            .eta(elapsed)
            .map_or_else(|| "-".to_owned(), |eta| format!("{}s", eta.as_secs()));
        let failed = if self.failed > 0 {
            format!(", {} failed", self.failed)
        } else {
            String::new()
        };
        format!(
            "{}/{} trials{failed}, {best}, ETA {eta}",
            self.done, self.total
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(trial_id: usize, metric: Option<f64>) -> TrialResult {
        TrialResult {
            trial_id,
            params: Default::default(),
            metric,
            epochs: 1,
            stopped_early: false,
            actor_id: String::new(),
            wall_s: 1.0,
            metrics: vec![],
            train_s: 1.0,
            error: metric.is_none().then(|| "boom".to_owned()),
            schedule: Vec::new(),
        }
    }

    #[test]
    fn counts_best_and_eta_at_this_runs_pace() {
        let mut progress = SweepProgress::new(true);
        progress.planned(10, &[result(0, Some(0.5)), result(1, Some(0.7))]);
        assert_eq!(progress.eta(Duration::from_secs(5)), None, "no pace yet");
        progress.finished(&result(2, Some(0.6)));
        progress.finished(&result(3, None));
        assert_eq!((progress.done(), progress.failed()), (4, 1));
        assert_eq!(progress.best(), Some((1, 0.7)));
        // Two trials of this run in 20 s: six left take 60 s.
        assert_eq!(
            progress.eta(Duration::from_secs(20)),
            Some(Duration::from_secs(60))
        );
        let line = progress.line(Duration::from_secs(20), "accuracy");
        assert_eq!(
            line,
            "4/10 trials, 1 failed, best accuracy 0.7000 (trial 1), ETA 60s"
        );
        let mut minimise = SweepProgress::new(false);
        minimise.planned(2, &[]);
        minimise.finished(&result(0, Some(0.3)));
        minimise.finished(&result(1, Some(0.1)));
        assert_eq!(minimise.best(), Some((1, 0.1)));
    }
}
