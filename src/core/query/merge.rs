//! The k-way merge of one page: the partition keys' item streams, each in
//! sort-key order, merged into one stream ordered by (sort key, key index),
//! cut after `limit` items.
//!
//! [`PageRun`] is a state machine so that the same code runs over DynamoDB
//! (`phase::query`, which fetches in parallel) and over an in-memory table
//! (the tests and the read-path vectors): [`PageRun::step`] emits every item
//! it can and names the keys it must see more of before it can go on; the
//! caller fetches those (in any order, in parallel) and hands each answer to
//! [`PageRun::feed`]. Memory holds at most one fetched page per key.
//!
//! A page with more after it ends with a [`Cursor`] at its last item; the
//! next page starts every key just after that position. The run looks one
//! item past the page before it says there is more, so a page without a
//! cursor is the last one, and the last page is never empty (unless the
//! whole read is).

use std::cmp::Ordering;
use std::collections::VecDeque;

use super::cursor::Cursor;
use super::range::{Bound, Order, SkCondition, SkRange};

/// An item of the merged stream: the index of its partition key, its sort key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry<T> {
    pub key: usize,
    pub sk: String,
    pub item: T,
}

struct Source<T> {
    range: SkRange,
    buf: VecDeque<(String, T)>,
    done: bool,
}

pub(crate) struct PageRun<T> {
    order: Order,
    limit: usize,
    sources: Vec<Source<T>>,
    out: Vec<Entry<T>>,
}

impl<T> PageRun<T> {
    /// A page of at most `limit` (at least 1) items over `keys` partition
    /// keys, after `cursor`'s position if given.
    pub fn new(
        keys: usize,
        cond: &SkCondition,
        order: Order,
        limit: usize,
        cursor: Option<&Cursor>,
    ) -> PageRun<T> {
        let sources = (0..keys)
            .map(|i| {
                let range = SkRange::of(cond);
                Source {
                    // Keys after the cursor's own come after it at an equal sort key.
                    range: match cursor {
                        Some(c) => range.after(
                            Bound {
                                value: c.sk.clone(),
                                inclusive: i > c.key,
                            },
                            order,
                        ),
                        None => range,
                    },
                    buf: VecDeque::new(),
                    done: false,
                }
            })
            .collect();
        PageRun {
            order,
            limit: limit.max(1),
            sources,
            out: Vec::new(),
        }
    }

    /// The sort-key range key `key` is read over.
    pub fn range(&self, key: usize) -> &SkRange {
        &self.sources[key].range
    }

    /// How many items a fetch needs at most: what the page still lacks, and
    /// one more to know whether another page follows.
    pub(crate) fn fetch_limit(&self) -> usize {
        self.limit - self.out.len() + 1
    }

    /// Emit every item that can be; the keys to fetch more of before going
    /// on (each as its next page, the same key never twice in a row without
    /// a [`feed`](Self::feed)). Empty: the page is complete.
    pub fn step(&mut self) -> Vec<usize> {
        loop {
            let wants: Vec<usize> = (0..self.sources.len())
                .filter(|&i| self.sources[i].buf.is_empty() && !self.sources[i].done)
                .collect();
            if self.out.len() == self.limit {
                // One item past the page is enough to know there is more.
                let known = self.sources.iter().any(|s| !s.buf.is_empty());
                return if known { Vec::new() } else { wants };
            }
            if !wants.is_empty() {
                return wants;
            }
            match self.pop() {
                Some(e) => self.out.push(e),
                None => return wants,
            }
        }
    }

    /// Key `key`'s next items, in the read's order, as DynamoDB returned them;
    /// `more`: DynamoDB has more after them (a LastEvaluatedKey).
    pub fn feed(&mut self, key: usize, items: Vec<(String, T)>, more: bool) {
        let order = self.order;
        let s = &mut self.sources[key];
        for (sk, item) in items {
            if s.range.contains(&sk) {
                debug_assert!(
                    s.buf
                        .back()
                        .is_none_or(|(last, _)| { cmp_sk(last, &sk, order) == Ordering::Less })
                );
                s.buf.push_back((sk, item));
            } else if s.range.is_past_end(&sk, order) {
                s.done = true;
                break;
            }
        }
        if !more {
            s.done = true;
        }
    }

    /// The page, and the cursor to the next one if there is more.
    pub fn finish(self) -> (Vec<Entry<T>>, Option<Cursor>) {
        let more = self.sources.iter().any(|s| !s.buf.is_empty());
        let cursor = match self.out.last() {
            Some(last) if more => Some(Cursor {
                key: last.key,
                sk: last.sk.clone(),
            }),
            _ => None,
        };
        (self.out, cursor)
    }

    fn pop(&mut self) -> Option<Entry<T>> {
        let order = self.order;
        let best = self
            .sources
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.buf.front().map(|(sk, _)| (i, sk)))
            .min_by(|(i, a), (j, b)| cmp_sk(a, b, order).then(i.cmp(j)))
            .map(|(i, _)| i)?;
        let (sk, item) = self.sources[best].buf.pop_front()?;
        Some(Entry {
            key: best,
            sk,
            item,
        })
    }
}

/// Sort keys in the read's order.
fn cmp_sk(a: &str, b: &str, order: Order) -> Ordering {
    match order {
        Order::Ascending => a.cmp(b),
        Order::Descending => b.cmp(a),
    }
}
