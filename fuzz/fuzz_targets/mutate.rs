//! /mutate's decode-decide-encode path on arbitrary bytes: never a panic; a review that decodes
//! always gets an answer (never an error), allowed, echoing its uid, with a patch that applies
//! and a second round that adds nothing.
#![no_main]

use etcd_webhook::admission;
use etcd_webhook::webhook::{self, AdmissionReviewOut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = webhook::parse_admission(data) else {
        return;
    };
    let answer = admission::mutate(&req, &Default::default()).expect("a review that decodes always gets an answer");
    {
        assert_eq!(answer.uid, req.uid);
        assert!(answer.allowed);
        if let (Some(patch), Some(object)) = (&answer.patch, &req.object) {
            // The patch applies to the object as sent, and a second round adds nothing.
            let ops: json_patch::Patch = serde_json::from_slice(patch).expect("patch is JSON Patch");
            let mut patched = object.clone();
            json_patch::patch(&mut patched, &ops).expect("patch applies");
            let mut again = req.clone();
            again.object = Some(patched);
            assert!(admission::mutate(&again, &Default::default()).expect("second round").patch.is_none(), "patch is idempotent");
        }
        let out = serde_json::to_vec(&AdmissionReviewOut::new(&answer)).expect("response encodes");
        assert!(!out.is_empty());
    }
});
