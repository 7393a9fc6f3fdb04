//! Five-field cron schedules as Kubernetes CronJobs accept them (minute hour day-of-month month
//! day-of-week; `*`, `?`, lists, ranges, steps, month and weekday names, and the `@hourly`-style
//! macros), checked with a reason a person can act on.

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];
const MACROS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    names_start: u32,
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
        names_start: 0,
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
        names_start: 0,
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
        names_start: 0,
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &MONTHS,
        names_start: 1,
    },
    Field {
        name: "day of week",
        min: 0,
        max: 6,
        names: &WEEKDAYS,
        names_start: 0,
    },
];

/// Checks a schedule; the error says which field is wrong and why.
pub fn check(schedule: &str) -> Result<(), String> {
    let trimmed = schedule.trim();
    if trimmed.starts_with('@') {
        return if MACROS.contains(&trimmed) {
            Ok(())
        } else {
            Err(format!(
                "unknown macro {trimmed:?} (use one of {})",
                MACROS.join(", ")
            ))
        };
    }
    if trimmed.starts_with("TZ=") || trimmed.starts_with("CRON_TZ=") {
        return Err("time zones are not supported in the schedule".to_owned());
    }
    let parts: Vec<&str> = trimmed.split_whitespace().collect();
    if parts.len() != 5 {
        return Err(format!(
            "has {} fields, needs 5 (minute hour day-of-month month day-of-week)",
            parts.len()
        ));
    }
    for (part, field) in parts.iter().zip(FIELDS.iter()) {
        check_field(part, field).map_err(|e| format!("{} field {part:?}: {e}", field.name))?;
    }
    Ok(())
}

fn check_field(part: &str, field: &Field) -> Result<(), String> {
    for item in part.split(',') {
        if item.is_empty() {
            return Err("empty list item".to_owned());
        }
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, Some(s)),
            None => (item, None),
        };
        if let Some(step) = step {
            let n: u32 = step
                .parse()
                .map_err(|_| format!("step {step:?} is not a number"))?;
            if n == 0 {
                return Err("step must be at least 1".to_owned());
            }
        }
        if range == "*" || (range == "?" && field.name.starts_with("day")) {
            continue;
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (value(a, field)?, value(b, field)?),
            None => {
                let v = value(range, field)?;
                (v, v)
            }
        };
        if lo > hi {
            return Err(format!("range {range:?} runs backwards"));
        }
    }
    Ok(())
}

fn value(s: &str, field: &Field) -> Result<u32, String> {
    let upper = s.to_ascii_uppercase();
    if let Some(i) = field.names.iter().position(|n| *n == upper) {
        return Ok(i as u32 + field.names_start);
    }
    let v: u32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v < field.min || v > field.max {
        return Err(format!("{v} is outside {}-{}", field.min, field.max));
    }
    Ok(v)
}

/// The longest time between two runs of a schedule, in seconds: what "no backup within twice
/// the schedule" measures against. Read as Kubernetes' CronJob controller reads it (robfig/cron:
/// when both day fields are restricted a day matches either, otherwise both), in UTC over eight
/// years of calendar (a February 29th schedule runs every four years). An error when the
/// schedule is not accepted or never runs (`0 0 30 2 *`).
pub fn longest_gap(schedule: &str) -> Result<u64, String> {
    check(schedule)?;
    let trimmed = schedule.trim();
    let spec = match trimmed {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        other => other,
    };
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let sets: Vec<(u64, bool)> = parts
        .iter()
        .zip(FIELDS.iter())
        .map(|(part, field)| expand(part, field))
        .collect::<Result<_, _>>()?;
    let [
        (minutes, _),
        (hours, _),
        (doms, dom_star),
        (months, _),
        (dows, dow_star),
    ] = sets[..]
    else {
        unreachable!("check accepted five fields")
    };
    let in_set = |set: u64, v: u32| set & (1 << v) != 0;
    let times: Vec<u64> = (0..24)
        .filter(|h| in_set(hours, *h))
        .flat_map(|h| {
            (0..60)
                .filter(move |m| in_set(minutes, *m))
                .map(move |m| u64::from(h * 60 + m))
        })
        .collect();
    let (Some(first), Some(last)) = (times.first(), times.last()) else {
        unreachable!("every accepted minute and hour field names at least one value")
    };
    let mut gap = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    let mut day =
        time::Date::from_calendar_date(2024, time::Month::January, 1).expect("a real date");
    let mut previous: Option<u64> = None;
    let mut runs = 0u64;
    for index in 0..(8 * 366) {
        let dom = in_set(doms, u32::from(day.day()));
        let dow = in_set(dows, u32::from(day.weekday().number_days_from_sunday()));
        let day_matches = if dom_star || dow_star {
            dom && dow
        } else {
            dom || dow
        };
        if in_set(months, u32::from(u8::from(day.month()))) && day_matches {
            if let Some(p) = previous {
                gap = gap.max((index - p) * 1440 + first - last);
            }
            previous = Some(index);
            runs += times.len() as u64;
        }
        day = day.next_day().expect("within the calendar");
    }
    if runs < 2 {
        return Err("never runs".to_owned());
    }
    Ok(gap * 60)
}

/// The values one field names, as bits, and whether it is a `*` (or `?`) without a step, which
/// is what decides how the two day fields combine.
fn expand(part: &str, field: &Field) -> Result<(u64, bool), String> {
    let mut set = 0u64;
    let mut star = false;
    for item in part.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|e| e.to_string())?),
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" || range == "?" {
            star |= step == 1;
            (field.min, field.max)
        } else {
            match range.split_once('-') {
                Some((a, b)) => (value(a, field)?, value(b, field)?),
                // `N/step` runs from N to the end.
                None if step > 1 => (value(range, field)?, field.max),
                None => {
                    let v = value(range, field)?;
                    (v, v)
                }
            }
        };
        for v in (lo..=hi).step_by(step as usize) {
            set |= 1 << v;
        }
    }
    Ok((set, star))
}

#[cfg(test)]
mod tests {
    use super::{check, longest_gap};

    #[test]
    fn accepts_what_cronjobs_accept() {
        for s in [
            "0 */6 * * *",
            "*/15 * * * *",
            "0 0 1 jan,jul *",
            "30 2 * * MON-FRI",
            "0 0 ? * SUN",
            "5,10-20/5 0-23/2 1-31 1-12 0-6",
            "@daily",
            "@hourly",
        ] {
            assert_eq!(check(s), Ok(()), "{s}");
        }
    }

    #[test]
    fn rejects_with_the_field_and_reason() {
        let cases = [
            ("0 */6 * *", "has 4 fields"),
            ("0 0 0 * * *", "has 6 fields"),
            ("60 * * * *", "minute field \"60\": 60 is outside 0-59"),
            ("0 24 * * *", "hour field"),
            ("0 0 0 * *", "day of month field \"0\": 0 is outside 1-31"),
            ("0 0 * 13 *", "month field"),
            ("0 0 * * 7", "day of week field"),
            ("*/0 * * * *", "step must be at least 1"),
            ("5-1 * * * *", "runs backwards"),
            ("a * * * *", "is not a number"),
            ("@every 5m", "unknown macro"),
            ("TZ=UTC 0 * * * *", "time zones"),
            ("? * * * *", "minute field"),
            ("1,,2 * * * *", "empty list item"),
            ("", "has 0 fields"),
        ];
        for (s, want) in cases {
            let err = check(s).expect_err(s);
            assert!(err.contains(want), "{s}: {err}");
        }
    }

    #[test]
    fn the_longest_gap_is_what_the_schedule_leaves_between_runs() {
        let hour = 3600;
        let day = 24 * hour;
        for (s, want) in [
            ("0 */6 * * *", 6 * hour),
            ("*/15 * * * *", 15 * 60),
            ("@hourly", hour),
            ("@daily", day),
            ("@weekly", 7 * day),
            ("30 2 * * MON-FRI", 3 * day),
            ("0 9,17 * * *", 16 * hour),
            ("5,10-20/5 0-23/2 1-31 1-12 0-6", 2 * hour - 15 * 60),
            // The longest month is 31 days; July and August both have 31.
            ("@monthly", 31 * day),
            ("0 0 1 jan,jul *", 184 * day),
            // Both day fields restricted: the 1st or any Sunday.
            ("0 0 1 * SUN", 7 * day),
            // One restricted: Sundays only (`?` is `*`).
            ("0 0 ? * SUN", 7 * day),
            ("0 0 29 2 *", (4 * 365 + 1) * day),
        ] {
            assert_eq!(longest_gap(s), Ok(want), "{s}");
        }
        assert_eq!(longest_gap("0 0 30 2 *"), Err("never runs".to_owned()));
        assert!(
            longest_gap("0 0 * * 7")
                .unwrap_err()
                .contains("day of week")
        );
    }
}
