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

#[cfg(test)]
mod tests {
    use super::check;

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
}
