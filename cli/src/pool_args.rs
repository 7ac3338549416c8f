//! What becomes of the pool a job (`resident embed`, `resident sweep`) creates, and what its
//! GPU- and core-hours are priced at.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use resident_jobs::corpus_job::PriceTable;
use resident_jobs::pools::PoolRetention;

#[derive(Args, Clone, Debug)]
pub struct PoolRetentionArgs {
    /// Keep the job's pool when it ends, its actors loaded, so the next run starts at once
    /// (`resident pool delete NAME` removes it). Without it the pool is deleted at the end,
    /// unless another running job uses it.
    #[arg(long, env = "RESIDENT_KEEP_POOL")]
    pub keep_pool: bool,
    /// Delete the pool once it has been unused this long (`30m`, `2h`). Default: never with
    /// --keep-pool; 10m otherwise, for a pool whose job was killed before deleting it.
    #[arg(long, env = "RESIDENT_IDLE_TTL", value_parser = humantime::parse_duration)]
    pub idle_ttl: Option<Duration>,
}

impl PoolRetentionArgs {
    pub fn retention(&self) -> PoolRetention {
        PoolRetention {
            keep: self.keep_pool,
            idle_ttl: self.idle_ttl,
        }
    }
}

#[derive(Args, Clone, Debug)]
pub struct PriceArgs {
    /// Price of a GPU-hour on nodes labelled `pool=LABEL`: `LABEL=USD` (repeatable; in the
    /// variable, comma-separated). Other GPUs are priced at their model's public on-demand
    /// price.
    #[arg(long, env = "RESIDENT_PRICE", value_delimiter = ',')]
    pub price: Vec<String>,
}

impl PriceArgs {
    /// The default price table with the `--price` overrides.
    pub fn prices(&self) -> anyhow::Result<PriceTable> {
        let mut prices = PriceTable::default();
        for (label, price) in parse_pairs(&self.price, "--price")? {
            let price: f64 = price
                .parse()
                .with_context(|| format!("--price {label}={price}: not a number"))?;
            prices.per_pool_label.insert(label, price);
        }
        Ok(prices)
    }
}

/// `KEY=VALUE` pairs from repeated or comma-separated flag values (`--selector`, `--price`).
pub fn parse_pairs(items: &[String], what: &str) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .flat_map(|i| i.split(','))
        .filter(|p| !p.trim().is_empty())
        .map(|pair| {
            let (k, v) = pair
                .split_once('=')
                .with_context(|| format!("{what} `{pair}` is not KEY=VALUE"))?;
            Ok((k.trim().to_owned(), v.trim().to_owned()))
        })
        .collect()
}
