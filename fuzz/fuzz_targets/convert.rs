//! /convert's decode-decide-encode path on arbitrary bytes: never a panic; when the review
//! decodes, the answer echoes its uid, and a success has one object per input object, each in
//! the desired version.
#![no_main]

use etcd_webhook::webhook::convert;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = convert::parse(data) else {
        return;
    };
    let (uid, count, desired) = (req.uid.clone(), req.objects.len(), req.desired_api_version.clone());
    let review = convert::respond(req);
    let rsp = review.response.as_ref().expect("a response");
    assert_eq!(rsp.uid, uid);
    if rsp.result.is_success() {
        assert_eq!(rsp.converted_objects.len(), count);
        for o in &rsp.converted_objects {
            assert_eq!(o["apiVersion"], desired.as_str());
        }
    }
    serde_json::to_vec(&review).expect("response encodes");
});
