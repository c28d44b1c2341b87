//! The write side of a backfill: batches of 25 under the table budget,
//! interleaved across target keys and paced per key, so one hot old key never
//! makes a hot new one.

use super::*;

/// Per written item: its index in the page, and why it was refused, if it was.
pub(super) type Refusals = Vec<(usize, Option<String>)>;

/// The write side: batches under the table budget and a per-key limit.
pub(super) struct Writer {
    pub(super) clients: Clients,
    pub(super) table: String,
    pub(super) pk_name: String,
    pub(super) control: Arc<Control>,
    pub(super) per_key: DefaultKeyedRateLimiter<String>,
    pub(super) key_burst: u32,
    pub(super) concurrency: usize,
    pub(super) max_retries: u32,
    pub(super) consumed_wcu: Mutex<f64>,
}

impl Writer {
    pub(super) fn new(
        clients: &Clients,
        plan: &Plan,
        opts: &BackfillOptions,
        control: Arc<Control>,
    ) -> Writer {
        let key_rate = NonZeroU32::new(opts.key_write_rate.max(1)).unwrap_or(NonZeroU32::MIN);
        // A small burst keeps any one second of a key's writes near the rate: at most
        // rate + burst, well under the partition's 1,000 WCU/s at the default.
        let key_burst =
            NonZeroU32::new((opts.key_write_rate / 4).max(1)).unwrap_or(NonZeroU32::MIN);
        Writer {
            clients: clients.clone(),
            table: plan.target_table.clone(),
            pk_name: plan.target_key.partition_key.name.clone(),
            control,
            per_key: RateLimiter::keyed(Quota::per_second(key_rate).allow_burst(key_burst)),
            key_burst: key_burst.get(),
            concurrency: opts.concurrency.max(1),
            max_retries: opts.max_retries,
            consumed_wcu: Mutex::new(0.0),
        }
    }

    /// Write items (distinct target keys) in batches of 25, interleaved across
    /// target keys and paced per key: a Scan returns items clustered by the old
    /// key, and each old key fans out to few new ones. Returns, per item, None
    /// (written) or why DynamoDB refused it.
    pub(super) async fn write(&self, items: Vec<Item>) -> anyhow::Result<Vec<Option<String>>> {
        let n = items.len();
        let mut by_key: HashMap<String, Vec<(usize, Item)>> = HashMap::new();
        for (i, it) in items.into_iter().enumerate() {
            let pk = it
                .get(&self.pk_name)
                .map(Value::display_text)
                .unwrap_or_default();
            by_key.entry(pk).or_default().push((i, it));
        }
        let mut queues: Vec<(String, std::vec::IntoIter<(usize, Item)>)> = by_key
            .into_iter()
            .map(|(k, v)| (k, v.into_iter()))
            .collect();
        let mut order = Vec::with_capacity(n);
        while !queues.is_empty() {
            queues.retain_mut(|(k, q)| match q.next() {
                Some((i, it)) => {
                    order.push((k.clone(), i, it));
                    true
                }
                None => false,
            });
        }
        let mut batches: Vec<Vec<(String, usize, Item)>> = Vec::new();
        for x in order {
            match batches.last_mut() {
                Some(b) if b.len() < BATCH => b.push(x),
                _ => batches.push(vec![x]),
            }
        }
        let results: Vec<anyhow::Result<Refusals>> = stream::iter(batches)
            .map(|batch| async move {
                for (pk, _, it) in &batch {
                    let wcu = write_units(item_size(it)) as u32;
                    let cells =
                        NonZeroU32::new(wcu.clamp(1, self.key_burst)).unwrap_or(NonZeroU32::MIN);
                    let _ = self.per_key.until_key_n_ready(pk, cells).await;
                }
                let (idx, its): (Vec<usize>, Vec<Item>) =
                    batch.into_iter().map(|(_, i, it)| (i, it)).unzip();
                let r = write_batch(
                    &self.clients,
                    &self.table,
                    &its,
                    &self.control,
                    self.max_retries,
                )
                .await?;
                *self.consumed_wcu.lock().await += r.consumed;
                Ok(idx.into_iter().zip(r.refused).collect())
            })
            .buffer_unordered(self.concurrency)
            .collect()
            .await;
        let mut out = vec![None; n];
        for r in results {
            for (i, refused) in r.context("backfill write failed")? {
                out[i] = refused;
            }
        }
        Ok(out)
    }
}
