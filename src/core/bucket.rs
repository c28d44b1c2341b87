//! Time bucketing: map a timestamp attribute to a UTC bucket label.
//!
//! Pure: no clock, no I/O, no panics on any input.
//!
//! # Output (always UTC)
//!
//! | unit    | label        | notes                                                   |
//! |---------|--------------|---------------------------------------------------------|
//! | `hour`  | `2026-07-07T10` |                                                      |
//! | `day`   | `2026-07-07` |                                                         |
//! | `week`  | `2026-W28`   | ISO 8601 week: weeks start Monday, the **ISO week-year** is used (`2027-01-01` is `2026-W53`, `2024-12-30` is `2025-W01`); week zero-padded to 2 digits |
//! | `month` | `2026-07`    |                                                         |
//!
//! Supported instants are `0001-01-01T00:00:00Z` ..= `9999-12-31T23:59:59Z`
//! (after conversion to UTC); anything outside is an error. In that range
//! every label has a 4-digit year, including ISO week-years.
//!
//! # Text (DynamoDB `S`)
//!
//! Accepted, and nothing else (no surrounding whitespace):
//!
//! * a date `YYYY-MM-DD` (midnight UTC);
//! * a date, then `T` (or `t`, or one space), then `HH:MM`, `HH:MM:SS` or
//!   `HH:MM:SS.fff…` (any number of fraction digits, `.` or `,`), then an
//!   optional zone: `Z`/`z`, `±HH:MM`, `±HHMM` or `±HH`. Without a zone the
//!   time is taken as UTC. With an offset it is converted to UTC
//!   (`2026-07-07T01:30+02:00` is hour `2026-07-06T23`).
//!
//! Second `60` (a leap second) is accepted and treated as `59`; fractions
//! never move a bucket, since buckets start on whole seconds.
//!
//! # Numbers (DynamoDB `N`)
//!
//! The decimal text is parsed exactly, never through `f64`: an optional sign,
//! digits with an optional fraction, and an optional exponent (`1.7E9`).
//!
//! * **Seconds or milliseconds:** a value whose magnitude is at least
//!   `100_000_000_000` (1e11) is epoch **milliseconds**, anything smaller is
//!   epoch **seconds**. 1e11 seconds is in the year 5138, so no realistic
//!   seconds value is mistaken for milliseconds; conversely millisecond
//!   values between 1966-10-31 and 1973-03-03 (|ms| < 1e11) are read as
//!   seconds.
//! * **Fractions** are floored (toward the start of the bucket), so
//!   `-0.5` is `1969-12-31T23:59:59Z`, and `1.5` is `1970-01-01T00:00:01Z`.
//! * **Negative** values (before 1970) are allowed.

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, NaiveTime, TimeDelta, Timelike};
use std::fmt;

/// The size of a time bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BucketUnit {
    Hour,
    Day,
    Week,
    Month,
}

impl BucketUnit {
    /// Parse `"hour"`, `"day"`, `"week"` or `"month"` (exact, case-sensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "hour" => Some(BucketUnit::Hour),
            "day" => Some(BucketUnit::Day),
            "week" => Some(BucketUnit::Week),
            "month" => Some(BucketUnit::Month),
            _ => None,
        }
    }

    /// The stable name: `"hour"`, `"day"`, `"week"` or `"month"`.
    pub fn name(self) -> &'static str {
        match self {
            BucketUnit::Hour => "hour",
            BucketUnit::Day => "day",
            BucketUnit::Week => "week",
            BucketUnit::Month => "month",
        }
    }
}

/// A timestamp attribute value, as its DynamoDB text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeInput<'a> {
    /// A DynamoDB `S` value: an ISO-8601 date or date-time.
    Text(&'a str),
    /// A DynamoDB `N` value (decimal text): epoch seconds or milliseconds.
    Number(&'a str),
}

/// Why a value could not be bucketed; the message is meant for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketError(pub String);

impl fmt::Display for BucketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BucketError {}

/// The UTC bucket label of `input` for `unit`. See the module docs for the rules.
pub fn bucket(input: TimeInput<'_>, unit: BucketUnit) -> Result<String, BucketError> {
    Ok(label(instant(input)?, unit))
}

/// Most labels [`buckets_between`] lists: a bigger range is almost certainly
/// a mistake (ten thousand hours is over a year), and each label is a Query.
pub const MAX_BUCKETS: usize = 10_000;

/// Every bucket label from the one holding `from` to the one holding `to`,
/// both included, in time order: the buckets a read over a time range must
/// visit. Empty when `to` is before `from`.
pub fn buckets_between(
    from: TimeInput<'_>,
    to: TimeInput<'_>,
    unit: BucketUnit,
) -> Result<Vec<String>, BucketError> {
    let (from, to) = (instant(from)?, instant(to)?);
    let mut out = Vec::new();
    if to < from {
        return Ok(out);
    }
    let mut t = bucket_start(from, unit);
    while t <= to {
        if out.len() == MAX_BUCKETS {
            return Err(BucketError(format!(
                "more than {MAX_BUCKETS} {} buckets between {from} and {to}",
                unit.name()
            )));
        }
        out.push(label(t, unit));
        t = match next_bucket(t, unit) {
            Some(n) if n.year() <= MAX_YEAR => n,
            _ => break,
        };
    }
    Ok(out)
}

/// The first instant of the bucket holding `t`.
fn bucket_start(t: NaiveDateTime, unit: BucketUnit) -> NaiveDateTime {
    let day = t.date();
    let first = match unit {
        BucketUnit::Hour => {
            return day.and_time(NaiveTime::MIN) + TimeDelta::hours(t.hour().into());
        }
        BucketUnit::Day => day,
        BucketUnit::Week => day - TimeDelta::days(day.weekday().num_days_from_monday().into()),
        BucketUnit::Month => day.with_day(1).unwrap_or(day),
    };
    first.and_time(NaiveTime::MIN)
}

/// The first instant of the bucket after the one starting at `t`.
fn next_bucket(t: NaiveDateTime, unit: BucketUnit) -> Option<NaiveDateTime> {
    match unit {
        BucketUnit::Hour => t.checked_add_signed(TimeDelta::hours(1)),
        BucketUnit::Day => t.checked_add_signed(TimeDelta::days(1)),
        BucketUnit::Week => t.checked_add_signed(TimeDelta::days(7)),
        BucketUnit::Month => t.checked_add_months(chrono::Months::new(1)),
    }
}

/// The UTC instant `input` stands for, within the supported range.
fn instant(input: TimeInput<'_>) -> Result<NaiveDateTime, BucketError> {
    let utc = match input {
        TimeInput::Text(s) => parse_text(s).map_err(|why| {
            BucketError(format!(
                "`{}` is not an ISO-8601 date or date-time: {why} \
                 (expected e.g. `2026-07-07`, `2026-07-07T10:11:12Z` or `2026-07-07T10:11:12+02:00`)",
                shorten(s)
            ))
        })?,
        TimeInput::Number(s) => parse_number(s).map_err(|why| BucketError(why.message(s)))?,
    };
    if !(MIN_YEAR..=MAX_YEAR).contains(&utc.year()) {
        return Err(out_of_range(input));
    }
    Ok(utc)
}

const MIN_YEAR: i32 = 1;
const MAX_YEAR: i32 = 9999;
/// |value| at or above this is epoch milliseconds (1e11 s is in the year 5138).
const MILLIS_THRESHOLD: u64 = 100_000_000_000;
const RANGE_TEXT: &str = "0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59Z";

fn label(t: NaiveDateTime, unit: BucketUnit) -> String {
    match unit {
        BucketUnit::Hour => format!(
            "{:04}-{:02}-{:02}T{:02}",
            t.year(),
            t.month(),
            t.day(),
            t.hour()
        ),
        BucketUnit::Day => format!("{:04}-{:02}-{:02}", t.year(), t.month(), t.day()),
        BucketUnit::Week => {
            let w = t.iso_week();
            format!("{:04}-W{:02}", w.year(), w.week())
        }
        BucketUnit::Month => format!("{:04}-{:02}", t.year(), t.month()),
    }
}

fn out_of_range(input: TimeInput<'_>) -> BucketError {
    let (kind, s) = match input {
        TimeInput::Text(s) => ("time", s),
        TimeInput::Number(s) => ("epoch time", s),
    };
    BucketError(format!(
        "{kind} `{}` is out of range (supported: {RANGE_TEXT})",
        shorten(s)
    ))
}

/// Quote at most 64 characters of user input in messages.
fn shorten(s: &str) -> String {
    const MAX: usize = 64;
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

// ---------------------------------------------------------------- text ----

/// A byte cursor over ASCII syntax; non-ASCII bytes simply fail to match.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8, what: &'static str) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected {what}"))
        }
    }

    /// Exactly `n` ASCII digits as a number.
    fn digits(&mut self, n: usize, what: &'static str) -> Result<u32, String> {
        let mut v = 0u32;
        for _ in 0..n {
            match self.peek() {
                Some(c @ b'0'..=b'9') => {
                    v = v * 10 + u32::from(c - b'0');
                    self.i += 1;
                }
                _ => return Err(format!("expected {n}-digit {what}")),
            }
        }
        Ok(v)
    }

    fn at_end(&self) -> bool {
        self.i >= self.b.len()
    }
}

/// Parse an accepted text form to a naive UTC date-time.
fn parse_text(s: &str) -> Result<NaiveDateTime, String> {
    let mut c = Cursor {
        b: s.as_bytes(),
        i: 0,
    };
    let year = c.digits(4, "year")?;
    c.expect(b'-', "`-` after the year")?;
    let month = c.digits(2, "month")?;
    c.expect(b'-', "`-` after the month")?;
    let day = c.digits(2, "day")?;
    // Four-digit years always fit in i32.
    let date = NaiveDate::from_ymd_opt(year as i32, month, day)
        .ok_or_else(|| format!("{year:04}-{month:02}-{day:02} is not a calendar date"))?;
    if c.at_end() {
        return Ok(date.and_time(NaiveTime::MIN));
    }
    if !(c.eat(b'T') || c.eat(b't') || c.eat(b' ')) {
        return Err("expected `T` or a space after the date".into());
    }

    let hour = c.digits(2, "hour")?;
    c.expect(b':', "`:` after the hour")?;
    let minute = c.digits(2, "minute")?;
    let mut second = 0;
    if c.eat(b':') {
        second = c.digits(2, "second")?;
        if c.eat(b'.') || c.eat(b',') {
            let start = c.i;
            while matches!(c.peek(), Some(b'0'..=b'9')) {
                c.i += 1;
            }
            if c.i == start {
                return Err("expected digits after the decimal point".into());
            }
        }
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err(format!(
            "{hour:02}:{minute:02}:{second:02} is not a time of day"
        ));
    }
    // A leap second stays in its minute (and so in its hour and day).
    let time = NaiveTime::from_hms_opt(hour, minute, second.min(59))
        .ok_or_else(|| "invalid time of day".to_string())?;
    let local = date.and_time(time);

    let offset_secs: i64 = match c.peek() {
        None => 0,
        Some(b'Z' | b'z') => {
            c.i += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            c.i += 1;
            let oh = c.digits(2, "offset hour")?;
            let om = if c.eat(b':') {
                c.digits(2, "offset minute")?
            } else if c.at_end() {
                0
            } else {
                c.digits(2, "offset minute")?
            };
            if oh > 23 || om > 59 {
                return Err(format!("offset {oh:02}:{om:02} is out of range"));
            }
            let secs = i64::from(oh * 3600 + om * 60);
            if sign == b'-' { -secs } else { secs }
        }
        Some(_) => return Err("expected `Z`, `+HH:MM` or `-HH:MM` after the time".into()),
    };
    if !c.at_end() {
        return Err("unexpected text after the time zone".into());
    }
    // local = utc + offset, so utc = local - offset.
    local
        .checked_sub_signed(TimeDelta::seconds(offset_secs))
        .ok_or_else(|| format!("out of range (supported: {RANGE_TEXT})"))
}

// -------------------------------------------------------------- number ----

enum NumberError {
    Syntax,
    OutOfRange,
}

impl NumberError {
    fn message(&self, s: &str) -> String {
        match self {
            NumberError::Syntax => format!(
                "`{}` is not a decimal number (expected epoch seconds or milliseconds, e.g. `1783419072` or `1783419072.5`)",
                shorten(s)
            ),
            NumberError::OutOfRange => out_of_range(TimeInput::Number(s)).0,
        }
    }
}

/// Parse DynamoDB number text as an epoch instant, exactly (see module docs).
fn parse_number(s: &str) -> Result<NaiveDateTime, NumberError> {
    let b = s.as_bytes();
    let mut i = 0;
    let negative = match b.first() {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let int_start = i;
    while matches!(b.get(i), Some(b'0'..=b'9')) {
        i += 1;
    }
    let int_digits = &b[int_start..i];
    let mut frac_digits: &[u8] = &[];
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while matches!(b.get(i), Some(b'0'..=b'9')) {
            i += 1;
        }
        frac_digits = &b[start..i];
    }
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(NumberError::Syntax);
    }
    let mut exponent: i64 = 0;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let exp_negative = match b.get(i) {
            Some(b'-') => {
                i += 1;
                true
            }
            Some(b'+') => {
                i += 1;
                false
            }
            _ => false,
        };
        let start = i;
        while let Some(&d @ b'0'..=b'9') = b.get(i) {
            // Saturate: anything this large is out of range or zero anyway.
            exponent = exponent
                .saturating_mul(10)
                .saturating_add(i64::from(d - b'0'))
                .min(1_000_000_000);
            i += 1;
        }
        if i == start {
            return Err(NumberError::Syntax);
        }
        if exp_negative {
            exponent = -exponent;
        }
    }
    if i != b.len() {
        return Err(NumberError::Syntax);
    }

    // The value is 0.DDDD… × 10^point, where D = int_digits ++ frac_digits.
    let digit = |k: usize| -> u8 {
        if k < int_digits.len() {
            int_digits[k] - b'0'
        } else {
            frac_digits
                .get(k - int_digits.len())
                .map_or(0, |d| d - b'0')
        }
    };
    let n_digits = int_digits.len() + frac_digits.len();
    let point = (int_digits.len() as i64).saturating_add(exponent);
    let split = usize::try_from(point.max(0)).unwrap_or(usize::MAX);

    // Integer part (magnitude). Leading zeros are cheap; after the first
    // non-zero digit, u64 overflows within 20 digits, bounding the loop.
    let mut magnitude: u64 = 0;
    for k in 0..split {
        if k >= n_digits && magnitude == 0 {
            break; // only zeros remain
        }
        magnitude = magnitude
            .checked_mul(10)
            .and_then(|m| m.checked_add(u64::from(digit(k))))
            .ok_or(NumberError::OutOfRange)?;
    }
    let has_fraction = (split..n_digits).any(|k| digit(k) != 0);

    // floor(value), in the value's own unit.
    let mut floor = i128::from(magnitude);
    if negative {
        floor = -floor - i128::from(has_fraction);
    }
    let seconds = if magnitude >= MILLIS_THRESHOLD {
        floor.div_euclid(1000)
    } else {
        floor
    };
    let seconds = i64::try_from(seconds).map_err(|_| NumberError::OutOfRange)?;
    DateTime::from_timestamp(seconds, 0)
        .map(|dt| dt.naive_utc())
        .ok_or(NumberError::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;
    use BucketUnit::{Day, Hour, Month, Week};
    use proptest::prelude::*;

    const UNITS: [BucketUnit; 4] = [Hour, Day, Week, Month];

    fn text(s: &str, unit: BucketUnit) -> Result<String, BucketError> {
        bucket(TimeInput::Text(s), unit)
    }

    fn num(s: &str, unit: BucketUnit) -> Result<String, BucketError> {
        bucket(TimeInput::Number(s), unit)
    }

    fn ok_text(s: &str, unit: BucketUnit) -> String {
        text(s, unit).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn ok_num(s: &str, unit: BucketUnit) -> String {
        num(s, unit).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn all_units(input: TimeInput<'_>) -> [String; 4] {
        UNITS.map(|u| bucket(input, u).unwrap_or_else(|e| panic!("{input:?}: {e}")))
    }

    #[test]
    fn unit_names_round_trip() {
        for u in UNITS {
            assert_eq!(BucketUnit::from_name(u.name()), Some(u));
        }
        assert_eq!(BucketUnit::from_name("Day"), None);
        assert_eq!(BucketUnit::from_name("year"), None);
    }

    #[test]
    fn all_formats() {
        assert_eq!(
            all_units(TimeInput::Text("2026-07-07T10:11:12Z")),
            ["2026-07-07T10", "2026-07-07", "2026-W28", "2026-07"]
        );
        assert_eq!(
            all_units(TimeInput::Number("1783419072")),
            ["2026-07-07T10", "2026-07-07", "2026-W28", "2026-07"]
        );
        assert_eq!(ok_text("2026-01-05", Week), "2026-W02"); // zero-padded
    }

    #[test]
    fn accepted_text_forms() {
        for s in [
            "2026-07-07T10:11:12Z",
            "2026-07-07T10:11:12z",
            "2026-07-07t10:11:12Z",
            "2026-07-07 10:11:12Z",
            "2026-07-07T10:11:12",
            "2026-07-07 10:11:12",
            "2026-07-07T10:11",
            "2026-07-07T10:11Z",
            "2026-07-07T10:11:12.5Z",
            "2026-07-07T10:11:12.123456789Z",
            "2026-07-07T10:11:12,25",
            "2026-07-07T10:59:60Z", // leap second stays in its hour
            "2026-07-07T12:11:12+02:00",
            "2026-07-07T12:11:12+0200",
            "2026-07-07T12:11:12+02",
            "2026-07-07T04:41:12-0530",
            "2026-07-07T04:41:12.999-05:30",
        ] {
            assert_eq!(ok_text(s, Hour), "2026-07-07T10", "{s}");
        }
        assert_eq!(ok_text("2026-07-07", Hour), "2026-07-07T00");
        assert_eq!(ok_text("2026-07-07", Day), "2026-07-07");
    }

    #[test]
    fn offsets_convert_to_utc() {
        assert_eq!(ok_text("2026-07-07T01:30:00+02:00", Hour), "2026-07-06T23");
        assert_eq!(ok_text("2026-07-07T01:30:00+02:00", Day), "2026-07-06");
        assert_eq!(ok_text("2026-06-30T22:00:00-05:30", Month), "2026-07");
        assert_eq!(ok_text("2026-12-31T20:00:00-0500", Day), "2027-01-01");
        assert_eq!(ok_text("2027-01-04T00:30:00+01:00", Week), "2026-W53");
        assert_eq!(ok_text("2026-07-07T10:00:00-00:00", Hour), "2026-07-07T10");
    }

    #[test]
    fn iso_week_year_edges() {
        for (date, week) in [
            ("2027-01-01", "2026-W53"),
            ("2027-01-03", "2026-W53"),
            ("2027-01-04", "2027-W01"),
            ("2026-12-28", "2026-W53"),
            ("2026-01-01", "2026-W01"),
            ("2025-12-29", "2026-W01"),
            ("2024-12-30", "2025-W01"),
            ("2021-01-03", "2020-W53"),
            ("2020-12-31", "2020-W53"),
            ("2026-07-07", "2026-W28"),
            ("0001-01-01", "0001-W01"),
            ("9999-12-31", "9999-W52"),
        ] {
            assert_eq!(ok_text(date, Week), week, "{date}");
        }
    }

    #[test]
    fn seconds_vs_milliseconds() {
        assert_eq!(ok_num("1783419072000", Hour), "2026-07-07T10");
        assert_eq!(ok_num("1783419072999", Hour), "2026-07-07T10");
        // Just below the threshold: seconds (year 5138).
        assert_eq!(ok_num("99999999999", Day), "5138-11-16");
        // At the threshold: milliseconds (1973).
        assert_eq!(ok_num("100000000000", Day), "1973-03-03");
        assert_eq!(ok_num("-100000000000", Day), "1966-10-31");
        // Seconds never reach 9999: 253402300799 is milliseconds (1978).
        assert_eq!(ok_num("253402300799", Day), "1978-01-11");
        assert_eq!(ok_num("253402300799999", Hour), "9999-12-31T23");
        assert_eq!(ok_num("1.783419072E12", Hour), "2026-07-07T10"); // ms
        assert_eq!(ok_num("1.783419072e9", Hour), "2026-07-07T10"); // s
    }

    #[test]
    fn number_forms_and_fractions() {
        assert_eq!(ok_num("0", Hour), "1970-01-01T00");
        assert_eq!(ok_num("-0", Hour), "1970-01-01T00");
        assert_eq!(ok_num("+3600", Hour), "1970-01-01T01");
        assert_eq!(ok_num("3599.999999", Hour), "1970-01-01T00");
        assert_eq!(ok_num("3600.0", Hour), "1970-01-01T01");
        assert_eq!(ok_num("000003600", Hour), "1970-01-01T01");
        assert_eq!(ok_num(".5", Hour), "1970-01-01T00");
        assert_eq!(ok_num("3600.", Hour), "1970-01-01T01");
        assert_eq!(ok_num("36e2", Hour), "1970-01-01T01");
        assert_eq!(ok_num("360000E-2", Hour), "1970-01-01T01");
        assert_eq!(ok_num("1e-999999999999999999999", Hour), "1970-01-01T00");
        assert_eq!(ok_num("0e999999999999999999", Hour), "1970-01-01T00");
        // Digits beyond f64 precision still count.
        assert_eq!(ok_num("3599.99999999999999999999", Hour), "1970-01-01T00");
        assert_eq!(
            ok_num("1783419071.9999999999999999999", Hour),
            "2026-07-07T10"
        );
    }

    #[test]
    fn negative_epochs_floor() {
        assert_eq!(ok_num("-1", Hour), "1969-12-31T23");
        assert_eq!(ok_num("-0.5", Day), "1969-12-31");
        assert_eq!(ok_num("-0.0", Day), "1970-01-01");
        assert_eq!(ok_num("-3600", Hour), "1969-12-31T23");
        assert_eq!(ok_num("-3600.000", Hour), "1969-12-31T23");
        assert_eq!(ok_num("-3600.001", Hour), "1969-12-31T22");
        assert_eq!(ok_num("-1E-30", Hour), "1969-12-31T23");
        assert_eq!(ok_num("-86400", Week), "1970-W01"); // 1969-12-31 is a Wednesday
        assert_eq!(ok_num("-100000000001", Hour), "1966-10-31T14"); // ms, floored
        assert_eq!(ok_num("-62135596800", Day), "0001-01-01");
        assert_eq!(ok_num("-62135596800000", Day), "0001-01-01");
        assert_eq!(ok_num("-1000.5", Hour), "1969-12-31T23");
    }

    #[test]
    fn rejects_bad_text() {
        let e = text("2026-13-01", Day).expect_err("month 13");
        assert_eq!(
            e.to_string(),
            "`2026-13-01` is not an ISO-8601 date or date-time: 2026-13-01 is not a calendar date \
             (expected e.g. `2026-07-07`, `2026-07-07T10:11:12Z` or `2026-07-07T10:11:12+02:00`)"
        );
        let e = num("12abc", Day).expect_err("junk");
        assert!(e.0.starts_with("`12abc` is not a decimal number"), "{e}");
        let e = num("1e400", Day).expect_err("huge");
        assert_eq!(
            e.0,
            "epoch time `1e400` is out of range (supported: 0001-01-01T00:00:00Z ..= 9999-12-31T23:59:59Z)"
        );
        for s in [
            "",
            "2026",
            "2026-07",
            "2026-7-7",
            "26-07-07",
            "02026-07-07",
            "2026/07/07",
            "2026-02-30",
            "2025-02-29",
            "2026-00-10",
            "2026-07-00",
            " 2026-07-07",
            "2026-07-07 ",
            "2026-07-07T",
            "2026-07-07T10",
            "2026-07-07T1:11:12",
            "2026-07-07T24:00:00",
            "2026-07-07T10:60:00",
            "2026-07-07T10:11:61",
            "2026-07-07T10:11:12.",
            "2026-07-07T10:11:12.Z",
            "2026-07-07T10:11.5",
            "2026-07-07T10:11:12+2",
            "2026-07-07T10:11:12+02:0",
            "2026-07-07T10:11:12+24:00",
            "2026-07-07T10:11:12+02:60",
            "2026-07-07T10:11:12ZZ",
            "2026-07-07T10:11:12 UTC",
            "2026-07-07T10:11:12Z[Europe/Paris]",
            "2026-07-07Z",
            "2026-07-07  10:11:12",
            "1783419072",
            "２０２６-07-07",
            "2026-07-07T10:11:12+02:00\n",
        ] {
            for u in UNITS {
                let e = text(s, u).expect_err(s);
                assert!(
                    e.to_string()
                        .contains("is not an ISO-8601 date or date-time"),
                    "{s:?}: {e}"
                );
            }
        }
    }

    #[test]
    fn rejects_bad_numbers() {
        for s in [
            "", "-", "+", ".", "-.", "1.2.3", "1e", "1e+", "e5", "1 ", " 1", "0x10", "NaN",
            "Infinity", "1,5", "1_000", "--1", "1-", "١٢٣",
        ] {
            let e = num(s, Day).expect_err(s);
            assert!(e.0.contains("is not a decimal number"), "{s:?}: {e}");
        }
    }

    #[test]
    fn rejects_out_of_range() {
        for s in [
            "253402300800000", // ms: 10000-01-01T00:00:00Z
            "-62135596801",    // seconds: 0000-12-31T23:59:59Z
            "-62135596800001", // ms: just before 0001-01-01
            "-99999999999",    // seconds: year -1199
            "99999999999999999999999999999999999999",
            "-99999999999999999999999999999999999999",
            "9223372036854775807",
            "-9223372036854775808",
            "18446744073709551616",
            "1e400",
            "-1e400",
            "1e999999999999999999999",
        ] {
            let e = num(s, Day).expect_err(s);
            assert!(e.0.contains("is out of range"), "{s:?}: {e}");
        }
        for s in ["0001-01-01T00:30:00+01:00", "9999-12-31T23:30:00-01:00"] {
            let e = text(s, Day).expect_err(s);
            assert!(e.0.contains("out of range"), "{s:?}: {e}");
        }
        assert_eq!(ok_text("0001-01-01T00:30:00-01:00", Day), "0001-01-01");
        assert_eq!(ok_text("9999-12-31T23:30:00+01:00", Day), "9999-12-31");
        assert!(text("0000-12-31", Day).is_err());
    }

    #[test]
    fn long_input_is_shortened_in_messages() {
        let long = "x".repeat(10_000);
        let e = text(&long, Day).expect_err("garbage");
        assert!(e.0.len() < 400, "{}", e.0.len());
        let e = num(&"9".repeat(10_000), Day).expect_err("huge");
        assert!(e.0.len() < 400, "{}", e.0.len());
    }

    proptest! {
        /// The labels between two instants run from the first's bucket to the
        /// last's, each once, in order (labels sort as their buckets do).
        #[test]
        fn buckets_between_runs_from_bucket_to_bucket(
            a in 0i64..4_000_000_000,
            span in 0i64..3_000_000,
            unit in proptest::sample::select(&UNITS[..]),
        ) {
            let (from, to) = (a.to_string(), (a + span).to_string());
            let labels = buckets_between(TimeInput::Number(&from), TimeInput::Number(&to), unit).unwrap();
            prop_assert_eq!(labels.first().unwrap(), &ok_num(&from, unit));
            prop_assert_eq!(labels.last().unwrap(), &ok_num(&to, unit));
            prop_assert!(labels.windows(2).all(|w| w[0] < w[1]), "{:?}", labels);
            // Every hour in between lands in one of them.
            for t in (a..=a + span).step_by(3600) {
                prop_assert!(labels.contains(&ok_num(&t.to_string(), unit)));
            }
        }

        #[test]
        fn day_is_prefix_of_hour(secs in -62_135_596_800i64..100_000_000_000) {
            let s = secs.to_string();
            let hour = ok_num(&s, Hour);
            let day = ok_num(&s, Day);
            let month = ok_num(&s, Month);
            prop_assert_eq!(&hour[..10], day.as_str());
            prop_assert_eq!(&day[..7], month.as_str());
        }

        #[test]
        fn any_i64_is_consistent(v in any::<i64>()) {
            let s = v.to_string();
            let got = UNITS.map(|u| num(&s, u));
            prop_assert_eq!(got.iter().filter(|r| r.is_ok()).count() % 4, 0);
            if let (Ok(hour), Ok(day)) = (&got[0], &got[1]) {
                prop_assert_eq!(&hour[..10], day.as_str());
            }
        }

        #[test]
        fn millis_equal_seconds(ms in 100_000_000_000i64..100_000_000_000_000) {
            // ms / 1000 < 1e11, so the seconds value is itself read as seconds.
            let secs = ms.div_euclid(1000).to_string();
            prop_assert_eq!(ok_num(&ms.to_string(), Hour), ok_num(&secs, Hour));
        }

        #[test]
        fn fractions_floor(secs in -62_135_596_799i64..99_999_999_999, frac in 1u32..1_000_000) {
            let s = format!("{secs}.{frac:06}");
            let floor = if secs < 0 { secs - 1 } else { secs };
            prop_assert_eq!(ok_num(&s, Hour), ok_num(&floor.to_string(), Hour));
        }

        #[test]
        fn text_matches_epoch(
            secs in -62_135_596_800i64 + 86_400..99_999_999_999,
            offset_min in -(23 * 60 + 59)..=(23 * 60 + 59),
            compact in any::<bool>(),
        ) {
            let offset = chrono::FixedOffset::east_opt(offset_min * 60).expect("offset in range");
            let local = DateTime::from_timestamp(secs, 0).expect("in range").with_timezone(&offset);
            let mut s = local.format("%Y-%m-%dT%H:%M:%S%:z").to_string();
            if compact {
                s = local.format("%Y-%m-%d %H:%M:%S.123%z").to_string();
            }
            for u in UNITS {
                prop_assert_eq!(ok_text(&s, u), ok_num(&secs.to_string(), u), "{}", s);
            }
        }

        #[test]
        fn never_panics(s in any::<String>()) {
            for u in UNITS {
                let _ = bucket(TimeInput::Text(&s), u);
                let _ = bucket(TimeInput::Number(&s), u);
            }
        }

        #[test]
        fn never_panics_on_near_misses(s in "[-+0-9.eEtTzZ: ,]{0,40}") {
            for u in UNITS {
                let _ = bucket(TimeInput::Text(&s), u);
                let _ = bucket(TimeInput::Number(&s), u);
            }
        }
    }

    #[test]
    fn buckets_between_lists_every_label_from_the_first_to_the_last() {
        let between = |a: &str, b: &str, u| {
            buckets_between(TimeInput::Text(a), TimeInput::Text(b), u).unwrap()
        };
        assert_eq!(
            between("2026-07-07T22:30Z", "2026-07-08T01:00+00:00", Hour),
            [
                "2026-07-07T22",
                "2026-07-07T23",
                "2026-07-08T00",
                "2026-07-08T01"
            ]
        );
        assert_eq!(between("2026-07-07", "2026-07-07", Day), ["2026-07-07"]);
        assert_eq!(
            between("2026-12-30", "2027-01-12", Week),
            ["2026-W53", "2027-W01", "2027-W02"]
        );
        assert_eq!(
            between("2026-11-30T23:00Z", "2027-01-01", Month),
            ["2026-11", "2026-12", "2027-01"]
        );
        assert!(between("2026-07-08", "2026-07-07", Day).is_empty());
        assert!(between("2026-07-07T10:30Z", "2026-07-07T10:10Z", Hour).is_empty());
        let epoch = buckets_between(TimeInput::Number("0"), TimeInput::Number("7200"), Hour);
        assert_eq!(
            epoch.unwrap(),
            ["1970-01-01T00", "1970-01-01T01", "1970-01-01T02"]
        );
        let far = buckets_between(
            TimeInput::Text("2000-01-01"),
            TimeInput::Text("2026-01-01"),
            Hour,
        );
        assert!(far.unwrap_err().0.contains("more than 10000"));
        assert!(buckets_between(TimeInput::Text("x"), TimeInput::Text("2026-01-01"), Day).is_err());
    }
}
