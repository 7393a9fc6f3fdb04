//! /validate's decode-decide-encode path on arbitrary bytes: never a panic; when the review decodes,
//! the answer echoes its uid and encodes.
#![no_main]

use etcd_webhook::admission;
use etcd_webhook::webhook::{self, AdmissionReviewOut};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = webhook::parse_admission(data) else {
        return;
    };
    let answer = admission::validate(&req, &Default::default());
    assert!(answer.patch.is_none(), "validate never patches");
    assert_eq!(answer.uid, req.uid);
    assert!(answer.allowed || answer.status.as_ref().is_some_and(|s| s.code >= 400 && !s.message.is_empty()));
    let out = serde_json::to_vec(&AdmissionReviewOut::new(&answer)).expect("response encodes");
    assert!(!out.is_empty());
});
