//! What the loop keeps between membership passes, in the members' ConfigMap annotations: when
//! each non-voter was first seen, when each learner was first seen started, the ordinals whose
//! volume is to be replaced, and when a member was last found corrupt. Written and read back
//! as plain text, every entry checked.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;

use super::members::Member;
use crate::api::MAX_SIZE;
use crate::controller::render;

/// What the loop keeps between passes (in the members' ConfigMap): when each non-voter was
/// first seen, when each learner was first seen started, and the ordinals whose volume is to
/// be replaced (recorded before the member is removed, so a loop killed right after the
/// removal still replaces the volume).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    pub joining: BTreeMap<u64, Timestamp>,
    pub started: BTreeMap<u64, Timestamp>,
    pub replacing: BTreeSet<i32>,
    /// When the member at each ordinal was last found corrupt and replaced (the status shows
    /// it as `corruptionDetectedAt`).
    pub corrupt: BTreeMap<i32, Timestamp>,
}

/// When each current non-voter was first seen: as before, or now.
pub fn joining_of(
    members: &[Member],
    before: &BTreeMap<u64, Timestamp>,
    now: Timestamp,
) -> BTreeMap<u64, Timestamp> {
    members
        .iter()
        .filter(|m| m.is_learner || !m.started())
        .map(|m| (m.id, before.get(&m.id).copied().unwrap_or(now)))
        .collect()
}

/// When each current started learner was first seen started: as before, or now.
pub fn started_of(
    members: &[Member],
    before: &BTreeMap<u64, Timestamp>,
    now: Timestamp,
) -> BTreeMap<u64, Timestamp> {
    members
        .iter()
        .filter(|m| m.is_learner && m.started())
        .map(|m| (m.id, before.get(&m.id).copied().unwrap_or(now)))
        .collect()
}

/// `KEY=RFC3339,...`, each key as `key` writes it.
fn times_annotation<K>(times: &BTreeMap<K, Timestamp>, key: impl Fn(&K) -> String) -> String {
    times
        .iter()
        .map(|(k, at)| format!("{}={at}", key(k)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A malformed entry of one of the loop's ConfigMap annotations.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("annotation {annotation}: entry {entry:?} is not {expected}; it is ignored")]
pub struct BadEntry {
    pub annotation: &'static str,
    pub entry: String,
    pub expected: &'static str,
}

/// The entries of a `KEY=RFC3339,...` annotation whose key `key` reads (`expected` names the
/// form in the error of one it cannot).
fn parse_times<K: Ord>(
    annotation: &'static str,
    text: &str,
    key: impl Fn(&str) -> Option<K>,
    expected: &'static str,
    bad: &mut Vec<BadEntry>,
) -> BTreeMap<K, Timestamp> {
    let mut out = BTreeMap::new();
    for kv in text.split(',').filter(|kv| !kv.trim().is_empty()) {
        let parsed = kv
            .split_once('=')
            .and_then(|(k, at)| Some((key(k)?, at.parse().ok()?)));
        match parsed {
            Some((k, at)) => {
                out.insert(k, at);
            }
            None => bad.push(BadEntry {
                annotation,
                entry: kv.to_owned(),
                expected,
            }),
        }
    }
    out
}

/// A member ID as the annotations write it (hex).
fn hex_id(k: &str) -> Option<u64> {
    u64::from_str_radix(k, 16).ok()
}

/// An ordinal of the cluster.
fn an_ordinal(k: &str) -> Option<i32> {
    k.parse().ok().filter(|i| (0..MAX_SIZE).contains(i))
}

impl Memory {
    /// The ConfigMap annotations that keep it, always all of them (empty or not), so that a
    /// change to any is a change to apply.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let hex = |id: &u64| format!("{id:x}");
        BTreeMap::from([
            (
                render::JOINING_ANNOTATION.to_owned(),
                times_annotation(&self.joining, hex),
            ),
            (
                render::STARTED_ANNOTATION.to_owned(),
                times_annotation(&self.started, hex),
            ),
            (
                render::CORRUPT_ANNOTATION.to_owned(),
                times_annotation(&self.corrupt, i32::to_string),
            ),
            (
                render::REPLACING_ANNOTATION.to_owned(),
                self.replacing
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ])
    }

    /// The memory kept in `annotations`, and the entries that could not be read (each an error
    /// for the log and the status: a hand edit, or a newer loop's format).
    pub fn parse(annotations: &BTreeMap<String, String>) -> (Memory, Vec<BadEntry>) {
        let get = |k: &str| annotations.get(k).map(String::as_str).unwrap_or_default();
        let mut bad = Vec::new();
        let joining = parse_times(
            render::JOINING_ANNOTATION,
            get(render::JOINING_ANNOTATION),
            hex_id,
            "HEXID=RFC3339",
            &mut bad,
        );
        let started = parse_times(
            render::STARTED_ANNOTATION,
            get(render::STARTED_ANNOTATION),
            hex_id,
            "HEXID=RFC3339",
            &mut bad,
        );
        let corrupt = parse_times(
            render::CORRUPT_ANNOTATION,
            get(render::CORRUPT_ANNOTATION),
            an_ordinal,
            "ORDINAL=RFC3339",
            &mut bad,
        );
        let mut replacing = BTreeSet::new();
        for entry in get(render::REPLACING_ANNOTATION)
            .split(',')
            .filter(|e| !e.trim().is_empty())
        {
            match entry.parse::<i32>() {
                Ok(i) if (0..MAX_SIZE).contains(&i) => {
                    replacing.insert(i);
                }
                _ => bad.push(BadEntry {
                    annotation: render::REPLACING_ANNOTATION,
                    entry: entry.to_owned(),
                    expected: "an ordinal",
                }),
            }
        }
        (
            Memory {
                joining,
                started,
                replacing,
                corrupt,
            },
            bad,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[test]
    fn the_memory_round_trips_and_a_malformed_entry_is_an_error() {
        let memory = Memory {
            joining: BTreeMap::from([(0xabcu64, at(5)), (7, at(9))]),
            started: BTreeMap::from([(7, at(11))]),
            replacing: BTreeSet::from([1, 3]),
            corrupt: BTreeMap::from([(2, at(13))]),
        };
        assert_eq!(Memory::parse(&memory.annotations()), (memory, vec![]));
        assert_eq!(Memory::parse(&BTreeMap::new()), (Memory::default(), vec![]));
        let mut hand = Memory::default().annotations();
        hand.insert(render::REPLACING_ANNOTATION.to_owned(), "1,x,99".to_owned());
        hand.insert(
            render::JOINING_ANNOTATION.to_owned(),
            "abc=yesterday".to_owned(),
        );
        let (read, bad) = Memory::parse(&hand);
        assert_eq!(read.replacing, BTreeSet::from([1]));
        let entries: Vec<&str> = bad.iter().map(|b| b.entry.as_str()).collect();
        assert_eq!(entries, ["abc=yesterday", "x", "99"]);
        assert!(bad[0].to_string().contains(render::JOINING_ANNOTATION));
    }
}
