//! The budgets and the control, on tokio's paused clock.

use super::*;

#[tokio::test(start_paused = true)]
async fn debt_is_paid_at_the_rate() {
    let b = Budget::new(Some(100.0));
    let start = Instant::now();
    for _ in 0..10 {
        b.ready().await;
        b.spend(50.0).await;
    }
    b.ready().await;
    // 500 units at 100/s: the last caller may go after 5 s, not before.
    let t = start.elapsed().as_secs_f64();
    assert!((4.99..=5.01).contains(&t), "{t}");
}

#[test]
fn rates_are_units_or_shares_of_provisioned_capacity() {
    assert_eq!("500".parse::<Rate>(), Ok(Rate::Units(500.0)));
    assert_eq!("25%".parse::<Rate>(), Ok(Rate::Share(0.25)));
    assert!(
        "0".parse::<Rate>().is_err()
            && "150%".parse::<Rate>().is_err()
            && "x".parse::<Rate>().is_err()
    );
    assert_eq!(
        Rate::Share(0.25).resolve("t", Some(400), "write"),
        Ok(100.0)
    );
    assert_eq!(Rate::Units(7.0).resolve("t", None, "write"), Ok(7.0));
    assert!(
        Rate::Share(0.5)
            .resolve("t", None, "write")
            .unwrap_err()
            .contains("on-demand")
    );
}

#[tokio::test(start_paused = true)]
async fn acquiring_spaces_concurrent_callers() {
    let b = std::sync::Arc::new(Budget::new(Some(100.0)));
    let start = Instant::now();
    let mut done = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            b.acquire(50.0).await;
            Instant::now()
        }));
    }
    for t in tasks {
        done.push(t.await.unwrap().duration_since(start).as_secs_f64());
    }
    done.sort_by(f64::total_cmp);
    // 50 units each at 100/s: released at 0.5, 1.0, 1.5 and 2.0 s, not all at once.
    for (i, t) in done.iter().enumerate() {
        let want = 0.5 * (i + 1) as f64;
        assert!((t - want).abs() < 0.01, "{done:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn idle_time_saves_at_most_a_quarter_second() {
    let b = Budget::new(Some(10.0));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let start = Instant::now();
    for _ in 0..4 {
        b.ready().await;
        b.spend(10.0).await;
    }
    b.ready().await;
    // 2.5 saved units cover a quarter of the first request; the other 37.5 take 3.75 s.
    let t = start.elapsed().as_secs_f64();
    assert!((3.74..=3.76).contains(&t), "{t}");
}

#[tokio::test(start_paused = true)]
async fn a_new_rate_applies_to_waiting_debt() {
    let b = Budget::new(Some(10.0));
    b.spend(100.0).await;
    b.set_rate(100.0).await;
    let start = Instant::now();
    b.ready().await;
    let t = start.elapsed().as_secs_f64();
    assert!((0.99..=1.01).contains(&t), "{t}");
    assert_eq!(b.rate().await, Some(100.0));
    Budget::unlimited().ready().await;
}

fn throttle(reason: &str) -> AwsError {
    AwsError::Throttled {
        action: "PutItem",
        resource: "t".into(),
        code: "ProvisionedThroughputExceededException".into(),
        detail: String::new(),
        reasons: vec![reason.into()],
        endpoint: std::sync::Arc::new(crate::aws::Endpoint {
            service: crate::aws::Service::DynamoDb,
            url: "http://127.0.0.1:9".into(),
            source: crate::aws::Source::Flag,
        }),
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_of_throttles_is_one_cut_to_what_went_through_and_the_rate_climbs_back() {
    let c = Control::new(None, Some(500.0));
    // 300 WCU went through in the last second.
    for _ in 0..10 {
        c.write.spend(30.0).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let e = throttle("TableWriteProvisionedThroughputExceeded");
    let mut joins = Vec::new();
    for _ in 0..10 {
        let c = &c;
        let e = &e;
        // Attempt 0: each backs off at most 50 ms.
        joins.push(async move { c.write_throttled(e, 0).await });
    }
    futures::future::join_all(joins).await;
    assert_eq!(
        c.write.rate().await,
        Some(270.0),
        "90 % of the 300 that went through"
    );
    let stats = c.stats().await;
    assert_eq!((stats.write_throttles, stats.write_cuts), (10, 1));
    assert_eq!(stats.write_limit_found, Some(300.0));
    assert_eq!(stats.reasons["TableWriteProvisionedThroughputExceeded"], 10);
    // A throttle blamed on keys is counted and leaves the table's rate.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.write_key_throttled(&throttle("TableWriteKeyRangeThroughputExceeded"), 0)
        .await;
    assert_eq!(c.write.rate().await, Some(270.0));
    assert_eq!(c.stats().await.key_write_throttles, 1);
    // Unused, it stays where it is.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.tick().await;
    }
    assert_eq!(c.write.rate().await, Some(270.0));
    // Used, quiet seconds bring it back to the limit found, then a slow probe.
    let mut rates = Vec::new();
    for _ in 0..20 {
        let rate = c.write.rate().await.unwrap();
        for _ in 0..10 {
            c.write.spend(rate / 10.0).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.tick().await;
        rates.push(c.write.rate().await.unwrap());
    }
    assert!(rates.windows(2).all(|w| w[1] >= w[0]), "{rates:?}");
    assert!((rates[8] - 300.0).abs() < 10.0, "{rates:?}");
    assert!(rates[11] < 315.0 && rates[19] < 360.0, "{rates:?}");
    // Throttles with nothing going through: down to 1 % of the ceiling, not below.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        c.write_throttled(&e, 0).await;
    }
    assert_eq!(c.write.rate().await, Some(5.0));
    assert_eq!(
        c.read.rate().await,
        None,
        "an unlimited read budget stays unlimited"
    );
}

/// DynamoDB's limit (a token bucket of one second) behind a budget ten
/// times higher, eight writers of 25-unit batches: the rate settles near
/// the limit and stays there, and few attempts are refused.
#[tokio::test(start_paused = true)]
async fn behind_a_table_limit_at_a_tenth_of_the_rate_writes_settle_without_storms() {
    use std::sync::Arc;
    use std::sync::Mutex as Plain;
    const LIMIT: f64 = 400.0;
    let c = Arc::new(Control::new(None, Some(10.0 * LIMIT)));
    // (tokens, last refill, admitted, refused) per second.
    let server = Arc::new(Plain::new((
        LIMIT,
        Instant::now(),
        vec![0.0; 130],
        vec![0.0; 130],
    )));
    let start = Instant::now();
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (c, server) = (c.clone(), server.clone());
        writers.push(tokio::spawn(async move {
            let mut attempt = 0;
            while start.elapsed() < Duration::from_secs(120) {
                let sent = c.acquire_write(25.0).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
                let admitted = {
                    let mut s = server.lock().unwrap();
                    let now = Instant::now();
                    let dt = now.duration_since(s.1).as_secs_f64();
                    s.0 = (s.0 + dt * LIMIT).min(LIMIT);
                    s.1 = now;
                    let second = start.elapsed().as_secs() as usize;
                    let ok = s.0 >= 25.0;
                    if ok {
                        s.0 -= 25.0;
                        s.2[second] += 25.0;
                    } else {
                        s.3[second] += 25.0;
                    }
                    ok
                };
                sent.settle(if admitted { 25.0 } else { 0.0 }).await;
                if admitted {
                    attempt = 0;
                } else {
                    c.write_throttled(
                        &throttle("TableWriteProvisionedThroughputExceeded"),
                        attempt,
                    )
                    .await;
                    attempt = (attempt + 1).min(6);
                }
            }
        }));
    }
    let mut rates = Vec::new();
    while start.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.tick().await;
        rates.push(c.write.rate().await.unwrap());
    }
    for w in writers {
        w.await.unwrap();
    }
    let s = server.lock().unwrap();
    let (admitted, refused): (f64, f64) = (s.2[10..120].iter().sum(), s.3[10..120].iter().sum());
    let achieved = admitted / 110.0;
    assert!(
        achieved >= 0.9 * LIMIT,
        "{achieved:.0} WCU/s; rates {rates:.0?}"
    );
    assert!(
        refused <= 0.05 * admitted,
        "{refused} refused for {admitted}: {:?}",
        &s.3
    );
    let settled = &rates[20..];
    assert!(
        settled
            .iter()
            .all(|r| (0.8 * LIMIT..=1.25 * LIMIT).contains(r)),
        "{rates:.0?}"
    );
}

#[tokio::test(start_paused = true)]
async fn pause_holds_callers_until_resumed() {
    let c = std::sync::Arc::new(Control::new(None, None));
    c.set_paused(true);
    let c2 = c.clone();
    let waiter = tokio::spawn(async move {
        let _in_flight = c2.wait_write().await;
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiter.is_finished());
    let resumed_at = Instant::now();
    c.set_paused(false);
    assert!(waiter.await.unwrap() >= resumed_at);
    c.set_ceilings(Some(50.0), Some(60.0)).await;
    assert_eq!(c.read.rate().await, Some(50.0));
    assert_eq!(c.write.rate().await, Some(60.0));
}

/// A pause is quiet only once every write that passed the gate before it
/// was answered; a write that comes to the gate after it waits, uncounted.
#[tokio::test(start_paused = true)]
async fn a_pause_is_quiet_once_writes_in_flight_are_answered() {
    let c = std::sync::Arc::new(Control::new(None, None));
    let sent = c.acquire_write(1.0).await;
    c.set_paused(true);
    assert_eq!(c.writes_in_flight(), 1);
    assert!(!c.is_quiet(), "a write is still in flight");
    let c2 = c.clone();
    let late = tokio::spawn(async move {
        let _in_flight = c2.acquire_write(1.0).await;
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!late.is_finished(), "held at the gate");
    drop(sent);
    assert!(c.is_quiet(), "the late write is not counted while it waits");
    c.set_paused(false);
    late.await.unwrap();
    assert_eq!(c.writes_in_flight(), 0);
}
