//! The in-memory API server's garbage collector: owner references, the `orphan` and
//! `foregroundDeletion` finalizers, and objects whose owner is gone.

use serde_json::{Value, json};

use super::fake_api::FakeCore;

impl FakeCore {
    /// One round of the garbage collector: an object being deleted with the `orphan` finalizer
    /// loses its dependents' ownerReferences to it, then the finalizer; with
    /// `foregroundDeletion`, its dependents are deleted, then the finalizer; an object whose
    /// owner is gone is deleted; an object being deleted with no finalizer left is removed.
    /// Returns how many changes it made (call until 0 to settle).
    pub fn collect_garbage(&mut self) -> usize {
        let mut changes = 0;
        let uid = |o: &Value| o["metadata"]["uid"].as_str().unwrap_or("").to_owned();
        let deleting: Vec<(String, String, Vec<String>)> = self
            .objects
            .iter()
            .filter(|(_, o)| !o["metadata"]["deletionTimestamp"].is_null())
            .map(|(k, o)| {
                let fins = o["metadata"]["finalizers"]
                    .as_array()
                    .map(|f| {
                        f.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                (k.clone(), uid(o), fins)
            })
            .collect();
        let owned_by = |o: &Value, owner: &str| {
            o["metadata"]["ownerReferences"]
                .as_array()
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == owner))
        };
        for (path, owner, fins) in deleting {
            let dependents: Vec<String> = self
                .objects
                .iter()
                .filter(|(_, o)| owned_by(o, &owner))
                .map(|(k, _)| k.clone())
                .collect();
            for f in ["orphan", "foregroundDeletion"] {
                if !fins.iter().any(|x| x == f) {
                    continue;
                }
                for d in &dependents {
                    if f == "orphan" {
                        let o = self.objects.get_mut(d).unwrap();
                        if let Some(refs) = o["metadata"]["ownerReferences"].as_array_mut() {
                            refs.retain(|r| r["uid"] != owner.as_str());
                        }
                        self.version += 1;
                        o["metadata"]["resourceVersion"] = json!(self.version.to_string());
                        let o = o.clone();
                        self.record("MODIFIED", d, &o);
                    } else {
                        self.remove(d);
                    }
                    changes += 1;
                }
                let o = self.objects.get_mut(&path).unwrap();
                if let Some(list) = o["metadata"]["finalizers"].as_array_mut() {
                    list.retain(|x| x != f);
                }
                self.version += 1;
                o["metadata"]["resourceVersion"] = json!(self.version.to_string());
                let o = o.clone();
                self.record("MODIFIED", &path, &o);
                changes += 1;
            }
            let done = self.objects.get(&path).is_some_and(|o| {
                o["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(|f| f.is_empty())
            });
            if done {
                self.remove(&path);
                changes += 1;
            }
        }
        // Background: dependents whose owners are gone.
        let uids: std::collections::HashSet<String> = self.objects.values().map(uid).collect();
        let orphans: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, o)| {
                o["metadata"]["ownerReferences"]
                    .as_array()
                    .is_some_and(|refs| {
                        !refs.is_empty()
                            && refs
                                .iter()
                                .all(|r| !uids.contains(r["uid"].as_str().unwrap_or("")))
                    })
            })
            .map(|(k, _)| k.clone())
            .collect();
        for path in orphans {
            self.remove(&path);
            changes += 1;
        }
        changes
    }
}
